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


def _write_mixed(cq: ConsumeQueueWriter, n: int, count: int) -> int:
    """count rounds of put, put_entries of 4 and, every 97th, put_entries of 5,000 entries
    (100 kB: more than WARM_AHEAD at once); returns the new max offset."""
    for i in range(count):
        if i % 97 == 96:
            size = 5_000
        elif i % 3:
            assert cq.put(n, 64 * n, 64, n % 7)
            n += 1
            continue
        else:
            size = 4
        assert cq.put_entries(n, b"".join(ENTRY.pack(64 * k, 64, k % 7) for k in range(n, n + size)))
        n += size
    return n


def test_every_store_lands_on_bytes_written_before_it(tmp_path, monkeypatch):
    """ConsumeQueue files are sparse: a store through the mapping into bytes without blocks
    would be a SIGBUS on a full disk (and is slow on ext4 anyway). So every entry's bytes are
    written with zeros before it is stored: each fill starts at or past the stored end of its
    file at that moment (read from the file), and the fills cover every entry - across files,
    puts larger than the window, a recovery truncation mid-page and a reopened writer."""
    from smartgo.store import mapped_file
    from smartgo.store.mapped_file import zero_fill
    file_size = 300_000                                  # 15,000 entries a file
    fills: dict[str, list[tuple[int, int]]] = {}

    def stored_end(path) -> int:
        with open(path, "rb") as f:
            sizes = [e[1] for e in ENTRY.iter_unpack(f.read())]
        return 20 * next((i for i, size in enumerate(sizes) if size == 0), len(sizes))

    def recording(path, start, stop):
        assert start >= stored_end(path), (path, start, stored_end(path))
        fills.setdefault(os.path.basename(path), []).append((start, stop))
        zero_fill(path, start, stop)
    monkeypatch.setattr(mapped_file, "zero_fill", recording)
    cq = ConsumeQueueWriter(tmp_path, "T", 0, file_size)
    n = _write_mixed(cq, 0, 20_000)
    cut = n - 1_234                                      # recovery: entries from here go
    assert cut * 20 % 4096 and cut * 20 // file_size == n * 20 // file_size
    name = segment_name(cut * 20 - cut * 20 % file_size)
    fills[name] = [(a, min(b, cut * 20 % file_size)) for a, b in fills.get(name, [])]   # truncate frees the rest
    cq.truncate_entries(cut)
    cq.close()
    cq = ConsumeQueueWriter(tmp_path, "T", 0, file_size)     # resumes mid-page of the last file
    assert cq.max_offset == cut
    n = _write_mixed(cq, cut, 3_000)
    directory = tmp_path / "T" / "0"
    names = sorted(os.listdir(directory))
    assert len(names) >= 3 and len(fills) >= 3
    for name in names:
        covered = sorted(fills.get(name, []))
        upto = 0
        for a, b in covered:
            assert a <= upto, (name, a, upto)                   # no gap below the stored end
            upto = max(upto, b)
        assert upto >= stored_end(directory / name), (name, upto)
    reader = ConsumeQueueReader(tmp_path, "T", 0, file_size)
    got, off = [], 0
    while off < n:
        raw = reader.entries(off, 1000, n)
        got.extend(ENTRY.iter_unpack(raw))
        off += len(raw) // 20
    assert got == [(64 * k, 64, k % 7) for k in range(n)]
    cq.close()


def test_queue_files_take_disk_only_as_they_fill(tmp_path):
    """A topic's queues do not reserve their whole files (6 MB each by default) up front: a
    1,024-queue topic would hold 6 GB of disk for its first messages."""
    from smartgo.store.mapped_file import WARM_AHEAD
    cqs = [ConsumeQueueWriter(tmp_path, "T", q, 6_000_000) for q in range(8)]
    for cq in cqs:
        for i in range(1_000):
            cq.put(i, 100 * i, 100, 0)
    for q, cq in enumerate(cqs):
        st = os.stat(tmp_path / "T" / str(q) / segment_name(0))
        assert st.st_size == 6_000_000
        assert st.st_blocks * 512 <= 20_000 + 2 * WARM_AHEAD + 8192, st.st_blocks
        cq.close()


def test_disk_full_ahead_of_the_writer_is_an_error_not_a_crash(tmp_path, monkeypatch):
    """When the bytes ahead cannot be written (ENOSPC) the put raises DiskFullError before
    storing anything; once there is room again the queue goes on where it stopped."""
    import errno
    from smartgo.store import DiskFullError
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 6_000_000)
    n = 0
    while n * 20 < 40_000:                               # filled while there is room
        assert cq.put(n, 10 * n, 10, 0)
        n += 1
    real = os.pwrite

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(DiskFullError, match="disk full"):
        for _ in range(10_000):
            cq.put(n, 10 * n, 10, 0)
            n += 1
    assert cq.max_offset == n
    monkeypatch.setattr(os, "pwrite", real)
    for _ in range(5_000):
        assert cq.put(n, 10 * n, 10, 0)
        n += 1
    reader = ConsumeQueueReader(tmp_path, "T", 0, 6_000_000)
    assert [e[0] for e in ENTRY.iter_unpack(reader.entries(n - 6_000, 6_000, n))] == \
        [10 * k for k in range(n - 6_000, n)]
    cq.close()


def _mapping_rss(path) -> int:
    """Bytes of path's mappings resident in this process (/proc/self/smaps)."""
    rss, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head[0]) > 8 and not line.startswith(("Rss", "Pss")):
                inside = line.rstrip().endswith(str(path))
            elif inside and head[0] == "Rss:":
                rss += int(head[1]) * 1024
    return rss


def test_written_pages_leave_the_writers_rss(tmp_path):
    """Dispatch writes a busy queue's 6 MB file through its mapping: the pages behind the
    writer leave its RSS as it goes (128 busy queues held 710 MB of dispatch's RSS at 100M
    messages); what is written stays readable."""
    from smartgo.store.consume_queue import RELEASE_STEP
    from smartgo.store.mapped_file import WARM_AHEAD
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 6_000_000)
    batch = 32
    n = 0
    while n + batch <= 290_000:
        cq.put_entries(n, b"".join(ENTRY.pack(64 * k, 64, 1) for k in range(n, n + batch)))
        n += batch
    for _ in range(2_000):
        cq.put(n, 64 * n, 64, 1)
        n += 1
    path = tmp_path / "T" / "0" / segment_name(0)
    assert 0 < _mapping_rss(path) <= RELEASE_STEP + WARM_AHEAD + 2 * 4096, _mapping_rss(path)
    reader = ConsumeQueueReader(tmp_path, "T", 0, 6_000_000)
    assert reader.entry(0) == (0, 64, 1) and reader.entry(n - 1) == (64 * (n - 1), 64, 1)
    reader.close()
    cq.close()


def test_a_slow_queue_warms_only_the_pages_it_stores_into(tmp_path, monkeypatch):
    """Zeros written 64 KiB ahead of a queue that takes minutes to reach them are written back
    and evicted first: the store then waits for a disk read. A slow queue writes each page
    just before storing into it; a fast one keeps warming ahead."""
    from smartgo.store import consume_queue
    from smartgo.store.mapped_file import WARM_AHEAD
    fast = ConsumeQueueWriter(tmp_path, "Fast", 0, 6_000_000)
    monkeypatch.setattr(consume_queue, "WARM_FAST_S", 0.0)      # every warm comes "long" after the last
    slow = ConsumeQueueWriter(tmp_path, "Slow", 0, 6_000_000)
    for i in range(1_000):                                       # 20,000 bytes: 5 pages
        slow.put(i, 100 * i, 100, 0)
    monkeypatch.undo()
    for i in range(1_000):
        fast.put(i, 100 * i, 100, 0)

    def allocated(topic: str) -> int:
        return os.stat(tmp_path / topic / "0" / segment_name(0)).st_blocks * 512
    assert allocated("Slow") <= 5 * 4096, allocated("Slow")
    assert allocated("Fast") >= 20_000 + WARM_AHEAD // 2, allocated("Fast")
    reader = ConsumeQueueReader(tmp_path, "Slow", 0, 6_000_000)
    assert [e[0] for e in ENTRY.iter_unpack(reader.entries(0, 1_000, 1_000))] == [100 * k for k in range(1_000)]
    reader.close()
    slow.close()
    fast.close()


def test_a_queue_mapped_again_stores_without_reading_its_evicted_tail(tmp_path):
    """Dispatch maps at most mapped_queue_files queue files: 10,000 queues written in turn are
    each unmapped between their batches, and with the page cache full their partly written
    last page is evicted meanwhile. A store into it then waited for a disk read in dispatch's
    loop (~200 major faults a second at 100M messages). The writer keeps that page's bytes
    when its mapping goes and writes them back whole (no read) before storing again."""
    import resource
    from smartgo.store.mapped_file import MappingLimit
    limit = MappingLimit(16)
    cqs = [ConsumeQueueWriter(tmp_path, "Wide", q, 6_000_000, limit) for q in range(40)]
    for cq in cqs:                                    # 30 entries: the last page is partly written
        cq.put_entries(0, b"".join(ENTRY.pack(100 * k, 100, 0) for k in range(30)))
    faults_before = 0
    for cq in cqs[:20]:                               # unmapped by now: drop their pages from the cache
        fd = os.open(tmp_path / "Wide" / str(cq.key[1]) / segment_name(0), os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    for cq in cqs[:20]:
        cq.put_entries(30, b"".join(ENTRY.pack(100 * k, 100, 0) for k in range(30, 40)))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_majflt == faults_before
    for cq in cqs:
        cq.close()
    reader = ConsumeQueueReader(tmp_path, "Wide", 7, 6_000_000)
    assert [e[0] for e in ENTRY.iter_unpack(reader.entries(0, 100, 40))] == [100 * k for k in range(40)]
    reader.close()



def test_finding_a_cold_queue_end_reads_pages_not_the_read_ahead_around_them(tmp_path):
    """Recovery and dispatch find each queue's end in its last file. With the page cache full of
    CommitLog those pages are on disk, and a fault read the device's read-ahead around each one
    (8 MiB here: the whole 6 MB file); for 10,132 queues, 21-26 s against 6 s."""
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 6_000_000)
    n = 250_000
    for a in range(0, n, 1_000):
        cq.put_entries(a, b"".join(ENTRY.pack(100 * k, 100, 0) for k in range(a, a + 1_000)))
    cq.close()
    fd = os.open(tmp_path / "T" / "0" / segment_name(0), os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)

    def read_bytes() -> int:
        with open("/proc/self/io") as f:
            return int(next(line for line in f if line.startswith("read_bytes")).split()[1])
    before = read_bytes()
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 6_000_000)
    assert cq.max_offset == n and cq.offsets_below(100 * (n - 50)) == n - 50
    assert read_bytes() - before <= 256 << 10, read_bytes() - before
    cq.close()
