"""The cleanup actor: file retention and disk watermarks (RocketMQ's CleanCommitLogService).

Every cleanup_interval (10 s) it measures the store's disk usage and decides (CleanupPolicy,
a pure function of the settings, the clock and the usage, so tests inject both):

- usage >= disk_full_ratio (90 %): raise flag.disk_full (sends are refused, pulls go on) and
  delete the oldest CommitLog files whatever their age; the flag drops again once usage is at
  or below disk_force_clean_ratio (85 %), as RocketMQ's runningFlags do;
- usage > disk_force_clean_ratio: delete the oldest files whatever their age;
- usage > disk_max_used_ratio (75 %), or the hour is one of delete_when ("04"): delete files
  older than file_reserved_hours (72 h);

at most cleanup_max_files (10) files a pass, never the newest file. Then commitlog.min is published
(net actors then refresh their readers), and ConsumeQueue and index files that only point below it
go too, the queues QUEUE_SLICE at a time with the loop turning between (clean_queues).

An operator can ask for a pass now (the broker actor counts the requests on the board, this
actor serves them within REQUEST_POLL): DELETE_EXPIRED_COMMITLOG deletes the files older than
file_reserved_hours whatever the hour (5.x's executeDeleteFilesManually), CLEAN_EXPIRED_CONSUMEQUEUE
the ConsumeQueue and index files below the CommitLog minimum.

It also runs the background scrub: flushed CommitLog data checked for rot at scrub_rate_mb,
damage logged and listed for the next start to repair (smartgo.store.damage.ScrubCursor).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from smartgo.actors.actor import Actor, ActorContext
from smartgo.broker.settings import store_config
from smartgo.config import NodeConfig
from smartgo.store import StoreConfig
from smartgo.store.cleanup import (delete_commitlog_before, delete_index_before, delete_queue_files_before,
                                   expired_commitlog_files)
from smartgo.store.commitlog import CommitLogReader
from smartgo.store.consume_queue import list_queues
from smartgo.store.damage import SCRUB_STEP, ScrubCursor
from smartgo.store.mapped_file import segment_starts


def statvfs_usage(path: str) -> float:
    """Used fraction of the file system holding path, as df's Use% (and psutil's percent) count it:
    used / (used + available to a non-root writer). The blocks reserved for root count as neither:
    against f_blocks a file system reserving much read 69 % where df said 27 %."""
    st = os.statvfs(path)
    used = st.f_blocks - st.f_bfree
    room = used + st.f_bavail
    return 0.0 if room <= 0 else used / room


def file_usage(path: str) -> Callable[[str], float]:
    """Testing: the usage is whatever number the file holds (0 when it is missing or garbled). An
    empty file is a test rewriting it (write_text truncates first): the last reading stands."""
    last = 0.0

    def read(_store: str) -> float:
        nonlocal last
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                last = float(text)
            return last
        except (OSError, ValueError):
            return 0.0
    return read


@dataclass(frozen=True, slots=True)
class Decision:
    usage: float
    disk_full: bool
    delete: bool          # delete something this pass
    force: bool           # regardless of age


class CleanupPolicy:
    def __init__(self, config: NodeConfig, clock: Callable[[], int], usage: Callable[[str], float]) -> None:
        self.full = config.disk_full_ratio / 100
        self.force_clean = config.disk_force_clean_ratio / 100
        self.max_used = config.disk_max_used_ratio / 100
        self.hours = {int(h) for h in config.delete_when.replace(",", ";").split(";") if h.strip().isdigit()}
        self.clock = clock
        self.usage = usage
        self.disk_full = False

    def decide(self, store_path: str) -> Decision:
        used = self.usage(store_path)
        if used >= self.full:
            self.disk_full = True
        elif used <= self.force_clean:
            self.disk_full = False
        force = used > self.force_clean
        hour = time.localtime(self.clock() / 1000).tm_hour
        return Decision(used, self.disk_full, force or used > self.max_used or hour in self.hours, force)


def clean(store: StoreConfig, decision: Decision, now_ms: int, max_files: int) -> int:
    """One pass of CommitLog deletions; returns the CommitLog minimum afterwards."""
    if decision.delete:
        starts = expired_commitlog_files(store, now_ms, force=decision.force, max_files=max_files)
        if starts:
            delete_commitlog_before(store, starts[-1] + store.commitlog_file_size)
    left = segment_starts(store.commitlog_dir)
    return left[0] if left else 0


QUEUE_SLICE = 0.02          # s of queue cleanup between turns of the actor's loop


async def clean_queues(store: StoreConfig, minimum: int, slice_s: float = QUEUE_SLICE) -> tuple[int, int]:
    """ConsumeQueue and index files that only point below the CommitLog minimum; (queue files,
    index files) deleted. The queues go slice_s at a time, the loop (and its heartbeat) turning
    between slices: in one go a pass over 10,136 queues held the loop 0.3-3.4 s, and once past
    the heartbeat deadline (the supervisor killed the actor as hung)."""
    deleted = 0
    until = time.monotonic() + slice_s
    for key in list_queues(store.consume_queue_dir):
        deleted += delete_queue_files_before(store, key, minimum)
        if time.monotonic() >= until:
            await asyncio.sleep(0)
            until = time.monotonic() + slice_s
    return deleted, len(delete_index_before(store, minimum))


REQUEST_POLL = 0.2          # s between looks at the board's request counters
MANUAL_PASSES = 20          # 5.x's MAX_MANUAL_DELETE_FILE_TIMES: passes of cleanup_max_files each, at most


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class CleanupActor(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        cfg = ctx.config
        usage = file_usage(cfg.disk_usage_file) if cfg.disk_usage_file else statvfs_usage
        self.policy = CleanupPolicy(cfg, _now_ms, usage)
        self.every(cfg.cleanup_interval, self.run_pass)
        self.every(REQUEST_POLL, self.serve_requests)
        self.passing = asyncio.Lock()       # a pass yields to the loop between queue slices: one at a time

    async def start(self) -> None:
        self.store = store_config(self.config)
        b = self.board
        self.disk_full = b.scalar("flag.disk_full", writer=self.name)
        self.usage = b.scalar("disk.used_permille", writer=self.name)
        self.minimum = b.scalar("commitlog.min", writer=self.name)
        # the requests the broker actor counts on the board (cleanup_processor.KINDS), and how each is served
        self.asked = [(b.scalar(f"cleanup.{kind}_asked"), b.scalar(f"cleanup.{kind}_done", writer=self.name), serve)
                      for kind, serve in (("commitlog", self._delete_expired), ("queues", self._clean_queues))]
        self.minimum.set(clean(self.store, Decision(0.0, False, False, False), 0, 0))
        if self.config.scrub_rate_mb > 0:
            self.spawn(self._scrub(), "scrub")

    async def _scrub(self) -> None:
        """Background scrub passes (damage.ScrubCursor) at scrub_rate_mb, below what is both
        flushed and dispatched (dispatch meets damage in newer data itself)."""
        cfg = self.config
        b = self.board
        flushed, dispatched = b.scalar("commitlog.flushed"), b.scalar("commitlog.dispatched")
        found = b.scalar("scrub.damaged", writer=self.name)
        rate = cfg.scrub_rate_mb * (1 << 20)
        cursor = ScrubCursor(self.store.root, CommitLogReader(self.store.commitlog_dir, self.store.commitlog_file_size))
        await asyncio.sleep(cfg.scrub_delay)
        while True:
            began = time.monotonic()
            cursor.start_pass(self.minimum.get())
            while True:
                t0 = time.monotonic()
                done = cursor.step(self.minimum.get(), min(flushed.get(), dispatched.get()), SCRUB_STEP)
                if not done:
                    break
                await asyncio.sleep(max(done / rate - (time.monotonic() - t0), 0))
            if cursor.damaged:
                found.set(found.get() + len(cursor.damaged))
            self.log.info("background scrub pass: %d records checked in %.0fs, %d damaged ranges", cursor.records,
                          time.monotonic() - began, len(cursor.damaged))
            await asyncio.sleep(max(cfg.scrub_interval - (time.monotonic() - began), 0))

    async def run_pass(self) -> None:
        d = self.policy.decide(str(self.store.store_path))
        self.usage.set(int(d.usage * 1000))
        if bool(self.disk_full.get()) != d.disk_full:
            if d.disk_full:
                self.log.error("disk %.1f%% full (>= %d%%): refusing sends until it drops to %d%%", d.usage * 100,
                               self.config.disk_full_ratio, self.config.disk_force_clean_ratio)
            else:
                self.log.warning("disk %.1f%% full: accepting sends again", d.usage * 100)
            self.disk_full.set(int(d.disk_full))
        await self._clean(d)

    async def _clean(self, d: Decision, queues: bool = True) -> bool:
        """One pass (the queues too unless told); True when the CommitLog minimum moved."""
        async with self.passing:
            before = self.minimum.get()
            minimum = clean(self.store, d, self.policy.clock(), self.config.cleanup_max_files)
            if minimum != before:
                self.log.info("CommitLog minimum moved from %d to %d", before, minimum)
                self.minimum.set(minimum)
            if queues and d.delete and minimum:
                await clean_queues(self.store, minimum)
            return minimum != before

    async def serve_requests(self) -> None:
        for asked, done, serve in self.asked:
            if (n := asked.get()) != done.get():
                await serve()
                done.set(n)

    async def _delete_expired(self) -> None:
        """DELETE_EXPIRED_COMMITLOG: files past file_reserved_hours, whatever the hour."""
        d = Decision(self.usage.get() / 1000, bool(self.disk_full.get()), True, False)
        before = self.minimum.get()
        for _ in range(MANUAL_PASSES):
            if not await self._clean(d, queues=False):
                break
            await asyncio.sleep(0)          # the heartbeat runs between passes
        await self._clean_queues_below()    # once, after the CommitLog passes
        self.log.info("expired CommitLog files deleted as asked (DELETE_EXPIRED_COMMITLOG): minimum %d -> %d",
                      before, self.minimum.get())

    async def _clean_queues_below(self) -> tuple[int, int, int]:
        """The queue and index files below the published minimum: (minimum, queue files, index files)."""
        async with self.passing:
            minimum = self.minimum.get()
            return (minimum, *await clean_queues(self.store, minimum)) if minimum else (0, 0, 0)

    async def _clean_queues(self) -> None:
        """CLEAN_EXPIRED_CONSUMEQUEUE."""
        minimum, queues, index = await self._clean_queues_below()
        self.log.info("CLEAN_EXPIRED_CONSUMEQUEUE: %d ConsumeQueue and %d index files below the CommitLog "
                      "minimum %d deleted", queues, index, minimum)
