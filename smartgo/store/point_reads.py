"""Point reads: a few bytes at scattered offsets of cold store files, without read-around.

A query by key reads one CommitLog record per index hit, and a search by time bisects a
ConsumeQueue, reading an entry and a record header a step. On a backlog larger than the page
cache these pages are cold, and the first touch of a mapped page faults in ``read_ahead_kb``
around it (8 MiB on a virtio disk: one query read 100-200 MiB for a few KiB it needed).
pread on a descriptor advised POSIX_FADV_RANDOM reads just the pages it covers. The
descriptors live for one lookup (a context manager), so a file that cleanup deletes never
keeps its space; the pull path keeps its mappings and their read-ahead.
"""

from __future__ import annotations

import os
from types import TracebackType

from smartgo.store.config import CQ_UNIT, PAGE_SIZE
from smartgo.store.consume_queue import ENTRY
from smartgo.store.errors import CorruptRecordError, OffsetGoneError
from smartgo.store.mapped_file import MappedFileQueue
from smartgo.store.record import FIXED_SIZE, MESSAGE_MAGIC, POS_STORETIMESTAMP, SIZE_MAGIC, store_timestamp_at

STORE_TIME_SPAN = POS_STORETIMESTAMP + 12 + 8  # STORETIMESTAMP's end after an IPv6 born host (< FIXED_SIZE)


class PointReads:
    """pread over the segments of one directory (a MappedFileQueue's), descriptors opened on demand."""

    def __init__(self, files: MappedFileQueue):
        self.files = files
        self.file_size = files.file_size
        self._fds: dict[int, int] = {}

    def read(self, offset: int, size: int) -> bytes:
        """size bytes at offset, within one segment: OffsetGoneError if its file is gone,
        CorruptRecordError if it ends before them."""
        start = offset - offset % self.file_size
        fd = self._fds.get(start)
        if fd is None:
            try:
                fd = os.open(self.files.path_of(start), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise OffsetGoneError(str(self.files.directory), offset) from None
            self._fds[start] = fd
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        data = os.pread(fd, size, offset - start)
        if len(data) < size:
            raise CorruptRecordError(f"file ends within [{offset}, {offset + size})", offset)
        return data

    def record(self, offset: int, bound: int) -> bytes:
        """The whole CommitLog record at offset, below bound: the pages it covers are read, no
        more. CorruptRecordError if no record starts there."""
        rel = offset % self.file_size
        limit = min(self.file_size, bound - (offset - rel))
        if rel + FIXED_SIZE > limit:
            raise CorruptRecordError("no record within the bound", offset)
        head = self.read(offset, min(max(PAGE_SIZE - offset % PAGE_SIZE, FIXED_SIZE), limit - rel))
        size, magic = SIZE_MAGIC.unpack_from(head)
        if magic != MESSAGE_MAGIC or size < FIXED_SIZE or rel + size > limit:
            raise CorruptRecordError("no record starts here", offset)
        return head[:size] if size <= len(head) else head + self.read(offset + len(head), size - len(head))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> PointReads:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def store_time(entries: PointReads, records: PointReads, offset: int, written: int) -> int:
    """Store time of a queue's message at offset (entries: its ConsumeQueue, records: the CommitLog)."""
    phys, size, _ = ENTRY.unpack(entries.read(offset * CQ_UNIT, CQ_UNIT))
    if phys + size > written or phys % records.file_size + size > records.file_size or size < FIXED_SIZE:
        raise CorruptRecordError("consume queue entry points past the written position", phys)
    return store_timestamp_at(records.read(phys, STORE_TIME_SPAN), 0)
