"""Flushing from any process: msync through this process's own read-write mapping (the CommitLog),
fdatasync of the files (the ConsumeQueues).

Either writes back the file's dirty pages whoever dirtied them, so the flush actor needs no help
from the writers; it only needs the published positions (written position, per-queue max offsets).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from smartgo.store.config import CQ_UNIT, PAGE_SIZE, round_up_to_unit
from smartgo.store.consume_queue import QueueKey, queue_dir
from smartgo.store.mapped_file import MappedFileQueue, segment_name


class FlushPolicy:
    """RocketMQ's rule: flush only when at least least_pages dirty pages piled up, except
    once per thorough interval, when any dirty byte is flushed."""

    def __init__(self, least_pages: int, thorough_interval_ms: int):
        self.least_pages = least_pages
        self.thorough_interval_ms = thorough_interval_ms
        self._last_thorough = 0

    def pages_now(self, now_ms: int) -> int:
        if now_ms - self._last_thorough >= self.thorough_interval_ms:
            self._last_thorough = now_ms
            return 0
        return self.least_pages


class SegmentFlusher:
    """Flushes one directory of segments (the CommitLog) up to a position."""

    def __init__(self, directory: Path | str, file_size: int, flushed: int = 0):
        self.files = MappedFileQueue(directory, file_size, writable=True)
        self.flushed = flushed

    def flush(self, upto: int, least_pages: int = 0) -> int:
        """msync [flushed, upto) if at least least_pages pages are dirty (any, when 0);
        returns the new flushed position."""
        if upto <= self.flushed:
            return self.flushed
        if least_pages > 0 and upto // PAGE_SIZE - self.flushed // PAGE_SIZE < least_pages:
            return self.flushed
        self.files.flush(self.flushed, upto)
        self.files.forget_before(upto)
        self.flushed = upto
        return upto

    def close(self) -> None:
        self.files.close()


SYNC_THREADS = 16       # fdatasyncs in flight at once


def sync_files(paths: list[Path]) -> None:
    """fdatasync each file; one deleted meanwhile (cleanup) has nothing left to flush."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)


class ConsumeQueueFlusher:
    """Flushes every ConsumeQueue up to its published max offset: fdatasync of the files its new
    entries are in, SYNC_THREADS at once.

    fdatasync writes back what any process dirtied through its mapping (Linux's msync(MS_SYNC) is
    the same fsync of the file's range), so nothing is mapped here and nothing is left to unmap at
    a stop. One after another, each sync of a freshly filled sparse file paid its own journal
    commit: 2.5 ms on a busy disk, 6.5 s for 2,555 dirty queues and past shutdown_timeout at 10,000;
    in flight together they share commits (ext4 commits once for all its waiters)."""

    def __init__(self, root: Path | str, file_size: int, flushed: Mapping[QueueKey, int] | None = None,
                 threads: int = SYNC_THREADS, progress: memoryview | None = None):
        self.root = Path(root)
        self.file_size = round_up_to_unit(file_size)
        self._flushed = {key: offset * CQ_UNIT for key, offset in (flushed or {}).items()}
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="cq-flush")
        self.progress = progress        # a counter bumped per queue flushed (the actor's progress cell)

    def flush(self, max_offsets: Mapping[QueueKey, int], least_pages: int = 0) -> int:
        """Flush each queue's [flushed, max offset); returns how many queues were flushed."""
        fs = self.file_size
        due = []
        for key, offset in max_offsets.items():
            upto, begin = offset * CQ_UNIT, self._flushed.get(key, 0)
            if upto <= begin or least_pages > 0 and upto // PAGE_SIZE - begin // PAGE_SIZE < least_pages:
                continue
            directory = queue_dir(self.root, *key)
            paths = [directory / segment_name(start) for start in range(begin - begin % fs, upto, fs)]
            due.append((key, upto, self._pool.submit(sync_files, paths)))
        for key, upto, synced in due:
            synced.result()
            self._flushed[key] = upto
            if self.progress is not None:
                self.progress[0] += 1
        return len(due)

    def close(self) -> None:
        self._pool.shutdown()
