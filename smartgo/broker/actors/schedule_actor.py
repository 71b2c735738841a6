"""The schedule actor: delivers delayed messages when due (RocketMQ's ScheduleMessageService).

Net actors store a message with DELAY > 0 in SCHEDULE_TOPIC_XXXX, queue level - 1
(smartgo.broker.schedule.schedule_message); dispatch gives each entry its delivery time as tag code. Per
level this actor follows that queue from its offset: it re-publishes every entry whose time has
come (schedule_message.republish: real topic and queue, DELAY removed, the rest kept) through the
commit actor - a producer to commit like a net actor, with its own rings:

    send.schedule  -> commit      done.schedule  <- commit

Within a level delivery times ascend, so only each level's head matters: the actor sleeps until
the earliest head is due. A level that has caught up ("idle") has no head; its bit in the board
word `schedule.idle` (bit level - 1) asks dispatch to ring this actor's doorbell when entries
arrive in its queue. One batch (every due entry, bounded) is in flight at a time. Nothing is
delivered while the disk is full or a failover master is fenced (a write it makes then could be
cut, and the master that follows would deliver the message again).

Exactly once. A level's offset advances only over entries whose copy the commit actor
acknowledged (under sync flush: and flushed). delayOffset.json (smartgo.broker.schedule.schedule_offsets)
holds the offsets and `scanFrom`, a CommitLog position before every copy of an entry at or
after them, and is written after batches (at most every PERSIST_PAUSE, in a worker thread). A
level never hands over entries more than WINDOW beyond its last persisted offset. So after a
crash (of this actor, of commit, of the node) the only copies not counted in the file are those
of its first WINDOW entries per level, and they lie after scanFrom: a restarted actor first lets
commit finish its predecessor's records still in send.schedule (the producer side resumes, so
they land), then walks the CommitLog from scanFrom to the written position and matches every
record that could be a copy (schedule_message.copy_signature) against those entries; matched
entries count as delivered. Identical entries match as many copies as there are.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field

from smartgo.actors.actor import Actor, ActorContext
from smartgo.actors.ring import CONSUMER, PRODUCER, full_fence, wait_any
from smartgo.broker import profiling
from smartgo.broker.net_view import NetView
from smartgo.broker.rings import (DONE_RING_CAPACITY, SEND_RING_CAPACITY, STATUS_DISK_FULL, STATUS_FENCED, STATUS_OK,
                                  STATUS_QUEUES_FULL, iter_completions, send_prefix)
from smartgo.broker.schedule.schedule_message import (ScheduleRecordError, copy_signature, deliver_time, idle_bit,
                                                      is_copy_candidate, republish, timer_copies, timer_step)
from smartgo.broker.schedule.schedule_offsets import DelayOffsetFile, DelayState
from smartgo.broker.settings import SCHEDULE, delay_levels, store_config, timer_settings
from smartgo.store import CorruptRecordError, OffsetGoneError, StoreReader
from smartgo.store.config import TIMER_FIRST_LEVEL
from smartgo.store.consume_queue import ENTRY, HOLE_SIZE
from smartgo.store.record import SCHEDULE_TOPIC, peek_head

BATCH_MESSAGES = 1024          # one batch: at most this many messages ...
BATCH_BYTES = 4 << 20          # ... and bytes (the send ring holds 8 MiB: a batch always fits an empty ring)
WINDOW = 4096                  # entries a level may hand over beyond its last persisted offset
PERSIST_PAUSE = 0.05           # s between two writes of delayOffset.json
SAFETY_SLEEP = 1.0             # s: the longest sleep without a look at the queues
REFRESH_SCAN_BYTES = 1 << 20   # idle: move scanFrom up once the CommitLog grew this much
STALE_BATCH = 60.0             # s without every completion of a batch: fail (a restart resolves it)
PAUSE = 1.0                    # s between looks while the disk is full or a failover master is fenced
#: Completions that leave a copy for a later turn, and why.
DELIVER_LATER = {STATUS_DISK_FULL: "disk full", STATUS_FENCED: "a fenced failover master writes nothing",
                 STATUS_QUEUES_FULL: "the broker has no room for another queue"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000          # the commit actor's store-time clock


@dataclass(slots=True, eq=False)
class Level:
    level: int                  # 1-based; the queue is level - 1
    delay_ms: int
    offset: int = 0             # every entry before it is delivered (what delayOffset.json holds)
    cursor: int = 0             # next entry to look at (>= offset)
    persisted: int = 0          # offset in the last delayOffset.json written
    max_offset: int = 0         # the queue's published max offset when last looked at
    due: int = 0                # delivery time of the entry at cursor (ms); 0: none known
    # entries at or after offset already handled: queue offset -> physical offset of the copy (-1: none made)
    beyond: dict[int, int] = field(default_factory=dict)

    @property
    def queue_id(self) -> int:
        return self.level - 1

    @property
    def bit(self) -> int:
        return idle_bit(self.queue_id)

    @property
    def timer(self) -> bool:
        return self.level >= TIMER_FIRST_LEVEL

    def advance(self) -> None:
        beyond = self.beyond
        while self.offset in beyond:
            del beyond[self.offset]
            self.offset += 1
        self.cursor = max(self.cursor, self.offset)


class ScheduleActor(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self._ids = 0
        self._id_base = ctx.incarnation << 40
        self._flight: dict[int, tuple[Level, int]] = {}
        self._ends = 0                          # highest end offset of the batch in flight
        self._pending_state: DelayState | None = None
        self._persist_task: asyncio.Task | None = None
        self._submitted: dict[int, int] = {}     # the offsets of the last state handed to the writer
        self._scan_from = 0
        self._resumed = False
        self._rr = 0
        self.every(SAFETY_SLEEP, self._refresh_scan_from, "refresh")

    # ---- start --------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._profile = profiling.start(self.name)
        cfg = self.config
        store = store_config(cfg)
        self.sync_flush = cfg.flush == "sync"
        self.fault_file = cfg.schedule_fault_file
        self.reader = StoreReader(store)
        self.view = NetView(self.board, cfg.store_path, self.reader)
        self.fenced = self.board.scalar("failover.fenced")
        used = len(delay_levels(cfg))               # the table's padding up to the timer hops has no entries
        self.levels = [Level(i + 1, ms) for i, ms in enumerate(store.delay_levels_ms)
                       if i < used or i + 1 >= TIMER_FIRST_LEVEL]
        self.timer = timer_settings(cfg)
        b = self.board
        self.idle = b.scalar("schedule.idle", writer=self.name)
        self.flush_wait = b.scalar(f"{SCHEDULE}.flush_wait", writer=self.name)
        self.idle.set(0)
        self.flush_wait.set(0)
        self.file = DelayOffsetFile(cfg.store_path)
        state = self._load_state()
        for lv in self.levels:
            lv.offset = lv.cursor = lv.persisted = state.offsets.get(lv.level, 0)
        self._scan_from = state.scan_from if state.scan_from is not None else self.view.written.get()
        stranded = sorted(set(state.offsets) - {lv.level for lv in self.levels})
        if stranded:
            self.log.warning("delay levels %s have offsets but the table %r has %d levels: their queues are not "
                             "delivered", stranded, cfg.message_delay_level, used)
        # resume: what the previous incarnation put in send.schedule is still appended
        self.out = self.ring(f"send.{SCHEDULE}", PRODUCER, SEND_RING_CAPACITY, resume=True)
        self.done = self.ring(f"done.{SCHEDULE}", CONSUMER, DONE_RING_CAPACITY)
        self.spawn(self._run(), "loop")

    def _load_state(self) -> DelayState:
        state = self.file.load()
        if state is not None:
            return state
        if self.file.path.exists():
            self.log.error("%s and its .bak are unreadable: every delayed message still stored is delivered "
                           "again from its queue's first entry", self.file.path)
        return DelayState({}, None)

    # ---- the loop -----------------------------------------------------------------------------------------
    async def _run(self) -> None:
        await self._resume()
        while True:
            if self.view.disk_full.get() or self.fenced.get():     # no writes: held until they are allowed
                await asyncio.sleep(PAUSE)
                continue
            now = now_ms()
            records = self._collect(now)
            if records:
                await self._deliver(records)
            for lv in self.levels:
                lv.advance()                    # also over entries skipped without a copy (holes, gone records)
            if any(lv.offset != self._submitted.get(lv.level, 0) for lv in self.levels):
                self._snapshot()
            if records:
                await asyncio.sleep(0)
            else:
                await self._sleep(now)

    def _collect(self, now: int) -> list[bytes]:
        """Every due entry from each level's cursor (bounded): the send.schedule records to hand over."""
        records: list[bytes] = []
        nbytes = 0
        for lv in self.levels:
            lv.due = 0
            lv.max_offset = self.view.max_offset(SCHEDULE_TOPIC, lv.queue_id)
        written = self.view.written.get()           # after the queues: their entries' records are below it
        reader = self.view.fresh_reader()
        n = len(self.levels)
        self._rr = (self._rr + 1) % n               # levels take turns to go first
        for k in range(n):
            lv = self.levels[(self._rr + k) % n]
            bound = min(lv.max_offset, lv.persisted + WINDOW)
            cq = reader.queue(SCHEDULE_TOPIC, lv.queue_id) if lv.cursor < bound else None
            while cq is not None and lv.cursor < bound and len(records) < BATCH_MESSAGES and nbytes < BATCH_BYTES:
                try:
                    raw = cq.entries(lv.cursor, BATCH_MESSAGES, bound)
                except OffsetGoneError:
                    self._skip_gone(lv, reader)
                    bound = min(lv.max_offset, lv.persisted + WINDOW)
                    continue
                if not raw:
                    break
                for phys, size, tags in ENTRY.iter_unpack(raw):
                    off = lv.cursor
                    if off in lv.beyond:
                        lv.cursor += 1
                        continue
                    if size == HOLE_SIZE:
                        lv.beyond[off] = -1
                        lv.cursor += 1
                        continue
                    due = deliver_time(tags, now, lv.delay_ms)
                    if due > now or phys + size > written:  # (the second: never, with the reads ordered)
                        lv.due = max(due, now + 1)
                        cq = None
                        break
                    data = self._republished(lv, off, phys, tags, now, written, reader)
                    lv.cursor += 1
                    if data is None:
                        continue
                    records.append(data)
                    nbytes += len(data)
                    if len(records) >= BATCH_MESSAGES or nbytes >= BATCH_BYTES:
                        break
        return records

    def _republished(self, lv: Level, off: int, phys: int, tags: int, now: int, written: int,
                     reader: StoreReader) -> bytes | None:
        """The send.schedule record for one due entry (registered in flight), None when it is skipped."""
        rec = reader.view(phys, written)
        try:
            if rec is None:
                raise ScheduleRecordError(f"no record at CommitLog offset {phys} (deleted?)")
            topic, queue_id, data = timer_step(rec, tags, now, self.timer) if lv.timer else republish(rec)
        except ScheduleRecordError as exc:
            self.log.error("delay level %d entry %d skipped: %s", lv.level, off, exc)
            lv.beyond[off] = -1
            return None
        self._ids += 1
        req_id = self._id_base | self._ids
        self._flight[req_id] = (lv, off)
        return send_prefix(req_id, 1, queue_id, topic.encode()) + data

    def _skip_gone(self, lv: Level, reader: StoreReader) -> None:
        """The ConsumeQueue file under the cursor was deleted (cleanup): go on from the queue's
        minimum (nothing is in flight while collecting)."""
        reader.refresh()
        first = max(reader.min_offset(SCHEDULE_TOPIC, lv.queue_id, lv.max_offset), lv.cursor + 1)
        self.log.warning("delay level %d: entries %d..%d are gone (cleanup); going on from %d",
                         lv.level, lv.cursor, first - 1, first)
        lv.beyond = {off: phys for off, phys in lv.beyond.items() if off >= first}
        lv.offset = max(lv.offset, first)
        lv.cursor = max(lv.cursor, first)

    async def _deliver(self, records: list[bytes]) -> None:
        """Hand one batch to commit, wait for every completion (and under sync flush for the
        flush), then advance the levels."""
        if self.sync_flush:
            self.flush_wait.set(1)               # the flush actor rings after each round (commit does not)
        self._ends = 0
        i = self.out.try_write(records)
        while i < len(records):                  # only while commit still holds a predecessor's batch
            await asyncio.sleep(0.001)
            i = self.out.try_write(records, i)
        self._fault("handover")
        deadline = time.monotonic() + STALE_BATCH
        while self._flight:
            got = self.done.read()
            if got:
                self._on_completions(got)
                self.done.release()
                continue
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(self._flight)} re-published messages got no completion in "
                                   f"{STALE_BATCH:g}s (restarting resolves them from the CommitLog)")
            await wait_any([self.done], self.bell, 0.5)
        if self.sync_flush:
            end = self._ends
            self.flush_wait.set(end)
            flushed = self.view.flushed
            while flushed.get() < end:
                await wait_any([], self.bell, 0.5, lambda: flushed.get() >= end)
            self.flush_wait.set(0)
        self._fault("landed")
        for lv in self.levels:
            lv.advance()

    def _on_completions(self, records: list[memoryview]) -> None:
        failed: dict[Level, int] = {}
        why = ""
        for mv in records:
            for req_id, status, _count, phys, _qoff, end in iter_completions(mv):
                item = self._flight.pop(req_id, None)
                if item is None:
                    continue                    # a predecessor's request, or a repeated completion
                lv, off = item
                if status == STATUS_OK:
                    lv.beyond[off] = phys
                    self._ends = max(self._ends, end)
                elif status in DELIVER_LATER:
                    failed[lv] = min(failed.get(lv, off), off)
                    why = DELIVER_LATER[status]
                else:
                    self.log.error("delay level %d entry %d: the commit actor refused its copy; skipped",
                                   lv.level, off)
                    lv.beyond[off] = -1
        for lv, off in failed.items():
            self.log.warning("delay level %d: %s, entries from %d are delivered later", lv.level, why, off)
            lv.cursor = min(lv.cursor, off)

    async def _sleep(self, now: int) -> None:
        """Until the earliest head is due, or dispatch rings for a level that was idle."""
        dues = [lv.due for lv in self.levels if lv.due]
        timeout = min(SAFETY_SLEEP, (min(dues) - now) / 1000) if dues else SAFETY_SLEEP
        if any(lv.persisted + WINDOW <= lv.cursor < lv.max_offset for lv in self.levels):
            timeout = min(timeout, PERSIST_PAUSE)   # held back until delayOffset.json catches up
        idle = [lv for lv in self.levels if lv.cursor >= lv.max_offset]
        mask = 0
        for lv in idle:
            mask |= lv.bit
        self.idle.set(mask)
        full_fence()
        try:
            if not any(self.view.max_offset(SCHEDULE_TOPIC, lv.queue_id) > lv.max_offset for lv in idle):
                await self.bell.wait(max(timeout, 0.0))
        finally:
            self.idle.set(0)

    # ---- persistence ---------------------------------------------------------------------------------------
    def _state(self) -> DelayState:
        copies = [phys for lv in self.levels for phys in lv.beyond.values() if phys >= 0]
        if copies:
            self._scan_from = min(copies)
        elif not self._flight:
            self._scan_from = self.view.written.get()    # every copy made so far lies before it
        return DelayState({lv.level: lv.offset for lv in self.levels if lv.offset or lv.max_offset},
                          self._scan_from)

    def _snapshot(self) -> None:
        """Persist the current state soon (coalesced; one write at a time, in a worker thread)."""
        self._pending_state = state = self._state()
        self._submitted = state.offsets
        if self._persist_task is None or self._persist_task.done():
            self._persist_task = self.spawn(self._persist(), "persist")

    async def _persist(self) -> None:
        while self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            await asyncio.to_thread(self._save, state)
            await asyncio.sleep(PERSIST_PAUSE)

    def _save(self, state: DelayState) -> None:
        self._fault("persist")
        self.file.save(state)
        for lv in self.levels:
            lv.persisted = state.offsets.get(lv.level, 0)

    def _refresh_scan_from(self) -> None:
        """Idle: keep scanFrom near the written position, so a restart walks little CommitLog."""
        if self._resumed and not self._flight and self.view.written.get() - self._scan_from > REFRESH_SCAN_BYTES \
                and not any(lv.beyond for lv in self.levels):
            self._snapshot()

    # ---- restart ----------------------------------------------------------------------------------------------
    async def _resume(self) -> None:
        """Count the copies a crashed incarnation made after its last persisted offsets."""
        waited = time.monotonic()
        while self.out.backlog():                # commit first appends what the predecessor handed over
            if time.monotonic() - waited > 5.0:
                self.log.warning("waiting for the commit actor to take the previous incarnation's batch")
                waited = time.monotonic()
            await asyncio.sleep(0.005)
        for lv in self.levels:
            lv.max_offset = self.view.max_offset(SCHEDULE_TOPIC, lv.queue_id)
        written = self.view.written.get()           # after the queues, and after the predecessor's batch landed
        reader = self.view.fresh_reader()
        for lv in self.levels:
            if lv.offset > lv.max_offset:
                self.log.warning("delay level %d: offset %d is past the queue's end %d", lv.level, lv.offset,
                                 lv.max_offset)
                lv.offset = lv.cursor = lv.max_offset
            first = reader.min_offset(SCHEDULE_TOPIC, lv.queue_id, lv.max_offset) if lv.max_offset else 0
            if lv.offset < first:
                lv.offset = lv.cursor = first
        if self._scan_from < written:
            found = await self._count_copies(self._scan_from, written, reader)
            if found:
                self.log.warning("restart: %d delayed messages had been re-published after the last saved offsets; "
                                 "they are not delivered again", found)
        for lv in self.levels:
            lv.advance()
        state = self._state()
        self.file.save(state)
        self._submitted = state.offsets
        for lv in self.levels:
            lv.persisted = lv.offset
        self._resumed = True

    async def _count_copies(self, start: int, written: int, reader: StoreReader) -> int:
        expected: dict[bytes, list[tuple[Level, int]]] = defaultdict(list)
        now = now_ms()
        for lv in self.levels:
            end = min(lv.max_offset, lv.offset + WINDOW)
            off = lv.offset
            cq = reader.queue(SCHEDULE_TOPIC, lv.queue_id)
            while off < end:
                try:
                    raw = cq.entries(off, end - off, end)
                except OffsetGoneError:
                    break
                if not raw:
                    break
                for phys, size, tags in ENTRY.iter_unpack(raw):
                    if size != HOLE_SIZE and deliver_time(tags, now, lv.delay_ms) <= now:
                        rec = reader.view(phys, written)
                        try:
                            if rec is not None:
                                for copy in timer_copies(rec, tags, self.timer) if lv.timer else [republish(rec).data]:
                                    expected[copy_signature(copy)].append((lv, off))
                        except ScheduleRecordError:
                            pass
                    off += 1
            await asyncio.sleep(0)              # (a window is up to WINDOW digests)
        if not expected:
            return 0
        found = 0
        start = max(start, reader.refresh())
        walk = reader.commitlog.walk(start, written)
        try:
            for n, (phys, mm, rel, size) in enumerate(walk):
                _, topic, _, _, _, _, props = peek_head(mm, rel)
                if is_copy_candidate(topic, props):
                    waiting = expected.get(copy_signature(memoryview(mm)[rel:rel + size]))
                    while waiting:
                        lv, off = waiting.pop(0)
                        if off not in lv.beyond:        # (an entry with two possible copies made one)
                            lv.beyond[off] = phys
                            found += 1
                            break
                if n % 4096 == 4095:
                    await asyncio.sleep(0)      # heartbeats go on during a long walk
        except (CorruptRecordError, OffsetGoneError) as exc:
            self.log.error("restart: the CommitLog walk for re-published copies stopped at %d: %s", walk.position, exc)
        return found

    # ---- faults (tests) -------------------------------------------------------------------------------------------
    def _fault(self, step: str) -> None:
        """Testing: `schedule_fault_file` holds "<step> kill|stop"; at that step this process
        SIGKILLs or SIGSTOPs itself (once: the file is removed)."""
        if not self.fault_file:
            return
        try:
            with open(self.fault_file) as f:
                want, _, action = f.read().strip().partition(" ")
        except FileNotFoundError:
            return
        if want != step:
            return
        os.unlink(self.fault_file)
        self.log.warning("fault injection: %s at %s", action, step)
        os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)

    # ---- stop -----------------------------------------------------------------------------------------------------
    async def stop(self) -> None:
        """Finish the batch in flight (commit stops after us), then save the final offsets."""
        if self._persist_task is not None:
            await asyncio.gather(self._persist_task, return_exceptions=True)
        deadline = time.monotonic() + 5.0
        while self._flight and time.monotonic() < deadline:
            got = self.done.read()
            if got:
                self._on_completions(got)
                self.done.release()
            else:
                await wait_any([self.done], self.bell, 0.1)
        if self.sync_flush and self.view.flushed.get() < self._ends:
            self.log.warning("stopping before the last re-published messages were flushed: a restart counts them")
        elif not self._flight and self._resumed:
            for lv in self.levels:
                lv.advance()
            self.file.save(self._state())
        self.reader.close()
        profiling.dump(self._profile, self.name)
