"""ConsumeQueue: entry layout, rolling, holes, head deletion, bounds, recovery."""

from __future__ import annotations

import os

import pytest

from smartgo.store import ConsumeQueueReader, ConsumeQueueWriter, OffsetGoneError, StoreConfig
from smartgo.store.consume_queue import ENTRY, HOLE_SIZE, ConsumeQueueSet, list_queues
from smartgo.store.mapped_file import segment_name


def test_file_size_rounds_up_to_whole_entries(tmp_path):
    assert StoreConfig(store_path=str(tmp_path), consume_queue_file_size=1024).consume_queue_file_size == 1040
    assert StoreConfig(store_path=str(tmp_path)).consume_queue_file_size == 6_000_000
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 1024)
    cq.put(0, 0, 100, 0)
    assert os.path.getsize(tmp_path / "T" / "0" / segment_name(0)) == 1040
    cq.close()


def test_entries_roll_and_read_back(tmp_path):
    cq = ConsumeQueueWriter(tmp_path, "T", 3, 100)  # 5 entries per file
    for i in range(12):
        assert cq.put(i, 1000 + i * 50, 50, i % 3)
    assert cq.max_offset == 12 and cq.max_phys_end == 1000 + 11 * 50 + 50
    assert sorted(os.listdir(tmp_path / "T" / "3")) == [segment_name(0), segment_name(100), segment_name(200)]
    with open(tmp_path / "T" / "3" / segment_name(100), "rb") as f:
        assert ENTRY.unpack(f.read(20)) == (1000 + 5 * 50, 50, 5 % 3)  # offset 5 at byte 100
    reader = ConsumeQueueReader(tmp_path, "T", 3, 100)
    got = []
    off = 0
    while off < 12:
        raw = reader.entries(off, 32, 12)
        got.extend(ENTRY.iter_unpack(raw))
        off += len(raw) // 20
    assert got == [(1000 + i * 50, 50, i % 3) for i in range(12)]
    assert len(reader.entries(3, 32, 4)) == 20  # never past the bound
    assert len(reader.entries(4, 32, 4)) == 0
    assert not cq.put(5, 0, 1, 0)  # already there: skipped (idempotent re-dispatch)
    cq.close()
    reader.close()


def test_queue_starting_mid_file_is_hole_filled(tmp_path):
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 100)
    cq.put(7, 5000, 60, 1)
    assert cq.max_offset == 8
    reader = ConsumeQueueReader(tmp_path, "T", 0, 100)
    assert [reader.entry(i) for i in (5, 6)] == [(0, HOLE_SIZE, 0)] * 2
    assert reader.entry(7) == (5000, 60, 1)
    assert reader.min_offset(0, 8) == 7
    with pytest.raises(OffsetGoneError):
        reader.entries(2, 5, 8)  # the file of offsets 0..4 never existed
    cq.close()
    reader.close()


def test_gap_in_a_live_queue_is_filled_with_holes(tmp_path):
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 100)
    cq.put(0, 0, 10, 0)
    cq.put(3, 30, 10, 0)
    reader = ConsumeQueueReader(tmp_path, "T", 0, 100)
    assert [reader.entry(i)[1] for i in range(4)] == [10, HOLE_SIZE, HOLE_SIZE, 10]
    cq.close()
    reader.close()


def test_gap_longer_than_a_file_is_a_corrupt_offset_and_skipped(tmp_path, caplog):
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 100)
    cq.put(0, 0, 10, 0)
    assert not cq.put(1 << 40, 10, 10, 0)
    assert cq.max_offset == 1 and "far beyond" in caplog.text
    assert cq.files.starts() == [0]
    cq.close()


def test_min_offset_follows_head_deletion_and_commitlog_min(tmp_path):
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 100)
    for i in range(12):
        cq.put(i, i * 100, 100, 0)
    reader = ConsumeQueueReader(tmp_path, "T", 0, 100)
    assert reader.min_offset(0, 12) == 0
    assert reader.min_offset(250, 12) == 3  # entries below the CommitLog minimum are gone
    cq.files.delete_files_before(100)
    reader.files.forget_before(100)
    assert reader.min_offset(0, 12) == 5
    with pytest.raises(OffsetGoneError):
        reader.entries(0, 5, 12)
    assert reader.min_offset(10_000, 12) == 12  # everything expired: empty
    cq.close()
    reader.close()


def test_writer_reopens_at_its_end_and_recover_cuts_bad_entries(tmp_path):
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 100)
    for i in range(7):
        cq.put(i, i * 10, 10, 0)
    cq.close()
    again = ConsumeQueueWriter(tmp_path, "T", 0, 100)
    assert again.max_offset == 7 and again.max_phys_end == 70
    assert again.recover(lambda off, phys, size: phys < 40, 10**9)  # True: entries were lost
    assert again.max_offset == 4
    again.close()
    reader = ConsumeQueueReader(tmp_path, "T", 0, 100)
    assert reader.files.starts() == [0]  # the second file held only cut entries
    reader.close()
    third = ConsumeQueueWriter(tmp_path, "T", 0, 100)
    assert third.max_offset == 4 and third.put(4, 40, 10, 0)
    for i in range(5, 17):
        third.put(i, i * 10, 10, 0)
    # entries pointing past the end are cut even in files older than the third-last one
    assert third.recover(lambda off, phys, size: True, 25) and third.max_offset == 2
    assert not third.recover(lambda off, phys, size: True, 25)  # already clean: nothing lost
    third.close()


def test_queue_set_discovers_queues(tmp_path):
    for topic, qid in (("A", 0), ("A", 3), ("%RETRY%g", 0)):
        w = ConsumeQueueWriter(tmp_path, topic, qid, 100)
        w.put(0, 0, 1, 0)
        w.close()
    assert list_queues(tmp_path) == [("%RETRY%g", 0), ("A", 0), ("A", 3)]
    qs = ConsumeQueueSet(tmp_path, 100)
    assert qs.max_offsets() == {("%RETRY%g", 0): 1, ("A", 0): 1, ("A", 3): 1}
    qs.close()


def test_min_offset_ignores_gap_holes_after_live_entries(tmp_path):
    # Found by the crash property test: recovery turned a corrupt queue offset into a gap
    # filled with holes after live entries; the live entry before it must stay readable.
    w = ConsumeQueueWriter(tmp_path, "T", 0, 20 * 64)
    w.put(0, 1000, 100, 7)
    w.put(3, 1300, 100, 7)  # offsets 1 and 2 become gap holes
    r = ConsumeQueueReader(tmp_path, "T", 0, 20 * 64)
    assert r.entry(1)[1] == HOLE_SIZE
    assert r.min_offset(0, 4) == 0
    assert r.min_offset(1100, 4) == 3  # the first live entry at or past the CommitLog minimum


def test_zero_fill_ahead_never_touches_written_entries(tmp_path, monkeypatch):
    """The writer keeps the bytes ahead of it written with zeros (ext4 makes a first store through
    the mapping slow otherwise): every fill starts at a page boundary past the last entry, stays
    in the current file, and the entries read back intact across files, put and put_entries alike."""
    from smartgo.store import mapped_file
    from smartgo.store.mapped_file import WARM_AHEAD, zero_fill
    fills = []

    def recording(path, start, stop):
        fills.append((os.path.basename(path), start, stop, cq.max_offset * 20 % file_size))
        zero_fill(path, start, stop)
    monkeypatch.setattr(mapped_file, "zero_fill", recording)
    file_size = 300_000                                  # 15,000 entries a file
    cq = ConsumeQueueWriter(tmp_path, "T", 0, file_size)
    n = 0
    for i in range(40_000):
        if i % 3:
            assert cq.put(n, 64 * n, 64, n % 7)
            n += 1
        else:
            assert cq.put_entries(n, b"".join(ENTRY.pack(64 * k, 64, k % 7) for k in range(n, n + 4)))
            n += 4
    assert len(fills) > 20
    for name, start, stop, written in fills:
        assert start % 4096 == 0 and start >= written or written == 0, (name, start, written)
        assert start < stop <= file_size and stop - start <= WARM_AHEAD
    assert {name for name, *_ in fills} >= {segment_name(0), segment_name(file_size)}
    reader = ConsumeQueueReader(tmp_path, "T", 0, file_size)
    got, off = [], 0
    while off < n:
        raw = reader.entries(off, 1000, n)
        got.extend(ENTRY.iter_unpack(raw))
        off += len(raw) // 20
    assert got == [(64 * k, 64, k % 7) for k in range(n)]
    cq.close()
