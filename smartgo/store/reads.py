"""The read side of the store, for any process (net actors, the in-process facade).

Every call takes the published bounds it may read up to: ``written`` (the CommitLog
written position) and a queue's ``max_offset`` (its published ConsumeQueue max). Results
hold zero-copy memoryviews into this process's read-only maps, ready for a socket write.
"""

from __future__ import annotations

import enum
import logging
import mmap
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from smartgo.store.commitlog import CommitLogReader, QueueKey
from smartgo.store.config import StoreConfig
from smartgo.store.consume_queue import ENTRY, HOLE_SIZE, ConsumeQueueReader
from smartgo.store.errors import CorruptRecordError, OffsetGoneError
from smartgo.store.index_file import IndexReader
from smartgo.store.mapped_file import MappingLimit
from smartgo.store.point_reads import PointReads, store_time
from smartgo.store.record import (
    MESSAGE_MAGIC, SIZE_MAGIC, Buffer, MessageExt, decode_record, parse_offset_msg_id, peek_dispatch_fields, peek_head,
    store_timestamp_at,
)

log = logging.getLogger(__name__)

READ_AHEAD = 4 << 20            # bytes of CommitLog advised (MADV_WILLNEED) ahead of a cold read
READ_AHEAD_CHUNK = 1 << 20      # the unit of that advice
ADVISED_KEPT = 64               # chunks remembered as advised (several readers at different places)


class GetStatus(enum.Enum):
    """GetMessageStatus (DefaultMessageStore.getMessage)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    buffers: list[memoryview] = field(default_factory=list)  # one whole record each
    buffer_total_size: int = 0
    max_phys_offset_pulling: int = 0  # commitLogOffset of the last entry looked at

    @property
    def message_count(self) -> int:
        return len(self.buffers)

    def body(self) -> bytes:
        """The PULL response body (prefer writing ``buffers`` to the socket as they are)."""
        return b"".join(self.buffers)


@dataclass(slots=True)
class QueryResult:
    buffers: list[memoryview]
    index_last_update_timestamp: int
    index_last_update_phyoffset: int

    def messages(self) -> list[MessageExt]:
        return [decode_record(b) for b in self.buffers]


def physical_memory() -> int:
    """The machine's RAM in bytes (RocketMQ's TOTAL_PHYSICAL_MEMORY_SIZE)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class StoreReader:
    def __init__(self, config: StoreConfig):
        self.config = config
        self.commitlog = CommitLogReader(config.commitlog_dir, config.commitlog_file_size)
        self.index = IndexReader(config.index_dir, config.index_slot_count, config.index_entry_count)
        self._queues: dict[QueueKey, ConsumeQueueReader] = {}
        self._mapped = MappingLimit(config.mapped_queue_files)
        self.commitlog_min = self.commitlog.min_offset()
        # A record further than this behind the written position is "in disk" (probably out of the
        # page cache): a pull reading it gets the smaller batch limits, as in RocketMQ, so one
        # consumer catching up cannot evict what every other consumer is reading.
        self.memory_window = physical_memory() * config.access_message_in_memory_max_ratio // 100
        self._advised: deque[int] = deque(maxlen=ADVISED_KEPT)

    def refresh(self) -> int:
        """Re-read the CommitLog minimum and file listings (after cleanup announced deletions)
        and unmap what lies below."""
        self.commitlog_min = self.commitlog.min_offset()
        self.commitlog.forget_before(self.commitlog_min)
        for cq in self._queues.values():
            cq.refresh()
        return self.commitlog_min

    def release_pages(self) -> None:
        """Drop the pages reads have touched from this process's RSS (they stay in the page
        cache); a long-lived reader calls it every so many bytes served, so catching up on
        a backlog does not grow it by the backlog's size."""
        self.commitlog.files.release_all()
        for cq in self._queues.values():
            cq.files.release_all()

    def queue(self, topic: str, queue_id: int) -> ConsumeQueueReader:
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is None:
            cq = self._queues[key] = ConsumeQueueReader(self.config.consume_queue_dir, topic, queue_id,
                                                        self.config.consume_queue_file_size, self._mapped)
        return cq

    def min_offset(self, topic: str, queue_id: int, max_offset: int) -> int:
        return self.queue(topic, queue_id).min_offset(self.commitlog_min, max_offset)

    def in_memory(self, phys: int, written: int) -> bool:
        """Is the record at phys within the page-cache window (not checkInDiskByCommitOffset)?"""
        return written - phys <= self.memory_window

    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int, max_offset: int, written: int,
                     tag_codes: set[int] | frozenset[int] | None = None,
                     match: Callable[[bytes], bool] | None = None) -> GetResult:
        """DefaultMessageStore.getMessage, group-agnostic, with the pull edge cases of facts F.5.
        tag_codes filters by the ConsumeQueue's tag hash (isMatchedByConsumeQueue); match, given a
        record's raw properties, filters by the record itself (isMatchedByCommitLog: SQL92)."""
        if max_offset == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        cq = self.queue(topic, queue_id)
        min_offset = cq.min_offset(self.commitlog_min, max_offset)
        if offset < min_offset:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
        if offset == max_offset:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
        if offset > max_offset:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, max_offset, min_offset, max_offset)
        cfg = self.config
        max_msgs = min(max_count, cfg.max_transfer_count_on_message_in_memory)
        max_bytes = cfg.max_transfer_bytes_on_message_in_memory
        disk_msgs = min(max_count, cfg.max_transfer_count_on_message_in_disk)
        disk_bytes = cfg.max_transfer_bytes_on_message_in_disk
        in_disk_below = written - self.memory_window    # isTheBatchFull's isInDisk, per record
        scan_left = max(16000, max_count * 20)
        result = GetResult(GetStatus.NO_MATCHED_MESSAGE, offset, min_offset, max_offset)
        buffers = result.buffers
        total = 0
        cur = offset
        fs = self.commitlog.file_size
        cl_min = self.commitlog_min
        seg_start = -1
        mm = view = None
        limit = 0
        unpack_head = SIZE_MAGIC.unpack_from
        append = buffers.append
        n = 0
        last_phys = 0
        full = False
        while cur < max_offset and scan_left > 0 and not full:
            try:
                raw = cq.entries(cur, scan_left, max_offset)
            except OffsetGoneError:
                self.refresh()
                if not buffers:
                    result.status = GetStatus.OFFSET_FOUND_NULL
                    cur = max(cur, cq.min_offset(self.commitlog_min, max_offset))
                break
            if not raw:
                break
            for phys, size, tags in ENTRY.iter_unpack(raw):
                if n and (n >= max_msgs or total + size > max_bytes or phys < in_disk_below
                          and (n >= disk_msgs or total + size > disk_bytes)):
                    full = True
                    break
                cur += 1
                scan_left -= 1
                last_phys = phys
                if size == HOLE_SIZE:
                    continue
                if tag_codes is not None and tags not in tag_codes:
                    continue
                start = phys - phys % fs
                if start != seg_start:
                    try:
                        mf = self.commitlog.segment(phys)
                    except OffsetGoneError:
                        mf = None
                    if mf is None or phys < cl_min:
                        if not n:
                            result.status = GetStatus.MESSAGE_WAS_REMOVING
                        continue
                    seg_start, mm, view = start, mf.mm, mf.view
                    limit = min(mf.size, written - start)
                rel = phys - start
                if rel + size > limit:
                    cur -= 1  # not written yet as far as this reader knows: stop here
                    full = True
                    break
                rec_size, magic = unpack_head(mm, rel)  # type: ignore[arg-type]  # set above: seg_start starts at -1
                if rec_size != size or magic != MESSAGE_MAGIC:
                    log.error("consume queue %s/%d offset %d points at no record (%d, %d bytes); skipped",
                              topic, queue_id, cur - 1, phys, size)
                    continue
                if match is not None and not self._matches(match, mm, rel, phys):  # type: ignore[arg-type]  # as above
                    continue
                append(view[rel:rel + size])  # type: ignore[index]  # set with mm, above
                total += size
                n += 1
        result.next_begin_offset = cur
        result.buffer_total_size = total
        result.max_phys_offset_pulling = last_phys
        if n:
            result.status = GetStatus.FOUND
            if written - last_phys > READ_AHEAD:        # a consumer far behind
                self.read_ahead(last_phys, written)
        return result

    def read_ahead(self, phys: int, written: int) -> None:
        """Ask the kernel to read the CommitLog from phys to READ_AHEAD bytes on (MADV_WILLNEED: it
        starts the reads and returns), so the next pulls of a consumer catching up find their
        records in the page cache instead of stalling this process's loop on a page fault. The
        queues of a group catching up advance together through the CommitLog, so each chunk is
        advised once, by whichever pull gets near it first."""
        advised = self._advised
        fs = self.commitlog.file_size
        end = min(phys + READ_AHEAD, written)
        for chunk in range(phys // READ_AHEAD_CHUNK, -(-end // READ_AHEAD_CHUNK)):
            if chunk in advised:
                continue
            advised.append(chunk)
            lo = max(chunk * READ_AHEAD_CHUNK, self.commitlog_min)
            hi = min((chunk + 1) * READ_AHEAD_CHUNK, end)
            while lo < hi:                              # a chunk may span two files (small files: several)
                start = lo - lo % fs
                stop = min(hi, start + fs)
                try:
                    mf = self.commitlog.segment(lo)
                    rel = lo - start - (lo - start) % mmap.PAGESIZE
                    if rel < mf.size:
                        mf.mm.madvise(mmap.MADV_WILLNEED, rel, min(stop - start, mf.size) - rel)
                except (OffsetGoneError, OSError):
                    pass                                # deleted meanwhile: nothing to read ahead
                lo = stop

    @staticmethod
    def _matches(match: Callable[[bytes], bool], mm: Buffer, rel: int, phys: int) -> bool:
        try:
            props = peek_head(mm, rel)[6]
        except CorruptRecordError:
            log.error("record at %d is damaged: its properties cannot be read for a filter; skipped", phys)
            return False
        return match(props)

    def _store_time(self, cq: ConsumeQueueReader, offset: int, written: int) -> int:
        phys, size, _ = cq.entry(offset)
        mf = self.commitlog.segment(phys)
        if phys + size > written or phys - mf.start + size > mf.size:
            raise CorruptRecordError("consume queue entry points past the written position", phys)
        return store_timestamp_at(mf.mm, phys - mf.start)

    def search_offset_by_time(self, topic: str, queue_id: int, timestamp: int, max_offset: int, written: int) -> int:
        """First offset whose store time is >= timestamp (max_offset if none, min if all are).
        RocketMQ 4.x answers the entry nearest in time within one file; this is the exact
        lower bound over the whole queue."""
        cq = self.queue(topic, queue_id)
        lo = cq.min_offset(self.commitlog_min, max_offset)
        hi = max_offset
        with PointReads(cq.files) as entries, PointReads(self.commitlog.files) as records:  # cold: no read-around
            while lo < hi:
                mid = (lo + hi) // 2
                if store_time(entries, records, mid, written) < timestamp:
                    lo = mid + 1
                else:
                    hi = mid
        return lo

    def earliest_message_time(self, topic: str, queue_id: int, max_offset: int, written: int) -> int:
        """Store time of the queue's first message, -1 when the queue is empty."""
        return self.message_store_time(topic, queue_id, self.min_offset(topic, queue_id, max_offset),
                                       max_offset, written)

    def message_store_time(self, topic: str, queue_id: int, offset: int, max_offset: int, written: int) -> int:
        if offset >= max_offset or offset < 0:
            return -1
        try:
            return self._store_time(self.queue(topic, queue_id), offset, written)
        except (OffsetGoneError, CorruptRecordError):
            return -1

    def view(self, offset: int, written: int, records: PointReads | None = None) -> memoryview | None:
        """The record starting at a CommitLog offset, None if there is none (or it is gone);
        a copy read through records if given, else a view of this process's map."""
        if offset < self.commitlog_min or offset >= written:
            return None
        try:
            if records is not None:
                return memoryview(records.record(offset, written))
            return self.commitlog.record_at(offset, written)
        except (OffsetGoneError, CorruptRecordError):
            return None

    def view_by_offset_msg_id(self, msg_id: str, written: int) -> memoryview | None:
        """VIEW_MESSAGE_BY_ID: InvalidMessageIdError for a malformed id."""
        return self.view(parse_offset_msg_id(msg_id)[2], written)

    def query_by_key(self, topic: str, key: str, max_num: int, begin: int, end: int, written: int) -> QueryResult:
        """Messages of topic carrying key (UNIQ_KEY or a KEYS token) stored in [begin, end],
        newest first. Each index hit is checked against its record, so colliding keys never
        leak foreign messages, and the time range is exact (the index keeps seconds). The records
        are read with pread (point_reads): on a cold store a map's fault reads megabytes around each."""
        want_topic = topic.encode()
        want_key = key.encode()
        limit = max_num
        with PointReads(self.commitlog.files) as records:  # hits are scattered over cold files: no read-around
            while True:
                offsets, last_ts, last_phy = self.index.query(topic, key, limit, begin - 1000, end)
                found: list[memoryview] = []
                for phys in dict.fromkeys(offsets):
                    view = self.view(phys, written, records)
                    if view is None:
                        continue
                    _, rtopic, _, _, _, ts, _, keys, uniq = peek_dispatch_fields(view, 0)
                    if rtopic == want_topic and begin <= ts <= end and (
                            uniq == want_key or want_key in keys.split(b" ")):
                        found.append(view)
                        if len(found) >= max_num:
                            break
                if len(found) >= max_num or len(offsets) < limit:
                    return QueryResult(found, last_ts, last_phy)
                limit *= 4

    def close(self) -> None:
        for cq in self._queues.values():
            cq.close()
        self._queues.clear()
        self.index.close()
        self.commitlog.close()
