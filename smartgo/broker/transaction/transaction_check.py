"""The transaction check-back (RocketMQ's TransactionalMessageCheckService), in the broker actor.

A half message (RMQ_SYS_TRANS_HALF_TOPIC queue 0) is done once an op record names its queue
offset (RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0, written by END_TRANSACTION). Every
transaction_check_interval a pass reads the op records that arrived since the last one, then
walks the half queue from its progress offset: a half still open transaction_timeout after its
birth and after its last check (or CHECK_IMMUNITY_TIME_IN_SECONDS, when the producer set a longer
one: the answer to a check must have time to land before the half is checked again) is sent to a
producer of its group as CHECK_TRANSACTION_STATE (39, oneway, through the net actor holding that
connection); the producer answers with END_TRANSACTION (fromTransactionCheck true). After
transaction_check_max checks a half is given up: an error log names it, a net actor copies it to
TRANS_CHECK_MAX_TIME_TOPIC (smartgo.broker.processor.resume_half_processor, where RESUME_CHECK_HALF_MESSAGE
can put it back), and it counts as done.

Progress is two offsets of the system group CID_RMQ_SYS_TRANS in consumerOffset.json, as in
4.x: the half queue's (every half before it is done) and the op queue's (every op record before
it closes a half before the progress, so a restart reads again those that close later ones).

Departure: 4.x re-stores each checked half at the end of the half queue with
TRANSACTION_CHECK_TIMES + 1 and moves the progress past it; here the half stays where it is,
the pass walks on past it, and its check count (with the time of its last check) is kept in
config/transactionChecks.json, written after each pass that changed it, so a restart goes on
counting. So the check names the original half, and the state of the queue is never copied.

Each pass also counts the open halves it walks past by their real topic: the metrics page's
rocketmq_half_messages (5.x keeps a persisted counter instead; here it is as fresh as the last
pass, and counts at most WALK_LIMIT halves).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from smartgo.broker.schedule.schedule_message import (HALF_TOPIC, OP_TOPIC, PGROUP, REAL_TOPIC, ScheduleRecordError,
                                                      check_message)
from smartgo.broker.managers.topics import RW, TopicConfig
from smartgo.common.persist import PersistedFile
from smartgo.net.codes import FLAG_ONEWAY, TRANS_CHECK_MAX_TIME_TOPIC, RequestCode
from smartgo.net.command import RemotingCommand
from smartgo.store.consume_queue import ENTRY, HOLE_SIZE
from smartgo.store.errors import CorruptRecordError, OffsetGoneError
from smartgo.store.record import decode_record

if TYPE_CHECKING:
    from smartgo.broker.actors.broker_actor import BrokerActor

log = logging.getLogger(__name__)

CHECK_GROUP = "CID_RMQ_SYS_TRANS"
WALK_LIMIT = 20_000              # half entries one pass looks at (the broker actor's loop waits meanwhile)
IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
UNIQ_KEY = "UNIQ_KEY"
CHECKS_FILE = Path("config") / "transactionChecks.json"


class TransactionChecker:
    def __init__(self, broker: BrokerActor) -> None:
        self.b = broker
        cfg = broker.config
        self.timeout_ms = round(cfg.transaction_timeout * 1000)
        self.max_checks = cfg.transaction_check_max
        self.file = PersistedFile(Path(cfg.store_path) / CHECKS_FILE)
        # half queue offset -> (checks sent, last one ms); as saved, to write it again only when it changed
        self.checks: dict[int, tuple[int, int]] = self.file.load(decode_checks, "transaction check counts") or {}
        self._saved = dict(self.checks)
        # half queue offsets at or past the progress that are done -> the op record's offset that
        # says so (None: given up or gone, no op record)
        self.done: dict[int, int | None] = {}
        self.op_cursor: int | None = None               # op records read so far (None: since the stored offset)
        #: real topic -> halves the last pass found open (5.x's rocketmq_half_messages gauge)
        self.open_halves: Counter[str] = Counter()
        self._open: Counter[str] = Counter()            # the pass under way's

    def run(self, now_ms: int) -> int:
        """One pass; returns the number of checks sent."""
        view = self.b.view
        half_max = view.max_offset(HALF_TOPIC, 0)
        self._open = Counter()
        if not half_max:
            self.open_halves = self._open
            return 0
        # created on first use, as in 4.x: then routed, and consumer-progress of CID_RMQ_SYS_TRANS
        # shows the open halves as its lag
        self._create_topics(HALF_TOPIC, OP_TOPIC)
        reader = view.fresh_reader()
        written = view.written.get()
        offsets = self.b.offsets
        progress = max(offsets.query(CHECK_GROUP, HALF_TOPIC, 0), reader.min_offset(HALF_TOPIC, 0, half_max))
        self._read_ops(reader, written, progress)
        sent = 0
        cq = reader.queue(HALF_TOPIC, 0)
        offset = progress
        stop = min(half_max, progress + WALK_LIMIT)
        while offset < stop:
            try:
                raw = cq.entries(offset, stop - offset, stop)
            except OffsetGoneError:
                break                                   # cleanup took the file: the next pass starts past it
            if not raw:
                break
            for phys, size, _ in ENTRY.iter_unpack(raw):
                if size == HOLE_SIZE:                   # no message there (a repaired store): nothing to wait for
                    self.done[offset] = None
                elif phys + size > written:             # not visible here yet (commit publishes after a restart)
                    stop = offset
                    break
                elif offset not in self.done:
                    sent += self._check(reader.view(phys, written), phys, offset, now_ms)
                offset += 1
        while progress in self.done:
            del self.done[progress]
            self.checks.pop(progress, None)
            progress += 1
        offsets.commit(CHECK_GROUP, HALF_TOPIC, 0, progress)
        self.open_halves = self._open
        # the stored op offset stays at the first op record that closes a half past the progress,
        # so a restart reads it again (as fillOpRemoveMap does) and never checks a closed half
        op_offset = min((o for o in self.done.values() if o is not None), default=self.op_cursor)
        offsets.commit(CHECK_GROUP, OP_TOPIC, 0, op_offset)  # type: ignore[arg-type]  # _read_ops set op_cursor
        self.checks = {off: c for off, c in self.checks.items() if off >= progress}
        if self.checks != self._saved:
            self.file.save(json.dumps({"checks": {str(off): list(c) for off, c in self.checks.items()}}).encode())
            self._saved = dict(self.checks)
        return sent

    def _read_ops(self, reader, written: int, progress: int) -> None:
        """Every op record since the last pass: the half offsets they close."""
        op_max = self.b.view.max_offset(OP_TOPIC, 0)
        cursor = self.op_cursor
        if cursor is None:
            cursor = self.b.offsets.query(CHECK_GROUP, OP_TOPIC, 0)
        cursor = max(cursor, reader.min_offset(OP_TOPIC, 0, op_max))
        while cursor < op_max:
            got = reader.get_messages(OP_TOPIC, 0, cursor, 32, op_max, written)
            for record in got.buffers:
                try:
                    op = decode_record(record)
                    closed = int(op.body)
                except (CorruptRecordError, ValueError) as exc:
                    log.error("an op record after offset %d of %s is unreadable, skipped: %s", cursor, OP_TOPIC, exc)
                    continue
                if closed >= progress:
                    self.done.setdefault(closed, op.queue_offset)
            if got.next_begin_offset <= cursor:
                break
            cursor = got.next_begin_offset
        self.op_cursor = cursor

    def _check(self, record, phys: int, offset: int, now_ms: int) -> int:
        """Check one open half (1 when a check went out)."""
        if record is None:                          # gone with its CommitLog file, or no record there
            log.warning("half message %d: no record at CommitLog offset %d (deleted?), given up", offset, phys)
            self.done[offset] = None
            return 0
        try:
            half = decode_record(record, with_body=False)
        except CorruptRecordError as exc:
            return self._unreadable(offset, exc)
        props = half.properties
        topic = props.get(REAL_TOPIC, "")
        self._open[topic] += 1                      # open, unless given up below
        immunity = self.timeout_ms
        if props.get(IMMUNITY, "").isdigit():
            immunity = max(immunity, int(props[IMMUNITY]) * 1000)
        count, last = self.checks.get(offset, (0, 0))
        if now_ms - max(half.born_timestamp, last) < immunity:   # young, or its last answer may be on its way
            return 0
        group = props.get(PGROUP, "")
        if count >= self.max_checks:
            log.error("half message %d (%s, group %s, msgId %s) is still open after %d checks: given up, copied to %s",
                      offset, half.msg_id, group, props.get(UNIQ_KEY), count, TRANS_CHECK_MAX_TIME_TOPIC)
            self.done[offset] = None
            self._open[topic] -= 1
            self._give_up(phys, count)
            return 0
        self.checks[offset] = (count + 1, now_ms)
        producers = self.b.clients.producers.get(group)
        if not producers:
            log.warning("half message %d of group %s is open, and no producer of the group is connected to check it",
                        offset, group)
            return 0
        try:
            body = check_message(record)
        except ScheduleRecordError as exc:
            return self._unreadable(offset, exc)
        uniq = props.get(UNIQ_KEY, "")
        check = RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, flag=FLAG_ONEWAY, ext_fields={
            "tranStateTableOffset": str(offset), "commitLogOffset": str(half.commit_log_offset), "msgId": uniq,
            "transactionId": uniq, "offsetMsgId": half.msg_id}, body=body)
        self.b.channel.push(next(iter(producers.values())).ref, check)
        return 1

    def _give_up(self, phys: int, checks: int) -> None:
        """4.x's resolveDiscardMsg: the topic is created on demand (one queue, read-write, so routed
        and consumable), and a net actor stores the copy."""
        self._create_topics(TRANS_CHECK_MAX_TIME_TOPIC)
        channel = self.b.channel
        channel.send(channel.nets[0], "given_up", phys=phys, checks=checks)

    def _create_topics(self, *names: str) -> None:
        """The system topics not in the table yet, with 4.x's settings: one queue, read-write."""
        missing = [TopicConfig(name, 1, 1, RW) for name in names if name not in self.b.snapshot.topics]
        if missing:
            self.b.publish_topics(missing)

    def _unreadable(self, offset: int, exc: Exception) -> int:
        log.error("half message %d of %s is unreadable, given up: %s", offset, HALF_TOPIC, exc)
        self.done[offset] = None
        return 0


def decode_checks(raw: bytes) -> dict[int, tuple[int, int]]:
    """config/transactionChecks.json: {"checks": {"<half offset>": [checks sent, last one ms]}}."""
    return {int(off): (int(count), int(last)) for off, (count, last) in json.loads(raw)["checks"].items()}
