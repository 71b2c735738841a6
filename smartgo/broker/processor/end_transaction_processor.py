"""END_TRANSACTION (37) in a net actor: a transactional producer commits or rolls back a half message.

RocketMQ 4.x's EndTransactionProcessor. The producer names the half record by its CommitLog
offset (from the prepare's offsetMsgId) and its half-queue offset (the prepare's queueOffset);
the net actor reads the record from the mapped files and checks both, the producer group and
that the record is a half message. A commit stores the message in its real topic and queue
(schedule_message.end_transaction_record; or SCHEDULE_TOPIC_XXXX when it asks for a delay level or
a timer, as a send would: delayed_commit) and, once stored, an op record marking the half done:
RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0, tag "d", body the half's queue offset in decimal, as
TransactionalMessageBridge.putOpMessage writes it. A rollback stores only the op record. Java
clients send END_TRANSACTION oneway; a two-way request gets SUCCESS or the refusal's SYSTEM_ERROR.
Once the checks pass, both records land even if the producer hangs up meanwhile, as in 4.x,
whose processor thread does not look at the channel.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from smartgo.broker.schedule.schedule_message import (HALF_TOPIC, OP_TOPIC, PGROUP, REAL_TOPIC, Republished,
                                                      ScheduleRecordError, delayed_commit, end_transaction_record)
from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager
from smartgo.store.errors import CorruptRecordError, MessageIllegalError
from smartgo.store.record import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE, MessageExt, decode_record

if TYPE_CHECKING:
    from smartgo.broker.actors.net_actor import NetActor

log = logging.getLogger(__name__)

REMOVE_TAG = "d"                 # TransactionalMessageUtil.REMOVETAG
_OP_PROPERTIES = {"TAGS": REMOVE_TAG, "WAIT": "false"}
_ENDINGS = {TRANSACTION_COMMIT_TYPE: "commit", TRANSACTION_ROLLBACK_TYPE: "rollback"}


class EndTransactionProcessor:
    def __init__(self, net: NetActor) -> None:
        self.net = net
        self._finishing: set[asyncio.Task] = set()

    @eager
    async def process(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        group = request.ext_str("producerGroup")
        table_offset = request.ext_int("tranStateTableOffset")
        offset = request.ext_int("commitLogOffset")
        ending = request.ext_int("commitOrRollback")
        checked = request.ext_str("fromTransactionCheck", "false") == "true"
        if ending not in _ENDINGS:       # TRANSACTION_NOT_TYPE: the producer does not know yet; no answer
            log.warning("END_TRANSACTION from %s (group %s, offset %d, check %s) neither commits nor rolls back: %d",
                        conn.remote_address, group, offset, checked, ending)
            return None
        refused = self.net.sends.refuse_writes(request)
        if refused is not None:
            return refused
        view = self.net.view
        record = view.fresh_reader().view(offset, view.written.get())
        half, refusal = self._check(record, group, table_offset, offset)
        if refusal is not None:
            log.warning("END_TRANSACTION %s from %s (group %s, offset %d) refused: %s", _ENDINGS[ending],
                        conn.remote_address, group, offset, refusal)
            return request.make_response(ResponseCode.SYSTEM_ERROR, refusal)
        assert record is not None and half is not None
        stored = None
        if ending == TRANSACTION_COMMIT_TYPE:
            try:
                final = end_transaction_record(record, TRANSACTION_COMMIT_TYPE, offset)
            except ScheduleRecordError as exc:
                return request.make_response(ResponseCode.SYSTEM_ERROR, f"the half message cannot be committed: {exc}")
            final = self._delayed(final, half)
            # not counted as a put: the half was counted when it was sent, as in 4.x
            stored = self.net.sends.store_own(conn, request, final.topic, final.queue_id, final.data)
        # The rest runs in a task of its own: a producer that hangs up right after its oneway
        # commit cancels the connection's tasks, and the op record must follow the stored message
        # all the same (else the check-back would ask about the half, and a commit store it twice).
        task = asyncio.get_running_loop().create_task(self._finish(conn, request, half, ending, stored))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)
        return await asyncio.shield(task)

    def _delayed(self, final: Republished, half: MessageExt) -> Republished:
        """The committed message at its delay level or first timer hop, if it asks for one; at once
        if what it asks for is illegal (the half was accepted, the producer has moved on)."""
        sends = self.net.sends
        try:
            return delayed_commit(final, sends.max_delay_level, time.time_ns() // 1_000_000, sends.timer)
        except MessageIllegalError as exc:
            log.warning("committed message %s is stored at once: %s", half.uniq_key, exc.reason)
            return final

    async def _finish(self, conn: Connection, request: RemotingCommand, half: MessageExt, ending: int,
                      stored: asyncio.Future[RemotingCommand] | None) -> RemotingCommand:
        sends = self.net.sends
        if stored is None:
            response = request.make_response(ResponseCode.SUCCESS)
        else:
            response = await stored
            if response.code != ResponseCode.SUCCESS:
                return response
        # 5.x's transaction metrics: by the message's topic, seconds since the half's birth
        self.net.stats.ended(half.properties.get(REAL_TOPIC, ""), ending == TRANSACTION_COMMIT_TYPE,
                             max(0, time.time_ns() // 1_000_000 - half.born_timestamp) // 1000)
        op = sends.own_record(OP_TOPIC, b"%d" % half.queue_offset, _OP_PROPERTIES)
        done = await sends.store_own(conn, request, OP_TOPIC, 0, op)
        if done.code != ResponseCode.SUCCESS:                # the message stands; only the bookkeeping is missing
            log.error("END_TRANSACTION %s of offset %d: the op record was not stored: %s", _ENDINGS[ending],
                      half.commit_log_offset, done.remark)
        return response

    @staticmethod
    def _check(record, group: str, table_offset: int, offset: int) -> tuple[MessageExt | None, str | None]:
        """The half and checkPrepareMessage's refusal, or None; the record must also be a half message."""
        if record is None:
            return None, "Find prepared transaction message failed"
        try:
            half = decode_record(record, with_body=False)
        except CorruptRecordError as exc:
            return None, f"Find prepared transaction message failed: {exc.reason}"
        if half.topic != HALF_TOPIC:
            return half, "Find prepared transaction message failed: not a half message"
        if half.properties.get(PGROUP) != group:
            return half, "The producer group wrong"
        if half.queue_offset != table_offset:
            return half, "The transaction state table offset wrong"
        if half.commit_log_offset != offset:
            return half, "The commit log offset wrong"
        return half, None
