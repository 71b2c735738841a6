"""Fixed-size memory-mapped segment files named by their 20-digit start offset.

A MappedFileQueue is one directory of segments (the CommitLog, one ConsumeQueue). Every
process maps the files it needs on its own, lazily, by computing the file name from an
offset, so no directory state is shared: files that appear (a roll) are found on first
use and files that disappear (cleanup) become OffsetGoneError. Only the single writer
creates, fills and truncates; other processes map read-only, or read-write just to msync.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from smartgo.store.config import PAGE_SIZE
from smartgo.store.errors import DiskFullError, OffsetGoneError

log = logging.getLogger(__name__)

NAME_WIDTH = 20
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def segment_name(offset: int) -> str:
    return f"{offset:0{NAME_WIDTH}d}"


def segment_starts(directory: Path) -> list[int]:
    """Start offsets of the segment files in directory, ascending (temp files ignored)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if len(n) == NAME_WIDTH and n.isdigit())


def _reserve(fd: int, size: int, path: str, written: int = 0, sparse: bool = False) -> None:
    """Give the file real blocks now, so a full disk is an error here rather than a SIGBUS
    on a later store through the mapping; then write zeros over its first `written` bytes
    (zero_fill says why). A sparse file gets blocks only for those bytes: its writer then
    zero_fills every range before storing into it (keep_warm)."""
    try:
        try:
            if sparse:
                os.ftruncate(fd, size)
            else:
                os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            log.warning("posix_fallocate unsupported for %s (%s); the file stays sparse", path, exc)
            os.ftruncate(fd, size)
        _write_zeros(fd, 0, min(size, written))
    except OSError as exc:
        if exc.errno in _DISK_FULL_ERRNOS:
            raise DiskFullError(path, size, exc) from exc
        raise


def _write_zeros(fd: int, start: int, end: int) -> None:
    while start < end:
        start += os.pwrite(fd, _ZEROS[:min(len(_ZEROS), end - start)], start)


_ZEROS = bytes(1 << 20)
#: How far ahead of its writer a many-files writer (ConsumeQueue) keeps its file written.
WARM_AHEAD = 64 << 10


def zero_fill(path: Path | str, start: int, end: int) -> None:
    """Write zeros over [start, end) of a reserved file through write(2), ahead of stores
    through a mapping.

    On ext4 (dioread_nolock) a store through a mapping that first touches a page of a
    fallocated (unwritten) extent costs 0.15-5 ms when many files are written in turn - the
    ConsumeQueues of a 1,024-queue topic, the index's slot table - against ~5 µs for a page
    already written; write(2) of zeros converts the range for ~0.1 ms per 64 KiB. Only ever
    call it on bytes nothing has stored yet.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            _write_zeros(fd, start, end)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in _DISK_FULL_ERRNOS:           # a sparse file (or no fallocate): the disk is full
            raise DiskFullError(str(path), end - start, exc) from exc
        raise


def keep_warm(mf: MappedFile, end: int, warm_end: int, stores_to: int, ahead: int = WARM_AHEAD) -> int:
    """Make sure the bytes of mf from `end` (its stored size) to `stores_to`, and `ahead`
    beyond, are written with zeros before anything stores into them; bytes before warm_end are
    written already (0: just mapped - then so is the page `end` falls in, which holds entries or
    was cut by truncate). Returns the new warm_end.

    A sparse file (a ConsumeQueue's) has blocks only where this wrote: a full disk is then a
    DiskFullError here, never a SIGBUS on the store."""
    start = max(warm_end, -(-end // PAGE_SIZE) * PAGE_SIZE)
    stop = min(-(-(stores_to + ahead) // PAGE_SIZE) * PAGE_SIZE, mf.size)
    if start < stop:
        zero_fill(mf.path, start, stop)
    return max(stop, end)


def first_hole(path: Path | str) -> int:
    """Where the file's first hole starts (its size when it has none, or when the file system
    cannot tell): bytes from there read as zeros until the next data. Bounds a search for the end
    of a sparse ConsumeQueue's entries to the pages its writer wrote: a binary search over all of a
    6 MB file faulted in pages of zeros all over it, seconds at every start of a node with tens of
    thousands of queues."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def create_segment(path: Path, size: int, written: int = WARM_AHEAD, sparse: bool = False) -> None:
    """Create a reserved file atomically (temp name, then rename): a reader never sees it
    short. Its first `written` bytes are written with zeros (zero_fill); `sparse`: only those
    get blocks now (_reserve), and a MappedFileQueue leaves all of them to its writer."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _reserve(fd, size, str(path), written, sparse)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)


class MappedFile:
    """One mapped segment. Closing only drops references: the kernel unmaps when the last
    memoryview handed out (e.g. to a socket write) is released."""

    __slots__ = ("path", "start", "size", "mm", "view", "writable", "released")

    def __init__(self, path: Path, start: int, size: int, writable: bool, sparse: bool = False):
        self.path = path
        self.start = start
        self.writable = writable
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            actual = os.fstat(fd).st_size
            if writable and actual < size:
                _reserve(fd, size, str(path), sparse=sparse)  # a file a crash or an operator left short
                actual = size
            length = min(actual, size)
            if length == 0:
                raise OffsetGoneError(str(path), start)
            self.mm = mmap.mmap(fd, length, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self.size = length
        self.view = memoryview(self.mm)
        self.released = 0

    def flush(self, begin: int, end: int) -> None:
        """msync [begin, end) of this file (file-relative). Flushes pages dirtied through any
        process's mapping of the file, so a flush process need not be the writer."""
        if end > begin:
            aligned = begin - begin % PAGE_SIZE
            self.mm.flush(aligned, min(end, self.size) - aligned)

    def release(self, upto: int) -> None:
        """Drop [released, upto) from this process's page tables (MADV_DONTNEED). For a shared
        file mapping that keeps the data (dirty pages included) in the page cache."""
        upto -= upto % PAGE_SIZE
        if upto > self.released:
            self.mm.madvise(mmap.MADV_DONTNEED, self.released, upto - self.released)
            self.released = upto

    def release_all(self) -> None:
        """Drop every page of this mapping from RSS, whatever `released` says (the page cache keeps them)."""
        self.mm.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            pass  # views are still out; the mapping goes when they do


class MappingLimit:
    """At most `limit` files mapped at once across the MappedFileQueues that share it (a process's
    ConsumeQueues), the least recently used unmapped first.

    Every mapping holds a descriptor (CPython's mmap keeps a dup of the file's) and, once read or
    written, the page-cache folio it touched in RSS (64 KiB for a ConsumeQueue's warmed head on
    ext4): a process touching tens of thousands of queues would otherwise run out of descriptors
    and hold gigabytes. A file that comes back is mapped again (tens of microseconds). Never fewer
    than MIN_MAPPINGS, so a caller may use one file while mapping another."""

    MIN_MAPPINGS = 16
    __slots__ = ("limit", "_order")

    def __init__(self, limit: int):
        self.limit = max(self.MIN_MAPPINGS, limit)
        self._order: OrderedDict[MappedFile, MappedFileQueue] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def touch(self, mf: MappedFile) -> None:
        self._order.move_to_end(mf)

    def add(self, mf: MappedFile, owner: MappedFileQueue) -> None:
        order = self._order
        order[mf] = owner
        while len(order) > self.limit:
            oldest, queue = order.popitem(last=False)
            queue.forget(oldest.start)

    def discard(self, mf: MappedFile) -> None:
        self._order.pop(mf, None)


class MappedFileQueue:
    """The segments of one directory, mapped on demand in this process (within `limit` if given)."""

    def __init__(self, directory: Path | str, file_size: int, *, writable: bool, sparse: bool = False,
                 limit: MappingLimit | None = None, on_unmap: Callable[[MappedFile], None] | None = None,
                 advice: int | None = None):
        self.directory = Path(directory)
        self.file_size = file_size
        self.writable = writable
        self.sparse = sparse        # files get blocks as their writer zero_fills them (keep_warm)
        self.limit = limit
        self.on_unmap = on_unmap    # called with each file just before this process unmaps it
        self.advice = advice        # madvise for each mapping (MADV_RANDOM: no read-around on a fault)
        self._files: dict[int, MappedFile] = {}

    def starts(self) -> list[int]:
        return segment_starts(self.directory)

    def min_offset(self) -> int | None:
        starts = self.starts()
        return starts[0] if starts else None

    def path_of(self, start: int) -> Path:
        return self.directory / segment_name(start)

    def get(self, offset: int, create: bool = False) -> MappedFile:
        """The file holding offset, mapped; OffsetGoneError if it does not exist (create=False)."""
        start = offset - offset % self.file_size
        mf = self._files.get(start)
        if mf is None:
            path = self.path_of(start)
            if create and not path.exists():
                self.directory.mkdir(parents=True, exist_ok=True)
                create_segment(path, self.file_size, 0 if self.sparse else WARM_AHEAD, self.sparse)
            try:
                mf = MappedFile(path, start, self.file_size, self.writable, self.sparse)
            except FileNotFoundError:
                raise OffsetGoneError(str(self.directory), offset) from None
            if self.advice is not None:
                mf.mm.madvise(self.advice)
            self._files[start] = mf
            if self.limit is not None:
                self.limit.add(mf, self)
        elif self.limit is not None:
            self.limit.touch(mf)
        return mf

    def is_mapped(self, start: int) -> bool:
        return start in self._files

    def forget(self, start: int) -> None:
        mf = self._files.pop(start, None)
        if mf is not None:
            if self.limit is not None:
                self.limit.discard(mf)
            if self.on_unmap is not None:
                self.on_unmap(mf)
            mf.close()

    def forget_before(self, offset: int) -> None:
        """Unmap files that end at or before offset (behind the reader/writer, or deleted)."""
        for start in [s for s in self._files if s + self.file_size <= offset]:
            self.forget(start)

    def flush(self, begin: int, end: int) -> int:
        """msync [begin, end) across files; files already deleted are skipped. Returns end."""
        fs = self.file_size
        pos = begin
        while pos < end:
            start = pos - pos % fs
            stop = min(end, start + fs)
            try:
                self.get(pos).flush(pos - start, stop - start)
            except OffsetGoneError:
                pass
            pos = stop
        return end

    def truncate(self, offset: int) -> None:
        """Make offset the end of the data: later bytes of its file read as zeros, later files
        go. Only for a process that nobody else maps the files of (recovery)."""
        self.close()
        fs = self.file_size
        for start in self.starts():
            path = self.path_of(start)
            if start >= offset:
                path.unlink(missing_ok=True)
            elif start + fs > offset:
                rel = offset - start
                os.truncate(path, rel)
                fd = os.open(path, os.O_RDWR)
                try:
                    _reserve(fd, fs, str(path), sparse=self.sparse)
                finally:
                    os.close(fd)
                if self.sparse and rel % PAGE_SIZE:     # keep the cut page written (keep_warm relies on it)
                    zero_fill(path, rel, min(rel - rel % PAGE_SIZE + PAGE_SIZE, fs))

    def delete_files_before(self, offset: int) -> list[int]:
        """Delete files that end at or before offset; returns their start offsets."""
        deleted = []
        for start in self.starts():
            if start + self.file_size > offset:
                break
            self.forget(start)
            self.path_of(start).unlink(missing_ok=True)
            deleted.append(start)
        return deleted

    def release_all(self) -> None:
        """Drop every page this process has mapped from RSS (MADV_DONTNEED keeps the page cache)."""
        for mf in self._files.values():
            mf.release_all()

    def close(self) -> None:
        for start in list(self._files):
            self.forget(start)
