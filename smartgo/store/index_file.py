"""IndexFile: a hash index from ``topic#key`` to CommitLog offsets (facts F.3 layout).

File = 40-byte header {beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset (int64),
hashSlotCount, indexCount (int32)} + slots (int32: newest entry of the chain) + entries
{keyHash int32, phyOffset int64, timeDiff int32 (s since beginTimestamp), prevIndex int32}.
Entry 0 is invalid; indexCount starts at 1. Files are named yyyyMMddHHmmssSSS (local time).

The dispatch actor is the only writer (IndexService); it writes entries and slots as it
goes and the header once per dispatch round, so a reader in another process never follows
a slot past the header's indexCount. Hash collisions are expected: callers verify a hit by
reading the record (MessageStore.query_by_key does).
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

from smartgo.store.java_hash import (
    index_hashes, index_hashes_vectorized, java_hash_u32, positive_index_hash, prefix_hash,
)
from smartgo.store.lazy_numpy import np as _np
from smartgo.store.mapped_file import MappedFile, create_segment

log = logging.getLogger(__name__)

HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = 40
SLOT = struct.Struct(">i")
ENTRY = struct.Struct(">iqii")
SLOT_SIZE = 4
ENTRY_SIZE = 20
INVALID_INDEX = 0
_INT32_MAX = 0x7FFFFFFF
VECTORIZE_MIN = 64  # below this many keys per round the plain loop is faster


@functools.cache
def _entry_dtype() -> _np.dtype:
    return _np.dtype([("hash", ">i4"), ("phys", ">i8"), ("diff", ">i4"), ("prev", ">i4")])


def index_file_size(slot_count: int, entry_count: int) -> int:
    return HEADER_SIZE + slot_count * SLOT_SIZE + entry_count * ENTRY_SIZE


def index_file_name(ms: int) -> str:
    """yyyyMMddHHmmssSSS in local time, as UtilAll.timeMillisToHumanString."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"


def index_name_ms(name: str) -> int:
    """The local time (ms) an index file name stands for."""
    return int(time.mktime(time.strptime(name[:14], "%Y%m%d%H%M%S"))) * 1000 + int(name[14:17])


def index_key_hash(topic: str, key: str) -> int:
    """abs(hashCode(topic + "#" + key)), Integer.MIN_VALUE -> 0."""
    return positive_index_hash(java_hash_u32(f"{topic}#{key}"))


class IndexFile:
    """One index file, mapped read-write (the writer) or read-only (queries)."""

    def __init__(self, path: Path, slot_count: int, entry_count: int, writable: bool):
        self.path = path
        self.slot_count = slot_count
        self.entry_count = entry_count
        size = index_file_size(slot_count, entry_count)
        actual = os.path.getsize(path)
        if actual != size:
            raise ValueError(f"index file {path} is {actual} bytes, expected {size} for "
                             f"{slot_count} slots and {entry_count} entries")
        self.file = MappedFile(path, 0, size, writable)
        self.mm = self.file.mm
        if not writable:
            # a query touches a slot and a few entries of each file: without this each cold page
            # faults in read_ahead_kb around it (8 MiB on a virtio disk) instead of itself
            self.mm.madvise(mmap.MADV_RANDOM)
        (self.begin_timestamp, self.end_timestamp, self.begin_phy, self.end_phy,
         self.slots_used, self.count) = HEADER.unpack_from(self.mm, 0)
        if self.count < 1:
            self.count = 1  # a fresh file
        self._entries_at = HEADER_SIZE + slot_count * SLOT_SIZE
        # only the entry area is ever released from RSS: slots are hit at random
        self.file.released = -(-self._entries_at // 4096) * 4096

    @classmethod
    def create(cls, path: Path, slot_count: int, entry_count: int, begin_phy: int = 0,
               begin_timestamp: int = 0) -> IndexFile:
        """A new, reserved file; begin/end start at the previous file's end, as Java's does."""
        create_segment(path, index_file_size(slot_count, entry_count))
        f = cls(path, slot_count, entry_count, writable=True)
        f.begin_phy = f.end_phy = begin_phy
        f.begin_timestamp = f.end_timestamp = begin_timestamp
        f.write_header()
        return f

    @property
    def full(self) -> bool:
        return self.count >= self.entry_count

    def write_header(self) -> None:
        HEADER.pack_into(self.mm, 0, self.begin_timestamp, self.end_timestamp, self.begin_phy, self.end_phy,
                         self.slots_used, self.count)

    def refresh_header(self) -> None:
        """Re-read the header (a reader following a file that is still being written)."""
        (self.begin_timestamp, self.end_timestamp, self.begin_phy, self.end_phy,
         self.slots_used, self.count) = HEADER.unpack_from(self.mm, 0)

    def put_many(self, items: list[tuple[int, int, int]], start: int = 0) -> int:
        """IndexFile.putKey for items[start:] = (positive key hash, phyOffset, storeTimestamp);
        returns the index of the first item that did not fit (len(items) when all did)."""
        count = self.count
        room = self.entry_count - count
        stop = min(len(items), start + max(room, 0))
        mm = self.mm
        slot_count = self.slot_count
        entries_at = self._entries_at
        unpack_slot = SLOT.unpack_from
        pack_slot = SLOT.pack_into
        pack_entry = ENTRY.pack_into
        begin_ts = self.begin_timestamp
        used = self.slots_used
        phys = ts = 0
        for i in range(start, stop):
            key_hash, phys, ts = items[i]
            slot_pos = HEADER_SIZE + (key_hash % slot_count) * SLOT_SIZE
            prev = unpack_slot(mm, slot_pos)[0]
            if prev <= INVALID_INDEX or prev > count:
                prev = INVALID_INDEX
                used += 1
            if count <= 1:
                self.begin_phy = phys
                self.begin_timestamp = begin_ts = ts
            diff = (ts - begin_ts) // 1000 if begin_ts > 0 else 0
            pack_entry(mm, entries_at + count * ENTRY_SIZE, key_hash, phys,
                       0 if diff < 0 else (diff if diff < _INT32_MAX else _INT32_MAX), prev)
            pack_slot(mm, slot_pos, count)
            count += 1
        if stop > start:
            self.count = count
            self.slots_used = used
            self.end_phy = phys
            self.end_timestamp = ts
        return stop

    def put_many_vectorized(self, hashes: _np.ndarray, phys: _np.ndarray, timestamps: _np.ndarray) -> int:
        """put_many over numpy int64 arrays, bit-identical to it; returns how many fit."""
        np = _np
        count = self.count
        n = min(len(hashes), self.entry_count - count)
        if n <= 0:
            return 0
        h, p, t = hashes[:n], phys[:n], timestamps[:n]
        idx = np.arange(count, count + n, dtype=np.int64)
        slots = h % self.slot_count
        slot_area = np.frombuffer(self.mm, dtype=">i4", count=self.slot_count, offset=HEADER_SIZE)
        # Each entry's prevIndex is the previous entry of the batch with the same slot, or the
        # slot's value before the batch (if valid); each slot ends up holding its last entry.
        old = slot_area[slots].astype(np.int64)
        slot_area[slots] = idx
        if (slot_area[slots] == idx).all():  # no slot twice in the batch (the usual case)
            prev = old
            first: slice | _np.ndarray = slice(None)
        else:
            order = np.argsort(slots, kind="stable")
            sorted_slots = slots[order]
            boundary = sorted_slots[1:] != sorted_slots[:-1]
            first = np.concatenate(([True], boundary))
            last = np.concatenate((boundary, [True]))
            prev_sorted = np.empty(n, np.int64)
            prev_sorted[1:] = idx[order][:-1]
            prev_sorted[first] = old[order][first]
            prev = np.empty(n, np.int64)
            prev[order] = prev_sorted
            first = order[first]
            slot_area[sorted_slots[last]] = idx[order][last]
        invalid = (old[first] <= INVALID_INDEX) | (old[first] > count)
        prev[first] = np.where(invalid, INVALID_INDEX, prev[first])
        if count <= 1:
            self.begin_phy = int(p[0])
            self.begin_timestamp = int(t[0])
        begin_ts = self.begin_timestamp
        diff = np.clip((t - begin_ts) // 1000, 0, _INT32_MAX) if begin_ts > 0 else 0
        entries = np.frombuffer(self.mm, dtype=_entry_dtype(), count=n, offset=self._entries_at + count * ENTRY_SIZE)
        entries["hash"] = h
        entries["phys"] = p
        entries["diff"] = diff
        entries["prev"] = prev
        del slot_area, entries  # no numpy view may outlive the call (the map must stay closable)
        self.count = count + n
        self.slots_used += int(invalid.sum())
        self.end_phy = int(p[-1])
        self.end_timestamp = int(t[-1])
        return n

    def time_matched(self, begin: int, end: int) -> bool:
        return self.begin_timestamp <= end and self.end_timestamp >= begin

    def select(self, key_hash: int, begin: int, end: int, max_num: int, out: list[int]) -> None:
        """Append to out the phyOffsets of entries with this hash whose (second-granular) time
        is within [begin, end], newest first, until out holds max_num."""
        count = min(self.count, self.entry_count)  # a corrupt header cannot send us off the map
        mm = self.mm
        nxt = SLOT.unpack_from(mm, HEADER_SIZE + (key_hash % self.slot_count) * SLOT_SIZE)[0]
        if nxt <= INVALID_INDEX or nxt >= count or count <= 1:
            return
        begin_ts = self.begin_timestamp
        base = self._entries_at
        while len(out) < max_num:
            h, phys, diff, prev = ENTRY.unpack_from(mm, base + nxt * ENTRY_SIZE)
            if diff < 0:
                break
            t = begin_ts + diff * 1000
            if h == key_hash and begin <= t <= end:
                out.append(phys)
            # prev must go strictly backwards: a corrupt chain can never loop
            if prev <= INVALID_INDEX or prev >= nxt or t < begin:
                break
            nxt = prev

    def release_entries(self, interval: int) -> None:
        """Drop written entry pages from this process's RSS once interval bytes piled up."""
        upto = self._entries_at + self.count * ENTRY_SIZE
        if upto - self.file.released >= interval:
            self.file.release(upto)

    def flush(self) -> None:
        self.file.flush(0, self.file.size)

    def close(self) -> None:
        self.file.close()


def list_index_files(directory: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if len(n) == 17 and n.isdigit())
    except FileNotFoundError:
        return []


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class IndexService:
    """The writer side (dispatch actor): builds entries for UNIQ_KEY and each KEYS token."""

    def __init__(self, directory: Path | str, slot_count: int, entry_count: int,
                 clock: Callable[[], int] = _now_ms, release_interval: int = 16 * 1024 * 1024,
                 vectorize: bool = True):
        self.directory = Path(directory)
        self.vectorize = vectorize and _np is not None  # numpy for large rounds, when installed
        self._release_interval = release_interval
        self.slot_count = slot_count
        self.entry_count = entry_count
        self._clock = clock
        self._prefix: dict[bytes, int] = {}
        # keys queued by add() for the next publish(), as parallel lists
        self._topics: list[bytes] = []
        self._keys: list[bytes] = []
        self._phys: list[int] = []
        self._stamps: list[int] = []
        self.current: IndexFile | None = None
        names = list_index_files(self.directory)
        if names:
            self.current = IndexFile(self.directory / names[-1], slot_count, entry_count, writable=True)
        # records at or below this offset are already indexed (re-dispatch after recovery)
        self.indexed_upto = self.current.end_phy if self.current and self.current.count > 1 else -1
        self._dirty: list[IndexFile] = []  # rolled files not flushed yet

    def forget_beyond(self, end: int) -> None:
        """After the CommitLog was cut at end: records from end on are new and must be indexed
        (entries for the cut ones stay, harmless: queries check every hit against its record)."""
        if self.indexed_upto >= end:
            self.indexed_upto = end - 1
            if self.current is not None:
                self.current.end_phy = end - 1
                self.current.write_header()

    def add(self, topic: bytes, keys: bytes, uniq_key: bytes, phys: int, store_timestamp: int) -> None:
        """Queue one record's keys (UNIQ_KEY and each KEYS token); publish() writes them."""
        if phys <= self.indexed_upto:
            return
        if uniq_key:
            self._topics.append(topic)
            self._keys.append(uniq_key)
            self._phys.append(phys)
            self._stamps.append(store_timestamp)
        if keys:
            for key in keys.split(b" "):
                if key:
                    self._topics.append(topic)
                    self._keys.append(key)
                    self._phys.append(phys)
                    self._stamps.append(store_timestamp)

    def settle(self) -> None:
        """After a failed dispatch round, which will run again: publish the keys of the records
        it got through, and skip those records when it does (no entry goes in twice)."""
        self.publish()
        if self.current is not None and self.current.count > 1:
            self.indexed_upto = max(self.indexed_upto, self.current.end_phy)

    def put_hashed(self, hashes: _np.ndarray, phys: _np.ndarray, stamps: _np.ndarray) -> None:
        """Write entries for keys already hashed (positive index hashes, phyOffsets, store
        timestamps: int64 numpy arrays, in add() order) right away; offsets the index already
        covers are skipped. The next publish() makes them visible."""
        if self._keys:
            self._write_pending()  # add()ed keys come first
        if self.indexed_upto >= 0:
            fresh = phys > self.indexed_upto
            hashes, phys, stamps = hashes[fresh], phys[fresh], stamps[fresh]
        i = 0
        while i < len(hashes):
            f = self.current if self.current is not None and not self.current.full else self._roll()
            i += f.put_many_vectorized(hashes[i:], phys[i:], stamps[i:])

    def _write_pending(self) -> None:
        topics, keys, phys, stamps = self._topics, self._keys, self._phys, self._stamps
        self._topics, self._keys, self._phys, self._stamps = [], [], [], []
        hashes = None
        if self.vectorize and len(keys) >= VECTORIZE_MIN:
            hashes = index_hashes_vectorized(topics, keys, self._prefix)
        if hashes is not None:
            self.put_hashed(hashes, _np.array(phys, _np.int64), _np.array(stamps, _np.int64))
            return
        items = list(zip(index_hashes(topics, keys, self._prefix), phys, stamps))
        i = 0
        while i < len(items):
            f = self.current if self.current is not None and not self.current.full else self._roll()
            i = f.put_many(items, i)

    def prefix_hash(self, topic: bytes) -> int:
        """Unsigned hash of ``topic#``, from this service's cache."""
        return prefix_hash(topic, self._prefix)

    def _roll(self) -> IndexFile:
        old = self.current
        begin_phy = begin_ts = 0
        name_ms = self._clock()
        if old is not None:
            old.write_header()
            old.file.release_all()              # written for good: out of RSS, slots too (cached for the flush)
            self._dirty.append(old)
            begin_phy, begin_ts = old.end_phy, old.end_timestamp
            # names sort in creation order even if the clock steps back or two rolls share a ms
            last = old.path.name
            name_ms = max(name_ms, index_name_ms(last) + 1)
            while index_file_name(name_ms) <= last:  # a DST fold can still map back
                name_ms += 1000
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / index_file_name(name_ms)
        while path.exists():
            name_ms += 1
            path = self.directory / index_file_name(name_ms)
        self.current = IndexFile.create(path, self.slot_count, self.entry_count, begin_phy, begin_ts)
        log.info("index file %s created", path.name)
        return self.current

    def publish(self) -> None:
        """Write the queued entries, then the current file's header: they become visible."""
        if self._keys:
            self._write_pending()
        if self.current is not None:
            self.current.write_header()
            self.current.release_entries(self._release_interval)

    def flush(self) -> int:
        """msync rolled files and the current one; returns the index timestamp for the
        checkpoint (end time of the newest flushed entry; 0 if none)."""
        self.publish()
        for f in self._dirty:
            f.flush()
            f.close()
        self._dirty.clear()
        if self.current is None:
            return 0
        self.current.flush()
        return self.current.end_timestamp

    def close(self) -> None:
        self.publish()
        for f in self._dirty:
            f.close()
        self._dirty.clear()
        if self.current is not None:
            self.current.close()
            self.current = None


class IndexReader:
    """Queries over every index file, for any process (maps files read-only, on demand)."""

    def __init__(self, directory: Path | str, slot_count: int, entry_count: int):
        self.directory = Path(directory)
        self.slot_count = slot_count
        self.entry_count = entry_count
        self._files: dict[str, IndexFile] = {}

    def query(self, topic: str, key: str, max_num: int, begin: int, end: int) -> tuple[list[int], int, int]:
        """(phyOffsets newest first, index last update timestamp, index last update phyOffset)
        as IndexService.queryOffset. Offsets may belong to colliding keys: verify them."""
        names = list_index_files(self.directory)
        for gone in set(self._files) - set(names):
            self._files.pop(gone).close()
        key_hash = index_key_hash(topic, key)
        out: list[int] = []
        last_ts = last_phy = 0
        for i, name in enumerate(reversed(names)):
            f = self._files.get(name)
            if f is None:
                try:
                    f = self._files[name] = IndexFile(self.directory / name, self.slot_count, self.entry_count,
                                                      writable=False)
                except (FileNotFoundError, ValueError) as exc:
                    log.warning("index file %s skipped: %s", name, exc)
                    continue
            f.refresh_header()
            if i == 0:
                last_ts, last_phy = f.end_timestamp, f.end_phy
            if f.time_matched(begin, end):
                f.select(key_hash, begin, end, max_num, out)
            if f.begin_timestamp < begin or len(out) >= max_num:
                break
        return out, last_ts, last_phy

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
