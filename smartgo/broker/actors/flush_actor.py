"""The flush actor: durability of the mapped files, and the checkpoint.

CommitLog, async flush (default): every flush_interval (500 ms) msync [flushed, written) when at
least flush_least_pages (4) pages are dirty, any dirty byte every flush_thorough_interval (10 s).
Sync flush (group commit): commit rings this actor's doorbell after each batch it appends; each
round msyncs everything written so far, publishes commitlog.flushed and rings the doorbell of
every net actor whose board word `<net>.flush_wait` (the lowest end offset its waiting sends
need) the round has reached - one wake per net actor per round, whatever the number of sends.

ConsumeQueues and index, every cq_flush_interval (1 s; 2 pages, any byte every 60 s): the
queues up to the max offsets on the board (fdatasync of the files written, many at once, each
queue counted on the progress counter: a stop flushing thousands is slow, not hung, and the
supervisor waits for it past shutdown_timeout), the newest index files; then the checkpoint.

Checkpoint order (it only ever covers flushed data): physic = commit's store timestamp read
*before* the written position that round flushes; logics = dispatch's last store timestamp read
*before* the queue table flushed; index = the newest index file's end time read before its
msync; the checkpoint page itself is msynced after the queue/index round. The msyncs of the
periodic rounds run in a worker thread so a slow disk never stalls the heartbeat.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from smartgo.actors.actor import Actor, ActorContext
from smartgo.broker import recovery
from smartgo.broker.bells import FlagBell, sleep_flagged
from smartgo.broker.settings import commitlog_writer, store_config
from smartgo.store import Checkpoint, ConsumeQueueFlusher, FlushPolicy, SegmentFlusher, mark_clean_shutdown
from smartgo.store.index_file import HEADER, list_index_files
from smartgo.store.mapped_file import MappedFile


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class IndexFlusher:
    """msyncs the two newest index files (a rolled file gets its final header after its last
    flush here) through this process's own read-write maps."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[str, MappedFile] = {}

    def flush(self) -> int:
        """Returns the index timestamp the flush covers (0: no index yet)."""
        names = list_index_files(self.directory)[-2:]
        for gone in set(self._files) - set(names):
            self._files.pop(gone).close()
        ts = 0
        for name in reversed(names):
            mf = self._files.get(name)
            if mf is None:
                path = self.directory / name
                try:
                    mf = self._files[name] = MappedFile(path, 0, path.stat().st_size, writable=True)
                except FileNotFoundError:
                    continue
            if not ts:
                ts = HEADER.unpack_from(mf.mm, 0)[1]      # the end time, read before the msync
            mf.flush(0, mf.size)
        return ts

    def close(self) -> None:
        for mf in self._files.values():
            mf.close()
        self._files.clear()


class FlushActor(Actor):
    def __init__(self, ctx: ActorContext, *, nets: list[str]) -> None:
        super().__init__(ctx)
        self.nets = nets
        self.sync = ctx.config.flush == "sync"
        self._cl_lock = threading.Lock()
        self._cq_lock = threading.Lock()

    async def start(self) -> None:
        cfg = self.store = store_config(self.config)
        b = self.board
        self.written = b.scalar("commitlog.written")
        self.store_ts = b.scalar("commitlog.store_ts")
        self.dispatch_ts = b.scalar("dispatch.store_ts")
        self.flushed = b.scalar("commitlog.flushed", writer=self.name)
        self.sleeping = b.scalar("flush.sleeping", writer=self.name)
        rec = recovery.load(self.ctx.run_path)
        # First life of the node: msync the recovered tail's file once (recovery wrote into the
        # page cache only), so `flushed` starts true.
        start = self.flushed.get() or rec.written - rec.written % cfg.commitlog_file_size
        self.commitlog = SegmentFlusher(cfg.commitlog_dir, cfg.commitlog_file_size, start)
        self.queues = ConsumeQueueFlusher(cfg.consume_queue_dir, cfg.consume_queue_file_size,
                                          progress=self.progress_cell())
        self.index = IndexFlusher(cfg.index_dir)
        self.checkpoint = Checkpoint(cfg.checkpoint_path)
        self.policy = FlushPolicy(cfg.flush_commitlog_least_pages, cfg.flush_commitlog_thorough_interval_ms)
        self.cq_policy = FlushPolicy(cfg.flush_consume_queue_least_pages, cfg.flush_consume_queue_thorough_interval_ms)
        self.net_bells = [FlagBell(b, self.ctx.run_path, net, f"{net}.flush_wait",
                                   lambda w: 0 < w <= self.commitlog.flushed) for net in self.nets]
        self.flush_commitlog(0)
        self.spawn(self._commitlog_loop(), "commitlog")
        self.spawn(self._queues_loop(), "queues")

    # ---- CommitLog ---------------------------------------------------------------------------------
    async def _commitlog_loop(self) -> None:
        interval = self.config.flush_interval
        if self.sync:
            written, flusher = self.written, self.commitlog
            while True:
                await sleep_flagged(self.bell, self.sleeping, lambda: written.get() > flusher.flushed, interval)
                self.flush_commitlog(0)
        while True:
            await asyncio.sleep(interval)
            await asyncio.to_thread(self.flush_commitlog, self.policy.pages_now(_now_ms()))

    def flush_commitlog(self, least_pages: int) -> None:
        """One CommitLog round (on the loop, or in a worker thread: the lock keeps rounds apart)."""
        with self._cl_lock:
            ts = self.store_ts.get()            # read before the position: never newer than what is flushed
            before = self.commitlog.flushed
            flushed = self.commitlog.flush(self.written.get(), least_pages)
            if flushed == before and self.flushed.get():
                return
            self.flushed.set(flushed)
            if ts:
                self.checkpoint.physic_timestamp = ts
            self.checkpoint.physic_offset = flushed
            for bell in self.net_bells:
                bell.ring()

    # ---- ConsumeQueues, index, checkpoint ---------------------------------------------------------------
    async def _queues_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.cq_flush_interval)
            await asyncio.to_thread(self.flush_queues, self.cq_policy.pages_now(_now_ms()))

    def flush_queues(self, least_pages: int) -> None:
        with self._cq_lock:
            logics_ts = self.dispatch_ts.get()  # before the table: every entry up to it is in the table
            offsets = {(topic, qid): v["max_offset"] for topic, qid, v in self.board.queues.items()}
            self.queues.flush(offsets, least_pages)
            index_ts = self.index.flush()
            if logics_ts:
                self.checkpoint.logics_timestamp = logics_ts
            if index_ts:
                self.checkpoint.index_timestamp = index_ts
            self.checkpoint.flush()

    async def stop(self) -> None:
        self.flush_commitlog(0)                 # the loops were cancelled; a round still in a thread ends first
        self.flush_queues(0)
        b = self.board
        clean = (not b.actor_running(commitlog_writer(self.config)) and not b.actor_running("dispatch")
                 and b.get("commit.intent") == 0
                 and b.get("commitlog.dispatched") == b.get("commitlog.written") == self.commitlog.flushed)
        if clean:
            self.checkpoint.mark_clean(self.commitlog.flushed)
            mark_clean_shutdown(self.store.store_path)
            self.log.info("clean shutdown: everything written is flushed (abort file removed)")
        else:
            self.log.warning("stopping without a clean store (the next start runs abnormal recovery)")
        self.commitlog.close()
        self.queues.close()
        self.index.close()
        self.checkpoint.close()
