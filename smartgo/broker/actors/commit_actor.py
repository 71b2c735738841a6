"""The commit actor: the only CommitLog writer.

Each net actor hands it encoded blocks through send.<net> and gets completions back through
done.<net>. One turn of the loop drains every input ring and appends every block with ONE
CommitLogWriter.append call (one store timestamp, offsets assigned in order), publishes
commitlog.written, writes one completion record per net actor, releases the inputs and rings
dispatch (and flush, under sync flush) once.

Exactly once across a crash of this actor. The input rings survive it (a batch is released
only after it was fully handled) and a restarted commit actor resumes them. Before appending,
the turn publishes an intent on the board:

    commit.cursor.<net>   the input ring position the batch consumes through (per net actor)
    commit.intent_start   written when the batch began (where its first byte goes)
    commit.intent_bytes   an upper bound of the bytes the batch may write there
    commit.intent         a non-zero sequence number, stored last: the intent is valid

Order: intent -> append -> publish written -> completions -> release inputs -> clear intent.
On restart with an intent still up:

- written > intent_start: the batch landed (written moves only after the append). Its records
  are read again up to the cursors (a dead producer's included: the ring positions are what
  counts), matched block by block against the CommitLog records between intent_start and
  written (same bytes but the patched offsets and store time; a block that does not match was
  refused by the writer), and completions are sent again; net actors ignore completions for
  requests they have already answered.
- written == intent_start: nothing of the batch was published or acknowledged. Whatever the
  crashed append left past written is zeroed (and files it rolled to deleted), and the
  records, still unreleased, are appended again by the normal loop.

Queue offsets after a restart: the board's queue table (max offsets published by dispatch up to
commitlog.dispatched) plus a walk of the CommitLog from dispatched to written.

A fenced failover master (board word failover.fenced, rung by the broker actor) writes nothing:
each turn reads the fence before its batch and refuses the whole batch while it is up, and
publishes commit.fenced once it has seen it. The batches before that turn have landed, so from
then on commitlog.written is final: a switchover takes it as the master's end
(smartgo.registry.controller), whatever the net actors' own fence checks let through.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
from collections import defaultdict

from smartgo.actors.actor import Actor, ActorContext
from smartgo.actors.logs import Repeats
from smartgo.actors.ring import CONSUMER, PRODUCER, RingTimeout, wait_any
from smartgo.broker import profiling, recovery
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


class CommitActor(Actor):
    def __init__(self, ctx: ActorContext, *, nets: list[str]) -> None:
        super().__init__(ctx)
        self.nets = nets
        self._seq = 0
        self._topics: dict[bytes, str] = {}
        self._queues_full = Repeats()           # every send to a new queue would log it
        self._task: asyncio.Task | None = None

    # ---- start: resume where the previous incarnation (or recovery) left ---------------------------
    async def start(self) -> None:
        self._profile = profiling.start(self.name)
        cfg = self.store = store_config(self.config)
        self._lock = StoreLock(cfg.store_path).acquire()
        b = self.board
        self.written = b.scalar("commitlog.written", writer=self.name)
        self.store_ts = b.scalar("commitlog.store_ts", writer=self.name)
        self.intent = b.scalar("commit.intent", writer=self.name)
        self.intent_start = b.scalar("commit.intent_start", writer=self.name)
        self.intent_bytes = b.scalar("commit.intent_bytes", writer=self.name)
        self.cursors = [b.scalar(f"commit.cursor.{net}", writer=self.name) for net in self.nets]
        self.disk_full = b.scalar("flag.disk_full")
        self.fence = b.scalar("failover.fenced")
        self.fence_seen = b.scalar("commit.fenced", writer=self.name)
        rec = recovery.load(self.ctx.run_path)
        written = max(self.written.get(), rec.written)
        self.inputs = [self.ring(f"send.{net}", CONSUMER, SEND_RING_CAPACITY, resume=True) for net in self.nets]
        self.outputs = [self.ring(f"done.{net}", PRODUCER, DONE_RING_CAPACITY, resume=True) for net in self.nets]
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
        self.dispatch_bell = FlagBell(b, self.ctx.run_path, "dispatch", "dispatch.sleeping")
        self.ha_bell = FlagBell(b, self.ctx.run_path, "ha", "ha.sleeping")      # slaves waiting for data
        self.flush_bell = (FlagBell(b, self.ctx.run_path, "flush", "flush.sleeping")
                           if self.config.flush == "sync" else None)
        self._task = self.spawn(self._run(), "loop")

    def _queue_offsets(self, written: int) -> dict[tuple[str, int], int]:
        """Next offset per queue: the board's table (valid up to dispatched) + the records after."""
        dispatched = self.board.get("commitlog.dispatched")      # read before the table: it covers at least this
        table = {(t, q): v["max_offset"] for t, q, v in self.board.queues.items()}
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

    # ---- the loop ------------------------------------------------------------------------------------
    async def _run(self) -> None:
        inputs = self.inputs
        fence, fence_seen = self.fence, self.fence_seen
        while True:
            fenced = fence.get()
            if fenced != fence_seen.get():
                fence_seen.set(fenced)          # every batch before this turn has landed
            batch = [(i, recs) for i, ring in enumerate(inputs) if (recs := ring.read())]
            if batch:
                self._commit(batch, fenced)
                await asyncio.sleep(0)      # let the heartbeat and control messages in between batches
            else:                               # the broker actor rings when the fence moves
                await wait_any(inputs, self.bell, 1.0, ready=lambda: fence.get() != fence_seen.get())

    def _commit(self, batch: list[tuple[int, list[memoryview]]], fenced: int = 0) -> None:
        owners: list[tuple[int, int]] = []
        blocks: list[Block] = []
        total = 0
        topics = self._topics
        unpack = SEND.unpack_from
        head = SEND.size
        for i, recs in batch:
            for mv in recs:
                req_id, count, queue_id, tlen = unpack(mv)
                raw = bytes(mv[head:head + tlen])
                topic = topics.get(raw)
                if topic is None:
                    topic = topics[raw] = raw.decode()
                data = mv[head + tlen:]
                blocks.append(Block(data, (topic, queue_id) if queue_id >= 0 else None, count))
                owners.append((i, req_id))
                total += len(data)
        writer = self.writer
        before = writer.wrote_position
        for i, _ in batch:
            self.cursors[i].set(self.inputs[i].cursor)
        self.intent_start.set(before)
        self.intent_bytes.set(total + END_FILE_MIN_BLANK)
        self._seq += 1
        self.intent.set(self._seq)                              # the intent is published
        if fenced:
            results: list = [FENCED] * len(blocks)
        elif self.disk_full.get():
            results = [DiskFullError("commitlog", total)] * len(blocks)
        else:
            results = writer.append(blocks)
        after = writer.wrote_position
        if after != before:
            self.store_ts.set(writer.last_store_timestamp)
            self.written.set(after)                             # the batch landed
        # Under sync flush a landed batch is answered after the flush round anyway, and the flush
        # actor rings the net actors then: the completions need no doorbell of their own.
        flush_follows = self.flush_bell is not None and after != before
        self._complete(owners, results, wake=not flush_follows)
        for i, _ in batch:
            self.inputs[i].release()
        self.intent.set(0)
        if after != before:
            self.dispatch_bell.ring()
            self.ha_bell.ring()
            if flush_follows:
                self.flush_bell.ring()  # type: ignore[union-attr]  # flush_follows: there is one

    def _complete(self, owners: list[tuple[int, int]], results: list, wake: bool = True) -> None:
        """One completion record per net actor for the whole batch."""
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
        for i, parts in per.items():
            record = [b"".join(parts)]
            ring = self.outputs[i]
            if ring.try_write(record, wake=wake):
                continue
            net = self.nets[i]
            if not self.board.actor_running(net):
                self.log.warning("%s is down: %d completions dropped", net, len(parts))
                continue
            try:
                ring.write(record, timeout=1.0)
            except RingTimeout:
                self.log.error("%s does not drain its completions: %d dropped", net, len(parts))

    async def stop(self) -> None:
        # The net actors stopped first and waited for their answers; whatever is still in the rings
        # was never acknowledged and its connections are gone: it is not appended. (The loop was
        # cancelled before stop().)
        self.writer.close()
        self._lock.release()
        profiling.dump(self._profile, self.name)


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
