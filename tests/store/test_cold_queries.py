"""Queries on cold files read the pages they use, not a mapping's fault read-around (issue 47).

Counted, not timed: the bytes this process reads from the disk (/proc/self/io read_bytes) for
one query after its files were evicted from the page cache. A fault on a mapped cold page reads
read_ahead_kb around it (128 KiB by default, 8 MiB on this machine's virtio disk).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from smartgo.store import MessageStore, StoreReader
from smartgo.store.errors import CorruptRecordError, OffsetGoneError
from smartgo.store.index_file import IndexReader, IndexService, index_key_hash
from smartgo.store.point_reads import PointReads
from tests.store.conftest import Clock, small_config
from tests.store.test_message_store import msg

PAGE = 4096


def evict(*directories: Path) -> None:
    """Drop every file under the directories from the page cache (written back first)."""
    for d in directories:
        for p in d.rglob("*"):
            if p.is_file():
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def disk_read_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def cold(call, *directories: Path):
    """(call's result, bytes it read from the disk) with the directories' files evicted first."""
    evict(*directories)
    before = disk_read_bytes()
    result = call()
    return result, disk_read_bytes() - before


@pytest.mark.timeout(120)
def test_a_query_reads_a_few_pages_of_each_cold_index_file(tmp_path):
    slots, entries, files = 1 << 16, 1 << 18, 3       # ~6.5 MB a file, chains of 4 on average
    clock = iter(range(1_700_000_000_000, 1_700_000_000_000 + 100)).__next__
    svc = IndexService(tmp_path, slots, entries, clock=clock)
    rng = np.random.default_rng(47)
    wanted = index_key_hash("T", "the-key")
    n = files * (entries - 1)
    hashes = rng.integers(0, 1 << 31, n, dtype=np.int64)
    hashes[hashes == wanted] = wanted + 1
    hashes[7] = wanted                                 # in the oldest file: the query walks all three
    svc.put_hashed(hashes, np.arange(n, dtype=np.int64) * 100, 1_700_000_000_000 + np.arange(n, dtype=np.int64))
    svc.close()
    reader = IndexReader(tmp_path, slots, entries)
    try:
        (offsets, _, _), read = cold(lambda: reader.query("T", "the-key", 32, 0, 1 << 62), tmp_path)
        assert offsets == [700]
        # a header, a slot and ~4 entries of each file; the old mapping read >= 32 pages at its first fault
        assert 0 < read <= files * 12 * PAGE, f"{read} bytes read from disk for one query"
    finally:
        reader.close()


@pytest.mark.timeout(120)
def test_queries_by_key_and_by_time_read_a_few_pages_of_a_cold_store(tmp_path):
    cfg = small_config(tmp_path / "s", commitlog_file_size=4 << 20, consume_queue_file_size=20 * 100_000,
                       index_slot_count=1 << 16, index_entry_count=100_000)
    count = 30_000
    with MessageStore(cfg, clock=Clock()) as s:
        for i in range(0, count, 500):
            s.put_batch([msg(j, body=b"b" * 200) for j in range(i, i + 500)])
        written = s.written
        max_offset = s.max_offset("TopicA", 0)
    assert written > 2 * cfg.commitlog_file_size and max_offset == count
    reader = StoreReader(cfg)
    try:
        key_found, key_read = cold(lambda: reader.query_by_key("TopicA", "UNIQ00012345", 32, 0, 1 << 62, written),
                                   cfg.root)
        [record] = key_found.messages()
        assert record.queue_offset == 12_345 and record.body == b"b" * 200
        # the index header, a slot, an entry or two (chains of 0.5 on average) and the record
        assert 0 < key_read <= 8 * PAGE, f"{key_read} bytes read from disk for a query by key"
        reader.min_offset("TopicA", 0, max_offset)     # cached by the reader: the bisection alone is measured
        stamp = record.store_timestamp
        offset, time_read = cold(lambda: reader.search_offset_by_time("TopicA", 0, stamp, max_offset, written),
                                 cfg.root)
        assert offset == 12_000                         # the first of its batch: one store time a batch
        steps = max_offset.bit_length()
        # an entry and a record header a step; the old mappings read >= 32 pages at a fault
        assert 0 < time_read <= 2 * steps * PAGE, f"{time_read} bytes read from disk for a search by time"
    finally:
        reader.close()


def test_point_reads_return_whole_records_across_pages_and_refuse_the_rest(tmp_path):
    cfg = small_config(tmp_path / "s", commitlog_file_size=1 << 20)
    with MessageStore(cfg, clock=Clock()) as s:
        small = s.put(msg(1))
        big = s.put(msg(2, body=bytes(range(256)) * 40))            # 10 KiB: spans three pages
        written = s.written
        expected = [bytes(s.reader.commitlog.record_at(r.physical_offset, written)) for r in (small, big)]
    reader = StoreReader(cfg)
    try:
        with PointReads(reader.commitlog.files) as records:
            assert [records.record(r.physical_offset, written) for r in (small, big)] == expected
            with pytest.raises(CorruptRecordError):
                records.record(small.physical_offset + 4, written)      # no record starts there
            with pytest.raises(CorruptRecordError):
                records.record(big.physical_offset, written - 1)        # not all written
            with pytest.raises(OffsetGoneError):
                records.record(cfg.commitlog_file_size, written + cfg.commitlog_file_size)   # no such file
    finally:
        reader.close()
