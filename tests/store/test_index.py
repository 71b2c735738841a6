"""IndexFile and index service: exact layout, chains, collisions, time ranges, rolling."""

from __future__ import annotations

import os
import struct

import pytest

from smartgo.store.index_file import (
    ENTRY, HEADER, HEADER_SIZE, SLOT, IndexFile, IndexReader, IndexService, index_file_name, index_file_size,
    index_key_hash, index_name_ms, list_index_files,
)
from smartgo.store.java_hash import java_hash


def read_file(directory, name):
    with open(os.path.join(directory, name), "rb") as f:
        return f.read()


def test_layout_is_written_to_the_file(tmp_path):
    svc = IndexService(tmp_path, 7, 10, clock=lambda: 1_700_000_000_000, vectorize=False)
    svc.add(b"T", b"", b"U1", 100, 1_700_000_001_000)
    svc.add(b"T", b"k1 k2", b"", 200, 1_700_000_005_500)
    svc.publish()
    [name] = list_index_files(tmp_path)
    assert name == index_file_name(1_700_000_000_000) and len(name) == 17
    data = read_file(tmp_path, name)
    assert len(data) == index_file_size(7, 10) == 40 + 7 * 4 + 10 * 20
    begin_ts, end_ts, begin_phy, end_phy, slots_used, count = HEADER.unpack_from(data, 0)
    assert (begin_ts, end_ts, begin_phy, end_phy, count) == (1_700_000_001_000, 1_700_000_005_500, 100, 200, 4)
    keys = [("T", "U1"), ("T", "k1"), ("T", "k2")]
    hashes = [index_key_hash(t, k) for t, k in keys]
    assert hashes[0] == abs(java_hash("T#U1"))
    assert slots_used == len({h % 7 for h in hashes})
    entries = [ENTRY.unpack_from(data, HEADER_SIZE + 7 * 4 + n * 20) for n in (1, 2, 3)]
    assert [(h, phys, diff) for h, phys, diff, _prev in entries] == [(hashes[0], 100, 0), (hashes[1], 200, 4),
                                                                     (hashes[2], 200, 4)]
    for n, h in zip((1, 2, 3), hashes):  # each slot holds the newest entry of its chain
        newest = max(m for m, h2 in zip((1, 2, 3), hashes) if h2 % 7 == h % 7)
        assert struct.unpack_from(">i", data, HEADER_SIZE + (h % 7) * 4)[0] == newest
    svc.close()


def test_collisions_chain_and_reader_finds_both(tmp_path):
    svc = IndexService(tmp_path, 1, 50, vectorize=False)  # one slot: everything collides
    assert java_hash("T#Aa") == java_hash("T#BB")
    for i, key in enumerate([b"Aa", b"BB", b"Cc", b"Aa"]):
        svc.add(b"T", key, b"", 1000 + i, 1_700_000_000_000 + i * 1000)
    svc.publish()
    reader = IndexReader(tmp_path, 1, 50)
    offsets, last_ts, last_phy = reader.query("T", "Aa", 10, 0, 2**62)
    assert offsets == [1003, 1001, 1000]  # same hash: Aa and BB both come back, newest first
    assert (last_ts, last_phy) == (1_700_000_003_000, 1003)
    assert reader.query("T", "Cc", 10, 0, 2**62)[0] == [1002]
    assert reader.query("T", "Aa", 2, 0, 2**62)[0] == [1003, 1001]
    assert reader.query("Other", "Aa", 10, 0, 2**62)[0] == []
    svc.close()
    reader.close()


def test_time_range_uses_second_granular_diffs(tmp_path):
    svc = IndexService(tmp_path, 13, 50, vectorize=False)
    base = 1_700_000_000_000
    for i in range(10):
        svc.add(b"T", b"key", b"", i, base + i * 10_000)
    svc.publish()
    reader = IndexReader(tmp_path, 13, 50)
    assert reader.query("T", "key", 32, base + 20_000, base + 50_000)[0] == [5, 4, 3, 2]
    assert reader.query("T", "key", 32, base + 95_000, base + 99_000)[0] == []
    assert reader.query("T", "key", 32, 0, base)[0] == [0]
    svc.close()
    reader.close()


def test_roll_when_full_and_query_across_files(tmp_path):
    clock = iter(range(1_700_000_000_000, 1_700_000_000_000 + 100)).__next__
    svc = IndexService(tmp_path, 5, 4, clock=clock, vectorize=False)  # 3 entries per file
    for i in range(10):
        svc.add(b"T", b"k", b"", i * 10, 1_700_000_000_000 + i)
        svc.publish()
    names = list_index_files(tmp_path)
    assert len(names) == 4 and names == sorted(names)
    data = read_file(tmp_path, names[1])
    assert HEADER.unpack_from(data, 0)[2:4] == (30, 50) and HEADER.unpack_from(data, 0)[5] == 4
    reader = IndexReader(tmp_path, 5, 4)
    assert reader.query("T", "k", 100, 0, 2**62)[0] == [90, 80, 70, 60, 50, 40, 30, 20, 10, 0]
    svc.close()
    reader.close()


def test_index_file_names_are_local_time_and_parse_back():
    ms = 1_700_000_123_456
    assert index_name_ms(index_file_name(ms)) == ms
    assert index_file_name(ms).endswith("456")


def test_names_stay_ordered_when_the_clock_steps_back(tmp_path):
    times = iter([5_000_000, 4_000_000, 4_000_000])
    svc = IndexService(tmp_path, 3, 2, clock=lambda: next(times), vectorize=False)
    for i in range(3):
        svc.add(b"T", b"k", b"", i, 1)
        svc.publish()
    names = list_index_files(tmp_path)
    assert len(names) == 3 and names == sorted(names) and len(set(names)) == 3
    svc.close()


def test_vectorized_writes_identical_bytes(tmp_path):
    pytest.importorskip("numpy")
    items = [(b"Topic%d" % (i % 4), b"K%d" % (i % 37), b"UNIQ%05d" % i, i * 7, 1_700_000_000_000 + i * 300)
             for i in range(700)]
    dirs = []
    for vectorize in (False, True):
        d = tmp_path / str(vectorize)
        svc = IndexService(d, 97, 300, clock=lambda: 1_700_000_000_000, vectorize=vectorize)
        for j in range(0, len(items), 150):
            for topic, key, uniq, phys, ts in items[j:j + 150]:
                svc.add(topic, key, uniq, phys, ts)
            svc.publish()
        svc.close()
        dirs.append(d)
    names = [list_index_files(d) for d in dirs]
    assert names[0] == names[1] and len(names[0]) == 5
    for name in names[0]:
        assert read_file(dirs[0], name) == read_file(dirs[1], name)


@pytest.mark.parametrize("slots", [97, 100_003])  # collisions in a batch / (mostly) none
def test_vectorized_put_matches_put_many_with_stale_slots(tmp_path, slots):
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(slots)
    hashes = rng.integers(0, 2**31 - 1, 900)
    phys = np.arange(900, dtype=np.int64) * 50
    stamps = 1_700_000_000_000 + np.arange(900, dtype=np.int64) * 333
    files = []
    for vectorize in (False, True):
        path = tmp_path / f"{vectorize}"
        f = IndexFile.create(path, slots, 1000)
        for s in (3, 11, int(hashes[5] % slots)):  # stale slots point past the entries: invalid
            SLOT.pack_into(f.mm, HEADER_SIZE + s * 4, 950)
        for i in range(0, 900, 300):
            if vectorize:
                assert f.put_many_vectorized(hashes[i:i + 300], phys[i:i + 300], stamps[i:i + 300]) == 300
            else:
                items = list(zip(hashes[i:i + 300].tolist(), phys[i:i + 300].tolist(), stamps[i:i + 300].tolist()))
                assert f.put_many(items) == 300
        f.write_header()
        files.append((f.slots_used, path.read_bytes()))
        f.close()
    assert files[0] == files[1]


def test_corrupt_chain_never_loops(tmp_path):
    svc = IndexService(tmp_path, 1, 10, vectorize=False)
    for i in range(3):
        svc.add(b"T", b"x%d" % i, b"", i, 1_700_000_000_000)
    svc.publish()
    svc.close()
    path = tmp_path / list_index_files(tmp_path)[0]
    f = IndexFile(path, 1, 10, writable=True)
    struct.pack_into(">i", f.mm, HEADER_SIZE + 4 + 1 * 20 + 16, 3)  # entry 1 points forward to 3
    out = []
    f.select(index_key_hash("T", "nope"), 0, 2**62, 100, out)
    assert out == []
    f.close()


def test_reader_skips_index_files_of_another_size(tmp_path, caplog):
    svc = IndexService(tmp_path, 3, 5, vectorize=False)
    svc.add(b"T", b"k", b"", 1, 1)
    svc.close()
    reader = IndexReader(tmp_path, 7, 5)
    assert reader.query("T", "k", 5, 0, 2**62)[0] == []
    assert "skipped" in caplog.text
    reader.close()


def test_a_rolled_index_file_leaves_the_writers_rss(tmp_path):
    """Dispatch writes the newest index file only; each rolled one kept its slot table (20 MB at
    the defaults, every slot touched) and its unreleased entries in dispatch's RSS until the
    node stopped: ~100 MB at 100,000,000 messages. A rolled file's pages go at the roll (they
    stay in the page cache for the flush); it still answers queries."""
    svc = IndexService(tmp_path, 50_000, 100_000, release_interval=1 << 30)
    keys = [b"key%d" % i for i in range(150_000)]
    for i, key in enumerate(keys):
        svc.add(b"T", b"", key, 64 * i, 1_700_000_000_000 + i)
        if i % 1_000 == 999:
            svc.publish()
    svc.publish()
    names = list_index_files(tmp_path)
    assert len(names) == 2

    def mapped_rss(name: str) -> int:
        rss, inside = 0, False
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and not line.startswith(("Rss", "Pss")):
                    inside = line.rstrip().endswith(name)
                elif inside and head[0] == "Rss:":
                    rss += int(head[1]) * 1024
        return rss
    assert mapped_rss(names[1]) > 1 << 20                     # the one being written: resident
    assert mapped_rss(names[0]) <= 8192, mapped_rss(names[0])
    reader = IndexReader(tmp_path, 50_000, 100_000)
    assert reader.query("T", "key7", 10, 0, 2**62)[0] == [64 * 7]
    reader.close()
    svc.flush()
    svc.close()
