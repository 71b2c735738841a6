"""The dispatch actor: the only writer of ConsumeQueue and index files.

It follows commitlog.written (woken by commit's doorbell, with a periodic safety check) and
runs Dispatcher.dispatch over [dispatched, written) in bounded rounds. After each round it
publishes the queues' new max offsets in the board's queue table, its last store timestamp
(the checkpoint's logics time), then commitlog.dispatched, and tells the hold actor in one
ring record which queues got messages. A restarted dispatch resumes from commitlog.dispatched
(dispatching a range again is harmless).
"""

from __future__ import annotations

import asyncio
import time

from smartgo.actors.actor import Actor
from smartgo.actors.ring import PRODUCER, full_fence
from smartgo.broker import profiling, recovery
from smartgo.broker.bells import FlagBell, sleep_flagged
from smartgo.broker.rings import SMALL_RING_CAPACITY, arrivals_record, monotonic_ms
from smartgo.broker.schedule.schedule_message import idle_bit
from smartgo.broker.settings import SCHEDULE, store_config
from smartgo.store import (
    CommitLogReader, ConsumeQueueSet, Dispatcher, DiskFullError, IndexService, OffsetGoneError, queue_ends,
)
from smartgo.store.lazy_numpy import load as load_numpy
from smartgo.store.record import SCHEDULE_TOPIC

ROUND_RECORDS = 20_000     # bounds one round (~tens of ms) so the heartbeat keeps beating during a catch-up
ROUND_SECONDS = 0.25       # and so does this, when records are costly (new queues, files mapped again)
SAFETY_CHECK = 1.0         # seconds: the longest sleep without looking at the written position
PACE = 0.001               # seconds between rounds while there is work (coalesces commit's batches)
PACE_UNWATCHED = 0.01      # ... and while no consumer follows the head (no pull woken for an arrival lately)
FOLLOWING_MS = 1000        # a pull woken for an arrival this recently: consumers follow the head


class DispatchActor(Actor):
    async def start(self) -> None:
        self._profile = profiling.start(self.name)
        load_numpy()                # the columnar path's, now: its import (~0.1 s) would delay the first round
        cfg = store_config(self.config)
        b = self.board
        self.written = b.scalar("commitlog.written")
        self.dispatched = b.scalar("commitlog.dispatched", writer=self.name)
        self.store_ts = b.scalar("dispatch.store_ts", writer=self.name)
        self.sleeping = b.scalar("dispatch.sleeping", writer=self.name)
        self.table = b.queues.writer_handle(self.name)
        self.store_root = cfg.root
        recovered = recovery.load(self.ctx.run_path)
        # A first incarnation takes each queue's end from recovery; a later one reads them from the files.
        known = queue_ends.take(self.ctx.run_path, recovered.written)
        self.queues = ConsumeQueueSet(cfg.consume_queue_dir, cfg.consume_queue_file_size, cfg.mapped_queue_files,
                                      known if self.dispatched.get() <= recovered.written else None)
        self.index = (IndexService(cfg.index_dir, cfg.index_slot_count, cfg.index_entry_count,
                                   release_interval=cfg.release_interval_bytes)
                      if cfg.message_index_enable else None)
        self.commitlog = CommitLogReader(cfg.commitlog_dir, cfg.commitlog_file_size)
        self.dispatcher = Dispatcher(self.commitlog, self.queues, self.index, cfg.delay_levels_ms,
                                     cfg.release_interval_bytes)
        self.position = max(self.dispatched.get(), recovered.written)
        for (topic, queue_id), max_offset in self.queues.max_offsets().items():
            self.table.set(topic, queue_id, max_offset)
        self.dispatched.set(self.position)
        self.arrive = self.ring("arrive", PRODUCER, SMALL_RING_CAPACITY)
        self.hold_watching = b.scalar("hold.watching")
        # New entries in a delay level the schedule actor sleeps through (its board word
        # schedule.idle has bit level-1 set) wake it; other levels have a head it times itself.
        self._schedule_queues = {(SCHEDULE_TOPIC, q) for q in range(len(cfg.delay_levels_ms))}
        self._schedule_mask = 0
        self.schedule_bell = FlagBell(b, self.ctx.run_path, SCHEDULE, "schedule.idle",
                                      lambda idle: bool(idle & self._schedule_mask))
        self.spawn(self._run(), "loop")

    async def _run(self) -> None:
        """A round as soon as commit rings; while rounds keep finding work, the next one comes
        PACE later instead (what RocketMQ's ReputMessageService does): under load commit then
        never rings, and each round takes everything that arrived meanwhile. While no parked pull
        was woken for an arrival lately (the hold actor's `hold.woken_ms`: no consumer follows the
        head) PACE_UNWATCHED: rounds of ~10 records a sync producer's pace cost ~9 µs a record,
        rounds of a few hundred ~3. A consumer that catches up parks, and the next round (at most
        PACE_UNWATCHED away) wakes it and brings the pace back to PACE."""
        written = self.written
        woken_ms = self.board.scalar("hold.woken_ms")
        while True:
            if written.get() > self.position:
                try:
                    self.round(written.get())
                except DiskFullError as exc:
                    self.log.error("dispatch waits for disk space: %s", exc)
                    await asyncio.sleep(1.0)
                except OffsetGoneError:
                    self._skip_to_first_file()
                following = monotonic_ms() - woken_ms.get() < FOLLOWING_MS
                await asyncio.sleep(PACE if following else PACE_UNWATCHED)
            else:
                await sleep_flagged(self.bell, self.sleeping, lambda: written.get() > self.position, SAFETY_CHECK)

    def _skip_to_first_file(self) -> None:
        """The CommitLog starts past our position (a new slave's copy starts at the master's
        oldest file): go on from its first file, as 4.x's ReputMessageService does."""
        first = self.commitlog.min_offset()
        if first <= self.position:
            raise OffsetGoneError("commitlog", self.position)
        self.log.warning("the CommitLog starts at %d, past %d: dispatching from there", first, self.position)
        self.position = first
        self.dispatched.set(first)

    def round(self, bound: int) -> None:
        rnd = self.dispatcher.dispatch(self.position, bound, ROUND_RECORDS, time.monotonic() + ROUND_SECONDS)
        for (topic, queue_id), max_offset in rnd.changed.items():
            self.table.set(topic, queue_id, max_offset)
        if rnd.records:
            self.store_ts.set(rnd.last_store_timestamp)
        self.position = rnd.position
        self.dispatched.set(rnd.position)              # after the queue table: readers bound by it see entries
        if rnd.changed:
            full_fence()                                # the table before hold.watching (see hold_actor)
            if self.hold_watching.get():
                self.arrive.try_write([arrivals_record(rnd.changed)])   # full (hold down): its re-check covers it
            delayed = rnd.changed.keys() & self._schedule_queues
            if delayed:
                mask = 0
                for _, queue_id in delayed:
                    mask |= idle_bit(queue_id)
                self._schedule_mask = mask
                self.schedule_bell.ring()

    async def stop(self) -> None:
        try:                                            # (the loop was cancelled before stop())
            while self.written.get() > self.position:       # commit stopped before us: finish its tail
                self.round(self.written.get())
            # for the next start, if this stop is clean (the flush actor decides: smartgo.store.queue_ends)
            try:
                queue_ends.save(self.store_root, self.position, self.queues.max_offsets())
            except OSError as exc:
                self.log.warning("queue ends not saved (%s): the next start reads every queue's last file", exc)
        finally:
            if self.index is not None:
                self.index.close()
            self.queues.close()
            self.commitlog.close()
            profiling.dump(self._profile, self.name)
