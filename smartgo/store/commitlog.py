"""The CommitLog: one writer appends pre-encoded record blocks; any process reads below a bound.

The writer (the commit actor) is the only process that writes CommitLog files. It assigns
each record's physical offset, queue offset and store timestamp by patching the encoded
bytes in place, as RocketMQ does under its put lock, and owns the per-queue next-offset
table. It publishes nothing itself: the caller publishes ``wrote_position`` (an int) and
readers in other processes never look past the bound they are given.
"""

from __future__ import annotations

import logging
import mmap
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from smartgo.store.errors import (CorruptRecordError, DiskFullError, MessageIllegalError, OffsetGoneError,
                                  QueuesFullError, StoreError)
from smartgo.store.mapped_file import MappedFile, MappedFileQueue
from smartgo.store.record import (
    BLANK_MAGIC, BORNHOST_V6_FLAG, END_FILE_MIN_BLANK, FIXED_SIZE, INT64, MESSAGE_MAGIC, POS_QUEUEOFFSET,
    POS_STORETIMESTAMP, QUEUE_AND_PHYS, SIZE_MAGIC, SIZE_MAGIC_QUEUE_SYSFLAG, check_record,
)

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


class Block(NamedTuple):
    """Records that must land contiguously in one file: one message, or a SEND_BATCH.

    ``queue`` is the (topic, queueId) every record of the block belongs to; None marks
    prepared/rollback transactional records, which get queue offset 0 and do not advance
    the queue. ``count`` is the number of records in ``data``."""

    data: bytes | bytearray | memoryview
    queue: QueueKey | None
    count: int = 1  # type: ignore[assignment]  # RocketMQ's name; shadows tuple.count, which nothing calls


class AppendResult(NamedTuple):
    physical_offset: int  # of the block's first record
    queue_offset: int  # of the block's first record (0 when queue is None)
    count: int  # type: ignore[assignment]  # as Block.count: shadows tuple.count, which nothing calls
    store_timestamp: int
    end_offset: int  # the written position right after this block


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class CommitLogWriter:
    """The single CommitLog writer. ``wrote_position`` is what the caller publishes."""

    def __init__(self, directory: Path | str, file_size: int, wrote_position: int,
                 queue_offsets: dict[QueueKey, int], *, clock: Callable[[], int] = _now_ms,
                 release_interval: int = 16 * 1024 * 1024, last_store_timestamp: int = 0,
                 max_queues: int | None = None):
        self.file_size = file_size
        self.queue_offsets = queue_offsets
        self.max_queues = max_queues            # queues the readers' table can hold (None: no limit)
        self.last_store_timestamp = last_store_timestamp
        self._clock = clock
        self._release_interval = release_interval
        self._files = MappedFileQueue(directory, file_size, writable=True)
        self._file: MappedFile = self._files.get(wrote_position, create=True)
        self._pos = wrote_position - self._file.start  # within self._file

    @property
    def wrote_position(self) -> int:
        return self._file.start + self._pos

    def append(self, blocks: Iterable[Block | tuple]) -> list[AppendResult | StoreError]:
        """Append many blocks in one call (one store timestamp for all of them).

        Returns one entry per block, in order: an AppendResult, or the error that kept that
        block out (MessageIllegalError for a malformed or oversized block; DiskFullError
        when a new file could not be reserved, for that block and every later one;
        QueuesFullError for a block that would open a queue past max_queues). A failed block
        leaves the log and the queue table as they were."""
        now = self._clock()
        if now < self.last_store_timestamp:
            now = self.last_store_timestamp  # store time never goes backwards (time search)
        self.last_store_timestamp = now
        results: list[AppendResult | StoreError] = []
        table = self.queue_offsets
        fs = self.file_size
        mf = self._file
        mm = mf.mm
        base = mf.start
        pos = self._pos
        unpack_head = SIZE_MAGIC_QUEUE_SYSFLAG.unpack_from
        pack_offsets = QUEUE_AND_PHYS.pack_into
        pack_ts = INT64.pack_into
        blocks = list(blocks)
        for i, (data, queue, count) in enumerate(blocks):
            n = len(data)
            if n < FIXED_SIZE or n + END_FILE_MIN_BLANK > fs:
                results.append(MessageIllegalError(f"block of {n} bytes cannot be stored in {fs}-byte files"))
                continue
            qbase = 0 if queue is None else table.get(queue)
            if qbase is None:                   # the queue's first record
                if self.max_queues is not None and len(table) >= self.max_queues:
                    results.append(QueuesFullError(queue, self.max_queues))
                    continue
                qbase = 0
            if pos + n + END_FILE_MIN_BLANK > fs:
                self._pos = pos
                try:
                    self._roll()
                except DiskFullError as exc:
                    log.error("commitlog append stopped: %s", exc)
                    results.extend([exc] * (len(blocks) - i))
                    break
                mf = self._file
                mm = mf.mm
                base = mf.start
                pos = 0
            end = pos + n
            mm[pos:end] = data
            if queue is not None:
                step = 1
                queue_id = queue[1]
            else:
                step = 0
                queue_id = None
            q = qbase
            p = pos
            records = 0
            while p < end:
                size, magic, record_queue, sys_flag = unpack_head(mm, p)
                if magic != MESSAGE_MAGIC or size < FIXED_SIZE or p + size > end or (
                        queue_id is not None and record_queue != queue_id):
                    break
                pack_offsets(mm, p + POS_QUEUEOFFSET, q, base + p)
                pack_ts(mm, p + (POS_STORETIMESTAMP + 12 if sys_flag & BORNHOST_V6_FLAG else POS_STORETIMESTAMP), now)
                p += size
                q += step
                records += 1
            if p != end or records != count:
                mm[pos:end] = bytes(n)  # leave no half-valid records beyond the written position
                results.append(MessageIllegalError(
                    f"malformed block: {records} well-formed records of queue {queue} in {n} bytes, {count} declared"))
                continue
            if queue is not None:
                table[queue] = q
            results.append(AppendResult(base + pos, qbase, count, now, base + end))
            pos = end
        self._pos = pos
        if pos - mf.released >= self._release_interval:
            mf.release(pos)
        return results

    def _roll(self) -> None:
        """Reserve the next file first (DiskFullError leaves everything unchanged), then
        close the current one with the blank filler."""
        old = self._file
        nxt = self._files.get(old.start + self.file_size, create=True)
        SIZE_MAGIC.pack_into(old.mm, self._pos, self.file_size - self._pos, BLANK_MAGIC)
        self._file = nxt
        self._pos = 0
        self._files.forget(old.start)

    def discard_unpublished(self, length: int) -> None:
        """Zero ``length`` bytes from the written position (within its file) and delete later
        files: what a writer that crashed mid-append may have left past the position it had
        published. Nobody reads past that position, but recovery would take such bytes for
        records, so a restarted writer wipes them before appending again."""
        end = min(self._pos + length, self.file_size)
        if end > self._pos:
            self._file.mm[self._pos:end] = bytes(end - self._pos)
        for start in self._files.starts():
            if start > self._file.start:
                self._files.forget(start)
                self._files.path_of(start).unlink(missing_ok=True)

    def append_replica(self, offset: int, data: bytes | memoryview) -> int:
        """A slave's append of the master's bytes, verbatim, at ``offset`` (which must be the
        written position). Returns the new written position."""
        if offset != self.wrote_position:
            raise StoreError(f"replica data at {offset} does not continue the log at {self.wrote_position}")
        mv = memoryview(data)
        while len(mv):
            if self._pos == self.file_size:
                old = self._file
                self._file = self._files.get(old.start + self.file_size, create=True)
                self._pos = 0
                self._files.forget(old.start)
            take = min(len(mv), self.file_size - self._pos)
            self._file.mm[self._pos:self._pos + take] = mv[:take]
            self._pos += take
            mv = mv[take:]
        if self._pos - self._file.released >= self._release_interval:
            self._file.release(self._pos)
        return self.wrote_position

    def flush(self, begin: int, end: int) -> int:
        return self._files.flush(begin, end)

    def close(self) -> None:
        self._files.close()


class CommitLogReader:
    """Read-only view of the CommitLog for any process (net, dispatch, flush, HA)."""

    def __init__(self, directory: Path | str, file_size: int, *, writable: bool = False):
        self.file_size = file_size
        self.files = MappedFileQueue(directory, file_size, writable=writable)

    def segment(self, offset: int) -> MappedFile:
        return self.files.get(offset)

    def min_offset(self) -> int:
        """Start of the oldest file still on disk (0 for an empty log)."""
        m = self.files.min_offset()
        return 0 if m is None else m

    def read(self, offset: int, size: int, bound: int) -> memoryview:
        """size bytes at offset, zero-copy. ValueError past bound; OffsetGoneError if deleted."""
        if offset < 0 or size < 0 or offset + size > bound:
            raise ValueError(f"read [{offset}, {offset + size}) passes the bound {bound}")
        mf = self.files.get(offset)
        rel = offset - mf.start
        if rel + size > mf.size:
            raise ValueError(f"read [{offset}, {offset + size}) crosses the end of its file")
        return mf.view[rel:rel + size]

    def record_at(self, offset: int, bound: int) -> memoryview:
        """The whole record at offset. CorruptRecordError if no record starts there."""
        mf = self.files.get(offset)
        rel = offset - mf.start
        limit = min(mf.size, bound - mf.start)
        if rel < 0 or rel + FIXED_SIZE > limit:
            raise CorruptRecordError("no record within the bound", offset)
        size, magic = SIZE_MAGIC.unpack_from(mf.mm, rel)
        if magic != MESSAGE_MAGIC or size < FIXED_SIZE or rel + size > limit:
            raise CorruptRecordError("no record starts here", offset)
        return mf.view[rel:rel + size]

    def release_pages(self, below: int) -> None:
        """Drop the pages this process has touched from its RSS (the page cache keeps them) and
        unmap the files that end at or before ``below``: a long-lived reader (replication) calls
        it every so many bytes, so a catch-up does not grow it by the backlog's size."""
        self.files.forget_before(below)
        self.files.release_all()

    def whole_records(self, start: int, end: int) -> tuple[int, int]:
        """Where the whole records from ``start`` (a record or file start) end below ``end``,
        which may cut a record anywhere (a slave's replicated tail): (that position, the start
        of the last whole record, or -1 for none); never past ``end``. A file's end filler is
        stepped over once all of it is in. CorruptRecordError where the bytes are neither."""
        fs = self.file_size
        unpack = SIZE_MAGIC.unpack_from
        pos = start
        last = -1
        while end - pos >= 8:
            mf = self.segment(pos)
            mm, base = mf.mm, mf.start
            rel, limit = pos - base, min(fs, end - base)
            size = magic = 0
            while rel + 8 <= limit:                         # the hot loop: a header per record
                size, magic = unpack(mm, rel)
                if magic != MESSAGE_MAGIC or size < FIXED_SIZE or rel + size > limit:
                    break
                last = base + rel
                rel += size
            pos = base + rel
            if rel + 8 > limit:
                break                                       # the next header has not arrived
            if magic == BLANK_MAGIC and size == fs - rel:
                if base + fs > end:
                    break                                   # the filler has not all arrived
                pos = base + fs
                continue
            if magic != MESSAGE_MAGIC or size < FIXED_SIZE or rel + size > fs:
                raise CorruptRecordError(f"neither a record nor a file-end filler (size {size}, magic {magic})",
                                         pos)
            break                                           # a record still arriving
        return pos, last

    def walk(self, start: int, bound: int | None = None, *, verify: bool = False) -> RecordWalk:
        return RecordWalk(self, start, bound, verify)

    def flush(self, begin: int, end: int) -> int:
        """msync [begin, end) through this process's own mapping (open with writable=True)."""
        return self.files.flush(begin, end)

    def forget_before(self, offset: int) -> None:
        self.files.forget_before(offset)

    def close(self) -> None:
        self.files.close()


class RecordWalk:
    """Iterate the records from ``start`` up to ``bound`` as (physical offset, mmap, position
    in file, size), stepping over blank fillers.

    verify=False (dispatch, HA: data below a published bound): anything that is not a
    record raises CorruptRecordError. verify=True (recovery: bound None, walk until the data
    ends): each record's magic, lengths, body CRC and PHYSICALOFFSET are checked and the
    walk stops at the first failure. Afterwards ``position`` is where the valid data ends."""

    def __init__(self, reader: CommitLogReader, start: int, bound: int | None, verify: bool):
        self.reader = reader
        self.position = start
        self.bound = bound
        self.verify = verify
        self.stopped: str | None = None  # why a verifying walk ended early

    def __iter__(self) -> Iterator[tuple[int, mmap.mmap, int, int]]:
        fs = self.reader.file_size
        bound = self.bound
        verify = self.verify
        unpack = SIZE_MAGIC.unpack_from
        pos = self.position
        while bound is None or pos < bound:
            try:
                mf = self.reader.segment(pos)
            except OffsetGoneError:
                if verify:
                    self.stopped = "no file"
                    return
                raise
            mm = mf.mm
            base = mf.start
            rel = pos - base
            limit = mf.size if bound is None else min(mf.size, bound - base)
            while rel + 8 <= limit:
                size, magic = unpack(mm, rel)
                if magic == BLANK_MAGIC:
                    if size != fs - rel:
                        self._bad("blank filler does not reach the file end", base + rel)
                        return
                    rel = fs
                    break
                if verify:
                    if check_record(mf.view, rel, limit, base + rel) == 0:
                        self._bad("end of data" if size == 0 and magic == 0 else "invalid record", base + rel)
                        return
                elif magic != MESSAGE_MAGIC or size < FIXED_SIZE or rel + size > limit:
                    self._bad("not a record", base + rel)
                yield base + rel, mm, rel, size
                rel += size
                self.position = base + rel
            if rel < fs:  # no filler: the data (or the bound) ends in this file
                if bound is None or base + rel < bound:
                    self._bad("data ends without a filler" if bound is None else "record crosses the bound",
                              base + rel)
                return
            pos = base + fs
            self.position = pos

    def _bad(self, reason: str, offset: int) -> None:
        self.position = offset
        if not self.verify:
            raise CorruptRecordError(reason, offset)
        self.stopped = reason
