"""The ConsumeQueue flusher at thousands of queues: it syncs the files the new entries are in without
mapping any (a stop has nothing to unmap), counts each queue on the actor's progress counter (the
supervisor waits for a stop that still counts), and a round covers only what moved."""

from __future__ import annotations

import shutil
from array import array
from pathlib import Path

import pytest

from smartgo.store.consume_queue import ConsumeQueueSet, queue_dir
from smartgo.store.flush import ConsumeQueueFlusher

QUEUES = 3000
PER_FILE = 8


def mapped_under(root: Path) -> int:
    with open("/proc/self/maps") as f:
        return sum(str(root) in line for line in f)


@pytest.mark.timeout(60)
def test_thousands_of_dirty_queues_flush_without_mappings_and_count_progress(tmp_path):
    qs = ConsumeQueueSet(tmp_path, 20 * PER_FILE, mapped_files=64)
    for q in range(QUEUES):
        for i in range(PER_FILE + 2):                   # into each queue's second file
            assert qs.get("T", q).put(i, q * 1000 + i * 10, 10, 0)
    progress = array("q", [0])
    flusher = ConsumeQueueFlusher(tmp_path, 20 * PER_FILE, {("T", q): 3 for q in range(QUEUES)},
                                  progress=memoryview(progress))
    mapped = mapped_under(tmp_path)
    assert flusher.flush({("T", q): PER_FILE + 2 for q in range(QUEUES)}) == QUEUES
    assert progress[0] == QUEUES and mapped_under(tmp_path) == mapped
    shutil.rmtree(queue_dir(tmp_path, "T", 7))          # cleanup deleted a queue's files meanwhile
    assert qs.get("T", 1).put(PER_FILE + 2, 99_999, 10, 0)
    moved = {("T", q): PER_FILE + 2 for q in range(QUEUES)} | {("T", 1): PER_FILE + 3, ("T", 7): PER_FILE + 4}
    assert flusher.flush(moved) == 2                    # only what moved since the last round
    assert flusher.flush(moved) == 0 and progress[0] == QUEUES + 2
    flusher.close()
    qs.close()
