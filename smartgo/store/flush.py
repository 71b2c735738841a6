"""Flushing from any process: msync through this process's own read-write mapping.

msync on a shared file mapping writes back the file's dirty pages in that range whoever
dirtied them, so the flush actor needs no help from the writers; it only needs the
published positions (written position, per-queue max offsets).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from smartgo.store.config import CQ_UNIT, MAPPED_QUEUE_FILES, PAGE_SIZE, round_up_to_unit
from smartgo.store.consume_queue import QueueKey, queue_dir
from smartgo.store.mapped_file import MappedFileQueue, MappingLimit


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
    """Flushes one directory of segments (the CommitLog, or one ConsumeQueue) up to a position."""

    def __init__(self, directory: Path | str, file_size: int, flushed: int = 0, limit: MappingLimit | None = None):
        self.files = MappedFileQueue(directory, file_size, writable=True, limit=limit)
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


class ConsumeQueueFlusher:
    """Flushes every ConsumeQueue up to its published max offset."""

    def __init__(self, root: Path | str, file_size: int, flushed: Mapping[QueueKey, int] | None = None,
                 mapped_files: int = MAPPED_QUEUE_FILES):
        self.root = Path(root)
        self.file_size = round_up_to_unit(file_size)
        self.limit = MappingLimit(mapped_files)
        self._queues: dict[QueueKey, SegmentFlusher] = {}
        for key, offset in (flushed or {}).items():
            self._flusher(key).flushed = offset * CQ_UNIT

    def _flusher(self, key: QueueKey) -> SegmentFlusher:
        f = self._queues.get(key)
        if f is None:
            f = self._queues[key] = SegmentFlusher(queue_dir(self.root, *key), self.file_size, limit=self.limit)
        return f

    def flush(self, max_offsets: Mapping[QueueKey, int], least_pages: int = 0) -> int:
        """Flush each queue's [flushed, max offset); returns how many queues were flushed."""
        done = 0
        for key, offset in max_offsets.items():
            f = self._flusher(key)
            before = f.flushed
            if f.flush(offset * CQ_UNIT, least_pages) != before:
                done += 1
        return done

    def close(self) -> None:
        for f in self._queues.values():
            f.close()
        self._queues.clear()
