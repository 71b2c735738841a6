"""MappingLimit: a process touching more ConsumeQueues than it may keep mapped unmaps the least
recently used file and maps it again when it comes back, with nothing lost either way."""

from __future__ import annotations

import gc
import os

import pytest

from smartgo.store import StoreConfig, StoreReader
from smartgo.store.consume_queue import ENTRY, ConsumeQueueSet
from smartgo.store.mapped_file import MappingLimit

QUEUES = 60
PER_FILE = 8                 # entries per ConsumeQueue file: the writes below roll files too
LIMIT = MappingLimit.MIN_MAPPINGS


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def phys(q: int, i: int) -> int:
    return q * 1_000_000 + i * 100


@pytest.mark.timeout(30)
def test_writers_beyond_the_limit_keep_every_entry_within_it(tmp_path):
    gc.collect()                # descriptors of earlier tests' unreferenced maps: not closed during this one
    before = open_files()
    qs = ConsumeQueueSet(tmp_path, 20 * PER_FILE, mapped_files=LIMIT)
    peak = 0
    for i in range(2 * PER_FILE + 3):                   # round robin: every write finds its file unmapped
        for q in range(QUEUES):
            assert qs.get("T", q).put(i, phys(q, i), 100, q)
            peak = max(peak, len(qs.limit))
        qs.get("T", 0).put_entries(qs.get("T", 0).max_offset, b"")  # a no-op keeps its state too
    assert peak == LIMIT and open_files() - before <= LIMIT
    qs.close()
    assert len(qs.limit) == 0 and open_files() == before
    reopened = ConsumeQueueSet(tmp_path, 20 * PER_FILE, mapped_files=LIMIT)
    assert reopened.max_offsets() == {("T", q): 2 * PER_FILE + 3 for q in range(QUEUES)}
    reopened.close()


@pytest.mark.timeout(30)
def test_readers_beyond_the_limit_read_everything_and_views_outlive_the_unmapping(tmp_path):
    cfg = StoreConfig(store_path=str(tmp_path), consume_queue_file_size=20 * PER_FILE, mapped_queue_files=LIMIT)
    qs = ConsumeQueueSet(cfg.consume_queue_dir, cfg.consume_queue_file_size)
    for q in range(QUEUES):
        for i in range(PER_FILE + 2):
            qs.get("T", q).put(i, phys(q, i), 100, q)
    qs.close()
    reader = StoreReader(cfg)
    held = reader.queue("T", 0).entries(0, 4, PER_FILE)   # a pull's entries, still in use
    before = open_files()
    for rnd in range(2):
        first, stop = PER_FILE * rnd, min(PER_FILE * (rnd + 1), PER_FILE + 2)    # one file each round
        for q in range(QUEUES):
            raw = reader.queue("T", q).entries(first, PER_FILE, PER_FILE + 2)
            assert list(ENTRY.iter_unpack(raw)) == [(phys(q, i), 100, q) for i in range(first, stop)]
    assert open_files() - before <= LIMIT
    assert [e[0] for e in ENTRY.iter_unpack(held)] == [phys(0, i) for i in range(4)]
    held.release()
