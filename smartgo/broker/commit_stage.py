"""The commit stage: the only CommitLog writer of a master.

It runs in its own actor (smartgo.broker.actors.commit_actor) when the node has several net
actors, and inside the net actor when there is only one (`commit_in_net`, the default then): a
synchronous send then crosses no process boundary on its way to the log and back, which saves
a ring write, two doorbells and a wake-up of another process per batch (a quarter of the
broker's CPU per synchronous send on 2 cores; docs/BENCHMARKS.md).

Producers in other processes (net actors, the schedule actor) hand it encoded blocks through
send.<name> and get completions back through done.<name>. One turn drains every input ring
and appends every block with ONE CommitLogWriter.append call (one store timestamp, offsets
assigned in order), publishes commitlog.written, writes one completion record per producer,
releases the inputs and rings dispatch (and flush, under sync flush) once. The net actor that
hosts the stage appends its own sends the same way, without a ring (`append_local`), and gets
their completions back as the call's result.

Exactly once across a crash of the stage's process. The input rings survive it (a batch is
released only after it was fully handled) and a restarted stage resumes them. Before
appending, a batch publishes an intent on the board:

    commit.cursor.<producer>  the input ring position the batch consumes through
    commit.intent_start       written when the batch began (where its first byte goes)
    commit.intent_bytes       an upper bound of the bytes the batch may write there
    commit.intent             a non-zero sequence number, stored last: the intent is valid

Order: intent -> append -> publish written -> completions -> release inputs -> clear intent.
On restart with an intent still up:

- written > intent_start: the batch landed (written moves only after the append). Its records
  are read again up to the cursors (a dead producer's included: the ring positions are what
  counts), matched block by block against the CommitLog records between intent_start and
  written (same bytes but the patched offsets and store time; a block that does not match was
  refused by the writer), and completions are sent again; producers ignore completions for
  requests they have already answered. A local batch (the hosting net actor's own sends) moves
  no cursor, so it has nothing to answer again: its connections died with the process.
- written == intent_start: nothing of the batch was published or acknowledged. Whatever the
  crashed append left past written is zeroed (and files it rolled to deleted), and the
  records, still unreleased, are appended again by the normal loop.

Queue offsets after a restart: the board's queue table (max offsets published by dispatch up to
commitlog.dispatched) plus a walk of the CommitLog from dispatched to written.

A fenced failover master (board word failover.fenced, rung by the broker actor) writes nothing:
each batch reads the fence before it appends and refuses the whole batch while it is up, and
`turn()` publishes commit.fenced once it has seen it. The batches before have landed, so from
then on commitlog.written is final: a switchover takes it as the master's end
(smartgo.registry.controller), whatever the net actors' own fence checks let through.
"""

from __future__ import annotations

import logging
import mmap
from collections import defaultdict
from collections.abc import Sequence

from smartgo.actors.actor import Actor
from smartgo.actors.logs import Repeats
from smartgo.actors.ring import CONSUMER, PRODUCER, RingTimeout
from smartgo.broker import recovery
from smartgo.broker.bells import FlagBell
from smartgo.broker.rings import (COMPLETION, DONE_RING_CAPACITY, SEND, SEND_RING_CAPACITY, STATUS_DISK_FULL,
                                  STATUS_FENCED, STATUS_ILLEGAL, STATUS_OK, STATUS_QUEUES_FULL, parse_send)
from smartgo.broker.settings import store_config
from smartgo.store import (AppendResult, Block, CommitLogReader, CommitLogWriter, DiskFullError, MessageIllegalError,
                           QueuesFullError, StoreLock)
from smartgo.store.record import (END_FILE_MIN_BLANK, FIXED_SIZE, INT32, POS_PHYSICALOFFSET, POS_QUEUEOFFSET,
                                  POS_STOREHOST, POS_STORETIMESTAMP, TRANSACTION_MASK,
                                  TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, peek_head)

NOT_QUEUED = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)   # no ConsumeQueue entry, no queue offset
FENCED = object()       # the result of every block of a batch refused for the fence
LOCAL = -1              # the owner index of the hosting net actor's own blocks


class CommitStage:
    """The writer, its input and output rings and its board words, in the process of `actor`
    (whose doorbell the input rings ring). Construct it in the actor's start()."""

    def __init__(self, actor: Actor, producers: Sequence[str]) -> None:
        self.actor = actor
        self.log = actor.log
        self.producers = list(producers)
        self._seq = 0
        self._topics: dict[bytes, str] = {}
        self._queues_full = Repeats()           # every send to a new queue would log it
        cfg = self.store = store_config(actor.config)
        self._lock = StoreLock(cfg.store_path).acquire()
        b = actor.board
        name = actor.name
        self.written = b.scalar("commitlog.written", writer=name)
        self.store_ts = b.scalar("commitlog.store_ts", writer=name)
        self.intent = b.scalar("commit.intent", writer=name)
        self.intent_start = b.scalar("commit.intent_start", writer=name)
        self.intent_bytes = b.scalar("commit.intent_bytes", writer=name)
        self.cursors = [b.scalar(f"commit.cursor.{p}", writer=name) for p in self.producers]
        self.disk_full = b.scalar("flag.disk_full")
        self.fence = b.scalar("failover.fenced")
        self.fence_seen = b.scalar("commit.fenced", writer=name)
        rec = recovery.load(actor.ctx.run_path)
        written = max(self.written.get(), rec.written)
        self.inputs = [actor.ring(f"send.{p}", CONSUMER, SEND_RING_CAPACITY, resume=True) for p in self.producers]
        self.outputs = [actor.ring(f"done.{p}", PRODUCER, DONE_RING_CAPACITY, resume=True) for p in self.producers]
        self.writer = CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, written, {},
                                      release_interval=cfg.release_interval_bytes,
                                      last_store_timestamp=max(self.store_ts.get(), rec.last_store_timestamp),
                                      max_queues=b.queues.limit)
        seq = self.intent.get()
        start = self.intent_start.get()
        if seq and written == start:
            self.log.warning("restart: the batch in flight at %d never landed; wiping up to %d bytes after it and "
                             "appending its records again", start, self.intent_bytes.get())
            self.writer.discard_unpublished(self.intent_bytes.get())
        self.writer.queue_offsets.update(self._queue_offsets(written))
        if seq and written > start:
            self._finish_landed(start, written)
        self.intent.set(0)
        self.store_ts.set(self.writer.last_store_timestamp)
        self.written.set(written)
        run_path = actor.ctx.run_path
        self.dispatch_bell = FlagBell(b, run_path, "dispatch", "dispatch.sleeping")
        self.ha_bell = FlagBell(b, run_path, "ha", "ha.sleeping")      # slaves waiting for data
        self.flush_bell = (FlagBell(b, run_path, "flush", "flush.sleeping")
                           if actor.config.flush == "sync" else None)

    # ---- restart ---------------------------------------------------------------------------------------
    def _queue_offsets(self, written: int) -> dict[tuple[str, int], int]:
        """Next offset per queue: the board's table (valid up to dispatched) + the records after."""
        board = self.actor.board
        dispatched = board.get("commitlog.dispatched")      # read before the table: it covers at least this
        table = {(t, q): v["max_offset"] for t, q, v in board.queues.items()}
        if dispatched < written:
            reader = CommitLogReader(self.store.commitlog_dir, self.store.commitlog_file_size)
            try:
                for _phys, mm, rel, _size in reader.walk(dispatched, written):
                    _, topic, queue_id, queue_offset, sys_flag, _, _ = peek_head(mm, rel)
                    if sys_flag & TRANSACTION_MASK not in NOT_QUEUED:
                        key = (topic.decode(), queue_id)
                        if queue_offset + 1 > table.get(key, 0):
                            table[key] = queue_offset + 1
            finally:
                reader.close()
            self.log.info("restart: queue offsets rebuilt from the board and %d bytes of CommitLog",
                          written - dispatched)
        return table

    def _finish_landed(self, start: int, written: int) -> None:
        """The batch of a crashed incarnation landed: answer its requests again from the log."""
        inputs = [(i, ring.read(upto=self.cursors[i].get())) for i, ring in enumerate(self.inputs)]
        reader = CommitLogReader(self.store.commitlog_dir, self.store.commitlog_file_size)
        try:
            records = [(phys, mm, rel, size) for phys, mm, rel, size in reader.walk(start, written)]
            owners: list[tuple[int, int]] = []
            results: list[AppendResult | DiskFullError | MessageIllegalError] = []
            k = 0
            for i, recs in inputs:
                for mv in recs:
                    req = parse_send(mv)
                    owners.append((i, req.req_id))
                    if k + req.count <= len(records) and _same_block(req.data, records[k:k + req.count]):
                        phys, mm, rel, _ = records[k]
                        last = records[k + req.count - 1]
                        queue_offset = int.from_bytes(mm[rel + POS_QUEUEOFFSET:rel + POS_QUEUEOFFSET + 8], "big")
                        results.append(AppendResult(phys, queue_offset, req.count, 0, last[0] + last[3]))
                        k += req.count
                    else:
                        results.append(DiskFullError("commitlog", len(req.data)) if k >= len(records)
                                       else MessageIllegalError("refused by the writer"))
            self._complete(owners, results)
        finally:
            reader.close()
        for ring in self.inputs:
            ring.release()
        self.log.warning("restart: the batch in flight at %d had landed (up to %d); %d requests answered again",
                         start, written, len(owners))

    # ---- turns ------------------------------------------------------------------------------------------
    def fence_moved(self) -> bool:
        return self.fence.get() != self.fence_seen.get()

    def turn(self) -> bool:
        """Publish the fence as seen, then append whatever the input rings hold; True if any."""
        fenced = self.fence.get()
        if fenced != self.fence_seen.get():
            self.fence_seen.set(fenced)          # every batch before this turn has landed
        batch = [(i, recs) for i, ring in enumerate(self.inputs) if (recs := ring.read())]
        if not batch:
            return False
        owners: list[tuple[int, int]] = []
        blocks: list[Block] = []
        for i, recs in batch:
            self._blocks(recs, i, owners, blocks)
        for i, _ in batch:
            self.cursors[i].set(self.inputs[i].cursor)
        results, landed = self._append(blocks, fenced)
        # Under sync flush a landed batch is answered after the flush round anyway, and the flush
        # actor rings the producers then: the completions need no doorbell of their own.
        self._complete(owners, results, wake=self.flush_bell is None or not landed)
        for i, _ in batch:
            self.inputs[i].release()
        self._finish_turn(landed)
        return True

    def append_local(self, records: Sequence[bytes | memoryview]) -> bytes:
        """Append the hosting net actor's own send records (send.<net> format, no ring) now; their
        completions, one record as the done ring would carry them."""
        owners: list[tuple[int, int]] = []
        blocks: list[Block] = []
        self._blocks(records, LOCAL, owners, blocks)
        results, landed = self._append(blocks, self.fence.get())
        done = self._completions(owners, results)[LOCAL]
        self._finish_turn(landed)
        return b"".join(done)

    def _blocks(self, recs: Sequence[bytes | memoryview], owner: int, owners: list[tuple[int, int]],
                blocks: list[Block]) -> None:
        topics = self._topics
        unpack = SEND.unpack_from
        head = SEND.size
        for rec in recs:
            mv = memoryview(rec)
            req_id, count, queue_id, tlen = unpack(mv)
            raw = bytes(mv[head:head + tlen])
            topic = topics.get(raw)
            if topic is None:
                topic = topics[raw] = raw.decode()
            blocks.append(Block(mv[head + tlen:], (topic, queue_id) if queue_id >= 0 else None, count))
            owners.append((owner, req_id))

    def _append(self, blocks: list[Block], fenced: int) -> tuple[list, bool]:
        """Intent, append, publish: one result per block (AppendResult, an error, or FENCED), and
        whether anything landed."""
        writer = self.writer
        before = writer.wrote_position
        self.intent_start.set(before)
        self.intent_bytes.set(sum(len(b.data) for b in blocks) + END_FILE_MIN_BLANK)
        self._seq += 1
        self.intent.set(self._seq)                              # the intent is published
        if fenced:
            results: list = [FENCED] * len(blocks)
        elif self.disk_full.get():
            results = [DiskFullError("commitlog", sum(len(b.data) for b in blocks))] * len(blocks)
        else:
            results = writer.append(blocks)
        landed = writer.wrote_position != before
        if landed:
            self.store_ts.set(writer.last_store_timestamp)
            self.written.set(writer.wrote_position)             # the batch landed
        return results, landed

    def _finish_turn(self, landed: bool) -> None:
        self.intent.set(0)
        if landed:
            self.dispatch_bell.ring()
            self.ha_bell.ring()
            if self.flush_bell is not None:
                self.flush_bell.ring()

    def _completions(self, owners: list[tuple[int, int]], results: list) -> dict[int, list[bytes]]:
        per: dict[int, list[bytes]] = defaultdict(list)
        pack = COMPLETION.pack
        for (i, req_id), r in zip(owners, results):
            if isinstance(r, AppendResult):
                per[i].append(pack(req_id, STATUS_OK, r.count, r.physical_offset, r.queue_offset, r.end_offset))
            else:
                status = (STATUS_FENCED if r is FENCED else STATUS_DISK_FULL if isinstance(r, DiskFullError)
                          else STATUS_QUEUES_FULL if isinstance(r, QueuesFullError) else STATUS_ILLEGAL)
                if status == STATUS_QUEUES_FULL:
                    self._queues_full.log(self.log, logging.ERROR, f"send refused: {r}; a node restart sizes the "
                                          "table from the store, board_queue_capacity starts it larger", "full")
                per[i].append(pack(req_id, status, 0, 0, 0, 0))
        return per

    def _complete(self, owners: list[tuple[int, int]], results: list, wake: bool = True) -> None:
        """One completion record per producer for the whole batch."""
        for i, parts in self._completions(owners, results).items():
            record = [b"".join(parts)]
            ring = self.outputs[i]
            if ring.try_write(record, wake=wake):
                continue
            producer = self.producers[i]
            if not self.actor.board.actor_running(producer):
                self.log.warning("%s is down: %d completions dropped", producer, len(parts))
                continue
            try:
                ring.write(record, timeout=1.0)
            except RingTimeout:
                self.log.error("%s does not drain its completions: %d dropped", producer, len(parts))

    def close(self) -> None:
        # What is still in the input rings was never acknowledged and its producers have stopped
        # (they stop first and wait for their answers): it is not appended.
        self.writer.close()
        self._lock.release()


def _same_block(data: memoryview, records: list[tuple[int, mmap.mmap, int, int]]) -> bool:
    """The CommitLog records are `data` as appended: equal bytes except QUEUEOFFSET,
    PHYSICALOFFSET and STORETIMESTAMP, which the writer patched (IPv4 hosts: SmartGo writes no
    other kind)."""
    p = 0
    n = len(data)
    for _phys, mm, rel, size in records:
        if p + FIXED_SIZE > n or INT32.unpack_from(data, p)[0] != size or p + size > n:
            return False
        log = memoryview(mm)[rel:rel + size]
        rec = data[p:p + size]
        if (rec[:POS_QUEUEOFFSET] != log[:POS_QUEUEOFFSET]
                or rec[POS_PHYSICALOFFSET + 8:POS_STORETIMESTAMP] != log[POS_PHYSICALOFFSET + 8:POS_STORETIMESTAMP]
                or rec[POS_STOREHOST:] != log[POS_STOREHOST:]):
            return False
        p += size
    return p == n
