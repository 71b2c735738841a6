"""ConsumeQueue: per (topic, queueId) files of 20-byte entries {commitLogOffset, size, tagsCode}.

Logical offset n lives at byte n*20. The dispatch actor is the only writer; net actors
read entries below the queue's published max offset through their own read-only maps.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

from smartgo.store.config import CQ_UNIT, MAPPED_QUEUE_FILES, PAGE_SIZE, round_up_to_unit
from smartgo.store.errors import OffsetGoneError
from smartgo.store.lazy_numpy import np
from smartgo.store.mapped_file import WARM_AHEAD, MappedFile, MappedFileQueue, MappingLimit, first_hole, keep_warm

#: A queue whose last warmed stretch lasted longer than this is slow: it warms just the pages it stores
#: into. Zeros written far ahead of a slow queue are written back and evicted before its entries
#: reach them, and the store then waits for a disk read (one a page crossing of each of 10,000 queues).
WARM_FAST_S = 10.0
#: Written pages behind the writer go from this process's RSS once this many have gathered (they
#: stay in the page cache): a busy queue's current 6 MB file would otherwise stay resident in dispatch.
RELEASE_STEP = 128 << 10

log = logging.getLogger(__name__)

ENTRY = struct.Struct(">qiq")


@functools.cache
def entry_dtype() -> np.dtype:
    """ENTRY as a numpy dtype, for dispatch's columnar path."""
    return np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags", ">i8")])

HOLE_SIZE = 0x7FFFFFFF  # pre-fill entry (0, Integer.MAX_VALUE, 0) for a queue starting mid-file
_HOLE = ENTRY.pack(0, HOLE_SIZE, 0)
QueueKey = tuple[str, int]


def queue_dir(root: Path | str, topic: str, queue_id: int) -> Path:
    return Path(root) / topic / str(queue_id)


def list_queues(root: Path | str) -> list[QueueKey]:
    """Every (topic, queueId) that has a ConsumeQueue directory under root."""
    out: list[QueueKey] = []
    try:
        topics = os.listdir(root)
    except FileNotFoundError:
        return out
    for topic in topics:
        try:
            qids = os.listdir(Path(root) / topic)
        except (NotADirectoryError, FileNotFoundError):
            continue
        out.extend((topic, int(q)) for q in qids if q.isdigit())
    return sorted(out)


def _real_phys_at(mm: mmap.mmap, i: int) -> int:
    """commitLogOffset of entry i, or of the nearest real entry before it when i is a hole (or
    unwritten); -1 when there is none. Holes filling a gap take their neighbour's position, so
    a binary search over entries stays monotonic."""
    while True:
        phys, size, _ = ENTRY.unpack_from(mm, i * CQ_UNIT)
        if size != HOLE_SIZE and size > 0:
            return phys
        if i == 0:
            return -1
        i -= 1


def _first_false(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """Smallest i in [lo, hi) with pred(i) False (pred is True on a prefix); hi if none."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


class ConsumeQueueWriter:
    """The dispatch side of one queue. ``max_offset`` is the next logical offset to write
    (what GET_MAX_OFFSET returns and what the dispatch actor publishes)."""

    def __init__(self, root: Path | str, topic: str, queue_id: int, file_size: int,
                 limit: MappingLimit | None = None, max_offset: int | None = None):
        """max_offset: the queue's end when known (smartgo.store.queue_ends), instead of reading
        it from the last file; max_phys_end is then unknown (0)."""
        self.key: QueueKey = (topic, queue_id)
        self.file_size = round_up_to_unit(file_size)
        # Sparse: a topic's queues reserve disk as they fill, not 6 MB each up front (keep_warm). Random:
        # the writer touches a page or two of a file (its end; a search for it); a fault on a page the
        # cache has lost reads that page, not the device's read-ahead around it (8 MiB here). Finding
        # the end of 10,132 cold queues: 21-26 s -> 6 s.
        self.files = MappedFileQueue(queue_dir(root, topic, queue_id), self.file_size, writable=True, sparse=True,
                                     limit=limit, on_unmap=self._keep_tail, advice=mmap.MADV_RANDOM)
        self.max_offset = 0
        self.max_phys_end = 0  # commitLogOffset + size of the last entry
        self._start = 0         # the file being written (mapped again after `limit` unmapped it)
        self._warm_end = 0      # bytes before this (in that file) are written already
        self._ahead = 0         # how far ahead it warms: WARM_AHEAD while the queue is fast, else 0
        self._warmed_at = 0.0   # monotonic time of the last warm
        self._tail: tuple[int, bytes] | None = None  # (position, bytes) of the written part of the last
                                                     # page, kept while `limit` has the file unmapped
        self._cut = False       # recovery cut entries: it goes on where it was cut, never mid-file
        if max_offset is None:
            self._find_end()
        else:
            self.max_offset = max_offset

    def _entries_in(self, start: int) -> int:
        """Entries written in the file at start: they form a prefix of non-zero sizes."""
        mf = self.files.get(start)
        mm = mf.mm
        n = min(mf.size, first_hole(mf.path)) // CQ_UNIT
        return _first_false(0, n, lambda i: ENTRY.unpack_from(mm, i * CQ_UNIT)[1] != 0)

    def _find_end(self) -> None:
        starts = self.files.starts()
        for start in reversed(starts):
            count = self._entries_in(start)
            if count or start == starts[0]:
                self.max_offset = (start + count * CQ_UNIT) // CQ_UNIT
                if count:
                    phys, size, _ = ENTRY.unpack_from(self.files.get(start).mm, (count - 1) * CQ_UNIT)
                    self.max_phys_end = phys + size if size != HOLE_SIZE else 0
                return

    def put(self, queue_offset: int, phys: int, size: int, tags_code: int) -> bool:
        """Write the entry for queue_offset; False when it was not written. An offset already
        present is skipped, so re-dispatching a range is harmless. A small gap is filled with
        hole entries; a gap longer than a file can only be a corrupt queue offset: skipped."""
        if queue_offset != self.max_offset:
            if queue_offset < self.max_offset:
                return False
            if not self._fill_holes(queue_offset):
                return False
        mf, rel = self._at(queue_offset * CQ_UNIT)
        self._ready(mf, rel, CQ_UNIT)
        ENTRY.pack_into(mf.mm, rel, phys, size, tags_code)
        if rel - mf.released >= RELEASE_STEP:
            mf.release(rel)
        self.max_offset = queue_offset + 1
        self.max_phys_end = phys + size
        return True

    def put_entries(self, queue_offset: int, entries: bytes | bytearray | memoryview) -> bool:
        """Write raw consecutive entries (a bytes-like of whole 20-byte entries) from
        queue_offset, which must be the max offset (False, nothing written, otherwise):
        one slice assignment per file instead of a put per entry."""
        if queue_offset != self.max_offset or not len(entries):
            return False
        mv = memoryview(entries).cast("B")
        pos = queue_offset * CQ_UNIT
        done = 0
        while done < len(mv):
            mf, rel = self._at(pos)
            take = min(len(mv) - done, self.file_size - rel)
            self._ready(mf, rel, take)
            mf.mm[rel:rel + take] = mv[done:done + take]
            done += take
            pos += take
            if rel + take - mf.released >= RELEASE_STEP:
                mf.release(rel + take)
        phys, size, _ = ENTRY.unpack_from(mv, len(mv) - CQ_UNIT)
        self.max_offset = pos // CQ_UNIT
        self.max_phys_end = phys + size
        return True

    def _ready(self, mf: MappedFile, rel: int, length: int) -> None:
        """Before storing [rel, rel + length): those bytes, and about WARM_AHEAD beyond while
        the queue is fast (WARM_FAST_S), are written with zeros (the file is sparse, and mapped
        stores into unwritten extents are slow: zero_fill, keep_warm)."""
        if rel + length + self._ahead // 2 > self._warm_end:
            now = time.monotonic()
            self._ahead = WARM_AHEAD if now - self._warmed_at < WARM_FAST_S else 0
            self._warmed_at = now
            self._warm_end = keep_warm(mf, rel, self._warm_end, rel + length, self._ahead)

    def _at(self, pos: int) -> tuple[MappedFile, int]:
        """The file holding byte pos (mapped, created if new) and pos within it."""
        start = pos - pos % self.file_size
        if start != self._start:
            self.files.forget(self._start)
            self._start = start
            self._warm_end = 0
            self._tail = None
        elif self._tail is not None and not self.files.is_mapped(start):
            self._restore_tail(start)
        return self.files.get(pos, create=True), pos - start

    def _keep_tail(self, mf: MappedFile) -> None:
        """`limit` unmaps the file being written: keep the written part of its last page, which
        the page cache may evict before this queue's next entries (a queue among thousands)."""
        end = self.max_offset * CQ_UNIT - mf.start
        if mf.start == self._start and 0 < end < mf.size and end % PAGE_SIZE:
            page = end - end % PAGE_SIZE
            self._tail = (mf.start + page, mf.mm[page:end])

    def _restore_tail(self, start: int) -> None:
        """Write the last page back whole before storing into it again: a whole-page write needs
        no read, where a store into an evicted page waits for one (a major fault in dispatch's
        loop). The bytes are those on disk; the rest of the page is zeros (keep_warm)."""
        pos, data = self._tail  # type: ignore[misc]  # checked by the caller
        self._tail = None
        page = data + bytes(PAGE_SIZE - len(data))
        try:
            fd = os.open(self.files.path_of(start), os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return                          # deleted meanwhile (cleanup): get() says so
        try:
            os.pwrite(fd, page, pos - start)
        except OSError as exc:
            log.warning("consume queue %s: could not write its last page back (%s)", self.key, exc)
        finally:
            os.close(fd)

    def _fill_holes(self, target: int) -> bool:
        fs = self.file_size
        first = self.max_offset
        if first == 0 and not self._cut and not self.files.starts():
            first = (target * CQ_UNIT - (target * CQ_UNIT) % fs) // CQ_UNIT  # a queue starting mid-file
        elif (target - first) * CQ_UNIT > fs:
            log.error("consume queue %s: record with queue offset %d far beyond the max %d skipped",
                      self.key, target, first)
            return False
        else:
            log.warning("consume queue %s: gap from %d to %d filled with holes", self.key, first, target)
        self.max_offset = first
        self.put_entries(first, _HOLE * (target - first))  # the caller's put() sets max_phys_end
        return True

    def hole_out(self, begin: int, end: int) -> list[int]:
        """Recovery: entries pointing into CommitLog bytes [begin, end) (a damaged record, now a
        filler: smartgo.store.damage) become holes; returns their offsets. Entries ascend by
        offset, so a binary search per file finds the first one."""
        holed: list[int] = []
        for start in self.files.starts():
            count = self._entries_in(start)
            mm = self.files.get(start).mm
            first = _first_false(0, count, lambda i: _real_phys_at(mm, i) < begin)  # noqa: B023 - called right here
            for i in range(first, count):
                phys, size, _ = ENTRY.unpack_from(mm, i * CQ_UNIT)
                if size == HOLE_SIZE:
                    continue
                if phys >= end:
                    return holed
                mm[i * CQ_UNIT:(i + 1) * CQ_UNIT] = _HOLE
                holed.append((start + i * CQ_UNIT) // CQ_UNIT)
        return holed

    def offsets_below(self, end_phys: int) -> int:
        """The offset after the entries pointing below end_phys (they ascend; holes count as below)."""
        starts = self.files.starts()
        return min(self._first_past(starts, end_phys) // CQ_UNIT, self.max_offset) if starts else self.max_offset

    def pad_to(self, offset: int) -> None:
        """Recovery: holes up to offset, for the offsets a cut took away and the dispatch
        after it did not fill (damaged or lost messages): none may go to a new message."""
        if offset <= self.max_offset:
            return
        log.warning("consume queue %s: offsets %d to %d kept as holes", self.key, self.max_offset, offset - 1)
        while self.max_offset < offset:
            self.put_entries(self.max_offset, _HOLE * min(offset - self.max_offset, 1 << 16))
        self.max_phys_end = 0

    def truncate_entries(self, offset: int) -> None:
        """Drop entries at logical offset >= offset (recovery only)."""
        self._cut = self._cut or offset < self.max_offset
        self._start = 0
        self._warm_end = 0
        self.files.truncate(offset * CQ_UNIT)
        self._tail = None       # kept by the unmapping above: the cut changes it
        self.max_offset = offset
        self.max_phys_end = 0
        self._find_end()

    def recover(self, valid: Callable[[int, int, int], bool | None], end_phys: int,
                checked_from: int | None = None) -> bool:
        """RocketMQ's ConsumeQueue.recover, stricter: from the third-last file (or earlier, from
        the first entry reaching past end_phys) keep entries while valid(queue_offset, phys,
        size) holds (None: keep the offset as a hole); truncate the rest. True when a non-empty
        entry was cut (entries lost). checked_from: only from the entry before the first whose
        record reaches past it (the start of recovery's CommitLog walk after a crash or a clean
        stop, when what is older is flushed): a check costs ~0.5 µs an entry, seconds a queue."""
        starts = self.files.starts()
        if not starts:
            return False
        fs = self.file_size
        first = self._first_past(starts, end_phys)
        if checked_from is None:
            begin = min(starts[max(0, len(starts) - 3)], first - first % fs)
        else:
            begin = max(starts[0], min(self._first_past(starts, checked_from), first) - CQ_UNIT)
        scan = [s for s in starts if s >= begin - begin % fs]
        end = scan[0]
        ok = True
        for start in scan:
            if start != end:
                break  # a missing file: entries stop at the gap
            mf = self.files.get(start)
            good = max(0, begin - start) // CQ_UNIT        # entries before `begin` are kept unchecked
            off = start // CQ_UNIT + good
            # A view, not a slice of the map: a copy read all 6 MB of every queue's file (pages of
            # zeros for a sparse file's holes), 15 s of a 30,000-queue node's start.
            with mf.view[good * CQ_UNIT:mf.size - mf.size % CQ_UNIT] as entries:
                for phys, size, _tags in ENTRY.iter_unpack(entries):
                    if size != HOLE_SIZE or phys != 0:
                        verdict = phys >= 0 and size > 0 and phys + size <= end_phys and valid(off, phys, size)
                        if verdict is None:
                            mf.mm[good * CQ_UNIT:(good + 1) * CQ_UNIT] = _HOLE
                        elif not verdict:
                            ok = size == 0 and phys == 0  # an empty entry is the normal end
                            break
                    good += 1
                    off += 1
            end = start + good * CQ_UNIT
            if not ok or good * CQ_UNIT < fs:
                break
        self.truncate_entries(end // CQ_UNIT)  # zeros after the last good entry
        return not ok

    def _first_past(self, starts: list[int], end_phys: int) -> int:
        """Byte position of the first entry that reaches past end_phys (entries point at
        ascending offsets; holes count as not past)."""
        for start in reversed(starts):
            mf = self.files.get(start)
            mm = mf.mm
            n = min(mf.size, first_hole(mf.path)) // CQ_UNIT

            def within(i: int) -> bool:
                phys, size, _ = ENTRY.unpack_from(mm, i * CQ_UNIT)  # noqa: B023 - used in this iteration only
                return size == HOLE_SIZE or (size > 0 and phys + size <= end_phys)

            if n and within(0):
                return start + _first_false(0, n, within) * CQ_UNIT
        return starts[0]

    def flush(self, begin_offset: int, end_offset: int) -> None:
        self.files.flush(begin_offset * CQ_UNIT, end_offset * CQ_UNIT)

    def close(self) -> None:
        self.files.close()


class ConsumeQueueReader:
    """Read-only access to one queue, bounded by the published max offset."""

    def __init__(self, root: Path | str, topic: str, queue_id: int, file_size: int,
                 limit: MappingLimit | None = None):
        self.key: QueueKey = (topic, queue_id)
        self.file_size = round_up_to_unit(file_size)
        self.files = MappedFileQueue(queue_dir(root, topic, queue_id), self.file_size, writable=False, limit=limit)
        self._min_cache: tuple[int, int, int] | None = None  # (first file, commitlog min, result)
        self._starts: list[int] = []  # file listing, re-read when empty or after refresh()

    def refresh(self) -> None:
        """Forget the cached file listing (after cleanup deleted files, or OffsetGoneError)."""
        self._starts = []
        self._min_cache = None

    def entries(self, offset: int, max_count: int, bound: int) -> memoryview:
        """Raw entries from offset, at most max_count, below bound, within one file.
        OffsetGoneError if that file was deleted."""
        count = min(max_count, bound - offset)
        if count <= 0 or offset < 0:
            return memoryview(b"")
        pos = offset * CQ_UNIT
        mf = self.files.get(pos)
        rel = pos - mf.start
        stop = min(rel + count * CQ_UNIT, mf.size - mf.size % CQ_UNIT)
        return mf.view[rel:stop]

    def entry(self, offset: int) -> tuple[int, int, int]:
        pos = offset * CQ_UNIT
        mf = self.files.get(pos)
        return ENTRY.unpack_from(mf.mm, pos - mf.start)

    def min_offset(self, commitlog_min: int, bound: int) -> int:
        """First offset below bound that is neither a hole nor below the CommitLog minimum
        (bound when there is none: the queue is empty)."""
        if not self._starts:
            self._starts = self.files.starts()
        for start in self._starts:
            first = start // CQ_UNIT
            if first >= bound:
                break
            cached = self._min_cache
            if cached is not None and cached[0] == start and cached[1] == commitlog_min:
                return cached[2]
            try:
                mf = self.files.get(start)
            except OffsetGoneError:
                continue
            mm = mf.mm
            n = min(mf.size // CQ_UNIT, bound - first)

            # Holes are not messages, but only holes before the first live entry are "gone": a
            # hole filling a gap after live entries takes the verdict of the real entry before it.
            i = _first_false(0, n, lambda i: _real_phys_at(mm, i) < commitlog_min)  # noqa: B023 - used right here
            if i < n:
                self._min_cache = (start, commitlog_min, first + i)
                return first + i
        return bound

    def forget_before(self, offset: int) -> None:
        self.files.forget_before(offset * CQ_UNIT)

    def close(self) -> None:
        self.files.close()


class ConsumeQueueSet:
    """All queues of a store, on the dispatch side (created on first use), at most
    `mapped_files` of their files mapped at once (MappingLimit).

    known: the ends of queues known without reading their files (a clean stop's queue_ends):
    those queues are opened when first written; the others in the directory at once."""

    def __init__(self, root: Path | str, file_size: int, mapped_files: int = MAPPED_QUEUE_FILES,
                 known: dict[QueueKey, int] | None = None):
        self.root = Path(root)
        self.file_size = round_up_to_unit(file_size)
        self.limit = MappingLimit(mapped_files)
        self.queues: dict[QueueKey, ConsumeQueueWriter] = {}
        self._known: dict[QueueKey, int] = {}
        for key in list_queues(self.root):
            if known is not None and key in known:
                self._known[key] = known[key]
            else:
                self.get(*key)

    def get(self, topic: str, queue_id: int) -> ConsumeQueueWriter:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = self.queues[key] = ConsumeQueueWriter(self.root, topic, queue_id, self.file_size, self.limit,
                                                       self._known.pop(key, None))
        return cq

    def max_offsets(self) -> dict[QueueKey, int]:
        return {**self._known, **{k: cq.max_offset for k, cq in self.queues.items()}}

    def max_phys_end(self) -> int:
        return max((cq.max_phys_end for cq in self.queues.values()), default=0)

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
