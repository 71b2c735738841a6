"""Dispatch: the columnar (numpy) path writes exactly the bytes the per-record path writes.

Every test dispatches the same CommitLog twice, into separate ConsumeQueue and index
directories (per record, and columnar with tiny chunks so every branch runs), and compares
the DispatchRounds and every file byte for byte. The per-record path is also what a store
without numpy runs.
"""

from __future__ import annotations

import itertools
import random
import shutil
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartgo.store import Block, CommitLogReader, CommitLogWriter, ConsumeQueueSet, Dispatcher, IndexService
from smartgo.store import dispatch as dispatch_module
from smartgo.store.consume_queue import ENTRY
from smartgo.store.errors import CorruptRecordError
from smartgo.store.java_hash import java_hash_u32, span_hashes_u32
from smartgo.store.record import (
    _DISPATCH_PROPS, BORNHOST_V6_FLAG, POS_BODYLEN, POS_SYSFLAG, SCHEDULE_TOPIC, STOREHOST_V6_FLAG,
    TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, encode_properties, encode_record,
    gather_properties, key_tokens, property_values,
)

from .conftest import HOST, small_config

np = pytest.importorskip("numpy")

DELAYS = (1000, 5000, 30_000)
TOPICS = ["TopicA", "TopicB", "Aa", "BB", SCHEDULE_TOPIC]  # "Aa" and "BB" share a Java hash
TAGS = ["TagA", "TagB", "", "é标签", "x" * 300, "a\x01b", "*"]
KEYS = ["k1", "k1 k2 k3", " lead", "trail ", "a  b", "", "ключ 2", "K" * 300, "x\x01y z", "order-1"]
RAW_PROPERTIES = [b"TAGS\x01first\x02TAGS\x01second", b"\x02TAGS\x01lead", b"KEYS\x01k9\x02", b"\x02\x02",
                  b"XTAGS\x01no\x02ATAGS\x01no\x02UNIQ_KEYS\x01no", b"TAGS\x01\x02KEYS\x01 \x02UNIQ_KEY\x01",
                  b"WAIT\x01TAGS\x01inner\x02TAGS", b"\x01TAGS\x01v\x01w"]
BODIES = [b"", b"b" * 128, b"\x02UNIQ_KEY\x01evil\x02TAGS\x01evil", b"\x01\x02 \x01", bytes(range(256))]
V6_IP = bytes(range(1, 17))


def random_properties(rng: random.Random) -> bytes:
    if rng.random() < 0.15:
        return rng.choice(RAW_PROPERTIES)
    props = {}
    if rng.random() < 0.85:
        props["TAGS"] = rng.choice(TAGS)
    if rng.random() < 0.8:
        props["UNIQ_KEY"] = rng.choice([f"0A0000019C40{rng.getrandbits(64):016X}", "", "u" * rng.randint(1, 9)])
    if rng.random() < 0.5:
        props["KEYS"] = rng.choice(KEYS)
    if rng.random() < 0.3:
        props["DELAY"] = rng.choice(["1", "3", "20", "0", "-1", "abc", ""])
    if rng.random() < 0.5:
        props["WAIT"] = "true"
    return encode_properties(props)


def v6_record(topic: str, queue_id: int, born_v6: bool, store_v6: bool, properties: bytes, body: bytes) -> bytes:
    """A record with 20-byte IPv6 born and/or store hosts (encode_record writes IPv4 only)."""
    raw = encode_record(topic, queue_id, body, properties, born_timestamp=7, born_host=HOST, store_host=HOST)
    host6 = V6_IP + struct.pack(">i", 10911)
    out = bytearray(raw[:48] + (host6 if born_v6 else raw[48:56]) + raw[56:64] + (host6 if store_v6 else raw[64:72])
                    + raw[72:])
    struct.pack_into(">i", out, 0, len(out))
    flags = (BORNHOST_V6_FLAG if born_v6 else 0) | (STOREHOST_V6_FLAG if store_v6 else 0)
    struct.pack_into(">i", out, POS_SYSFLAG, struct.unpack_from(">i", out, POS_SYSFLAG)[0] | flags)
    return bytes(out)


def random_block(rng: random.Random) -> Block:
    topic = rng.choice(TOPICS)
    queue_id = rng.randrange(3)
    body = rng.choice(BODIES)[:rng.randint(0, 300)]
    kind = rng.random()
    if kind < 0.08:
        return Block(v6_record(topic, queue_id, rng.random() < 0.7, rng.random() < 0.5, random_properties(rng), body),
                     (topic, queue_id))
    if kind < 0.16:
        tx = rng.choice([TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_COMMIT_TYPE])
        raw = encode_record(topic, queue_id, body, random_properties(rng), sys_flag=tx, born_host=HOST,
                            store_host=HOST)
        return Block(raw, None if tx != TRANSACTION_COMMIT_TYPE else (topic, queue_id))
    count = rng.choice([1, 1, 1, 3, 8])
    data = b"".join(encode_record(topic, queue_id, body, random_properties(rng), born_host=HOST, store_host=HOST)
                    for _ in range(count))
    return Block(data, (topic, queue_id), count)


def write_log(cfg, seed: int, blocks: int = 160) -> CommitLogWriter:
    rng = random.Random(seed)
    clock = itertools.count(1_700_000_000_000, 1700)
    w = CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, 0, {}, clock=lambda: next(clock))
    w.queue_offsets[("TopicC", 1)] = 7  # a queue that starts mid-file: hole entries first
    for i in range(blocks):
        if i == blocks // 2:
            w.queue_offsets[("TopicA", 0)] = w.queue_offsets.get(("TopicA", 0), 0) + 3  # a gap: holes
        batch = [random_block(rng) for _ in range(rng.choice([1, 2, 5]))]
        if i % 40 == 0:
            batch.append(Block(encode_record("TopicC", 1, b"c", encode_properties({"TAGS": "c"})), ("TopicC", 1)))
        for result in w.append(batch):
            assert not isinstance(result, Exception), result
    return w


class Side:
    """One dispatch target: its own ConsumeQueue and index directories over the shared log."""

    def __init__(self, cfg, root, vectorize: bool):
        self.cfg = cfg
        self.root = root
        self.vectorize = vectorize
        self.open()

    def open(self) -> None:
        cfg = self.cfg
        names = itertools.count(1_700_000_000_000, 1000)  # identical index file names on both sides
        self.queues = ConsumeQueueSet(self.root / "cq", cfg.consume_queue_file_size)
        self.index = IndexService(self.root / "index", cfg.index_slot_count, cfg.index_entry_count,
                                  clock=lambda: next(names), vectorize=self.vectorize)
        self.dispatcher = Dispatcher(CommitLogReader(cfg.commitlog_dir, cfg.commitlog_file_size), self.queues,
                                     self.index, DELAYS, cfg.release_interval_bytes, vectorize=self.vectorize)

    def close(self) -> None:
        self.index.close()
        self.queues.close()
        self.dispatcher.commitlog.close()

    def run(self, start: int, bound: int, max_records: int | None) -> list:
        rounds = []
        pos = start
        while pos < bound:
            rnd = self.dispatcher.dispatch(pos, bound, max_records)
            rounds.append(rnd)
            assert rnd.position > pos or rnd.records
            pos = rnd.position
        return rounds

    def files(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.root)): p.read_bytes() for p in sorted(self.root.rglob("*")) if p.is_file()}


@pytest.fixture
def columnar(monkeypatch):
    """The columnar path for chunks of any size, in chunks of at most 37 records opening at most
    3 new queues each; runs of 4 equal-sized records start a numpy probe."""
    monkeypatch.setattr(dispatch_module, "VECTORIZE_MIN", 1)
    monkeypatch.setattr(dispatch_module, "CHUNK_RECORDS", 37)
    monkeypatch.setattr(dispatch_module, "NEW_QUEUES_PER_CHUNK", 3)
    monkeypatch.setattr(dispatch_module, "RUN_PROBE", 4)


def sides(tmp_path, **overrides):
    cfg = small_config(tmp_path / "store", **{"commitlog_file_size": 16 * 1024, "index_entry_count": 200, **overrides})
    return cfg, Side(cfg, tmp_path / "scalar", False), Side(cfg, tmp_path / "columnar", True)


@pytest.mark.parametrize("max_records", [None, 1, 6, 100])
def test_columnar_writes_the_same_bytes(tmp_path, columnar, max_records):
    cfg, scalar, vector = sides(tmp_path)
    written = write_log(cfg, seed=max_records or 0).wrote_position
    assert written > 3 * cfg.commitlog_file_size  # files rolled: blank fillers on the way
    a = scalar.run(0, written, max_records)
    b = vector.run(0, written, max_records)
    assert a == b
    assert sum(r.records for r in a) > 500 and any(r.changed for r in a)
    scalar.close()
    vector.close()
    files = scalar.files()
    assert files == vector.files()
    assert sum(name.startswith("index") for name in files) > 3  # the index rolled, several times
    assert {name.split("/")[1] for name in files if name.startswith("cq/")} == {*TOPICS, "TopicC"}


@pytest.mark.parametrize("vectorize", [True, False])
def test_a_burst_of_new_queues_is_dispatched_a_chunk_of_them_at_a_time(tmp_path, vectorize):
    """Each new queue costs a directory, a file and a mapping: a round that passes its deadline
    stops after NEW_QUEUES_PER_CHUNK of them (8,192 in one chunk held dispatch past its
    heartbeat deadline), and the rounds after it take the rest."""
    many = 3 * dispatch_module.NEW_QUEUES_PER_CHUNK + 5
    cfg = small_config(tmp_path / "store", commitlog_file_size=1 << 20)
    w = CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, 0, {})
    results = w.append([Block(encode_record("Wide", q, b"m%d" % q, encode_properties({"TAGS": "t"}),
                                            born_host=HOST, store_host=HOST), ("Wide", q)) for q in range(many)])
    side = Side(cfg, tmp_path / "side", vectorize)
    first = side.dispatcher.dispatch(0, w.wrote_position, None, deadline=0.0)
    assert first.records == len(first.changed) == dispatch_module.NEW_QUEUES_PER_CHUNK
    assert first.position == results[dispatch_module.NEW_QUEUES_PER_CHUNK].physical_offset
    rest = side.run(first.position, w.wrote_position, None)
    assert sum(r.records for r in rest) == many - dispatch_module.NEW_QUEUES_PER_CHUNK
    assert side.queues.max_offsets() == {("Wide", q): 1 for q in range(many)}
    assert [ENTRY.unpack(side.queues.get("Wide", q).files.get(0).mm[:20])[0] for q in range(many)] == \
        [r.physical_offset for r in results]
    side.close()


def test_redispatch_after_lost_entries_is_identical(tmp_path, columnar):
    """Recovery's case: queues and index partly there; dispatch from the start again."""
    cfg, scalar, vector = sides(tmp_path, index_entry_count=5000)
    written = write_log(cfg, seed=5).wrote_position
    middle = scalar.run(0, written, 97)[3].position  # a record boundary
    scalar.close()
    for name in ("cq", "index"):
        shutil.rmtree(scalar.root / name)
    scalar.open()
    cut = None
    for side in (scalar, vector):
        side.run(0, middle, None)
        side.close()
        side.open()
        cq = side.queues.get("TopicB", 1)
        cut = cq.max_offset // 2
        cq.truncate_entries(cut)
        side.index.forget_beyond(written // 3)
    rounds = [side.run(0, written, 50) for side in (scalar, vector)]
    assert rounds[0] == rounds[1]
    moved = {}
    for rnd in rounds[0]:
        moved.update(rnd.changed)
    assert moved[("TopicB", 1)] > cut
    for side in (scalar, vector):
        side.close()
        side.open()
    again = [side.run(0, written, None) for side in (scalar, vector)]  # everything present: nothing moves
    assert again[0] == again[1] and not any(r.changed for r in again[0])
    for side in (scalar, vector):
        side.close()
    assert scalar.files() == vector.files()


def test_disk_full_mid_dispatch_then_the_retry_writes_the_same_bytes(tmp_path, monkeypatch):
    """ConsumeQueue files are sparse, so a full disk can stop dispatch inside a round (a queue
    file's zero-fill or creation): DiskFullError, and the dispatch actor's retry of the round
    from its last position, once there is room, ends with the ConsumeQueues of a dispatch that
    never failed, byte for byte, and an index with the same (key hash, offset) entries, none
    twice (the failed round publishes the keys it got through and the retry skips them)."""
    import errno
    import os

    from smartgo.store import DiskFullError
    cfg, clean, full = sides(tmp_path)
    written = write_log(cfg, seed=11).wrote_position
    real = os.pwrite
    calls = itertools.count()

    def counting(fd, data, offset):
        next(calls)
        return real(fd, data, offset)
    monkeypatch.setattr(os, "pwrite", counting)
    clean.run(0, written, 50)
    room = next(calls) // 2                              # the disk fills half-way through

    def filling_up(fd, data, offset):
        if next(calls) >= room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)
    calls = itertools.count()
    monkeypatch.setattr(os, "pwrite", filling_up)
    pos = 0
    with pytest.raises(DiskFullError, match="disk full"):
        while pos < written:
            pos = full.dispatcher.dispatch(pos, written, 50).position
    assert 0 < pos < written
    monkeypatch.setattr(os, "pwrite", real)
    full.run(pos, written, 50)
    clean.close()
    full.close()
    files = [side.files() for side in (clean, full)]
    queues = [{name: data for name, data in f.items() if name.startswith("cq/")} for f in files]
    assert len(queues[0]) > 20 and queues[0] == queues[1]
    entries = [_index_entries(f, cfg.index_slot_count) for f in files]
    assert len(entries[0]) > 100 and entries[0] == entries[1]


def _index_entries(files: dict[str, bytes], slot_count: int) -> list[tuple[int, int]]:
    """(key hash, phyOffset) of every entry in the index files, sorted (repeats kept)."""
    from smartgo.store.index_file import ENTRY as INDEX_ENTRY, ENTRY_SIZE, HEADER as INDEX_HEADER, HEADER_SIZE, SLOT_SIZE
    out = []
    for name, data in files.items():
        if name.startswith("index/"):
            count = INDEX_HEADER.unpack_from(data, 0)[5]
            at = HEADER_SIZE + slot_count * SLOT_SIZE
            for i in range(1, count):
                key_hash, phys, _, _ = INDEX_ENTRY.unpack_from(data, at + i * ENTRY_SIZE)
                out.append((key_hash, phys))
    return sorted(out)


def test_without_numpy_the_per_record_path_runs(tmp_path, monkeypatch):
    cfg, scalar, _ = sides(tmp_path)
    written = write_log(cfg, seed=9, blocks=60).wrote_position
    expected = scalar.run(0, written, None)
    scalar.close()
    monkeypatch.setattr(dispatch_module, "_np", None)
    fallback = Side(cfg, tmp_path / "fallback", True)
    assert not fallback.dispatcher.vectorize
    assert fallback.run(0, written, None) == expected
    fallback.close()
    assert fallback.files() == scalar.files()


def equal_sized_log(cfg, garbage_at: int | None = None) -> int:
    """Mostly equal-sized records (runs across file ends), some of other sizes between;
    optionally the magic of record garbage_at zeroed."""
    w = CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, 0, {})
    offsets = []
    for i in range(700):
        props = encode_properties({"TAGS": "TagA", "UNIQ_KEY": f"{i:032X}", "KEYS": f"k{i % 10} o"})
        body = b"b" * (40 if i % 97 else 41 + i % 5)
        [res] = w.append([Block(encode_record("TopicA", (i // 50) % 3, body, props), ("TopicA", (i // 50) % 3))])
        offsets.append(res.physical_offset)
    if garbage_at is not None:
        pos = offsets[garbage_at]
        w._files.get(pos).mm[pos % cfg.commitlog_file_size + 4:pos % cfg.commitlog_file_size + 8] = bytes(4)
    written = w.wrote_position
    w.close()
    return written


@pytest.mark.parametrize("max_records", [None, 3, 37, 64])
def test_equal_sized_runs_are_walked_exactly(tmp_path, columnar, max_records):
    cfg, scalar, vector = sides(tmp_path)
    written = equal_sized_log(cfg)
    assert written > 3 * cfg.commitlog_file_size
    assert scalar.run(0, written, max_records) == vector.run(0, written, max_records)
    scalar.close()
    vector.close()
    assert scalar.files() == vector.files()


def test_garbage_inside_a_run_stops_the_walk_where_it_starts(tmp_path, columnar):
    cfg, scalar, vector = sides(tmp_path)
    written = equal_sized_log(cfg, garbage_at=300)
    errors = []
    for side in (scalar, vector):
        with pytest.raises(CorruptRecordError) as err:
            side.run(0, written, None)
        errors.append(err.value.offset)
        side.close()
    assert errors[0] == errors[1] and 0 < errors[0] < written
    files = scalar.files()
    assert files == vector.files()
    entries = [e for name, data in files.items() if name.startswith("cq/") for e in ENTRY.iter_unpack(data) if e[1]]
    assert len(entries) == 300  # the records before the garbage


@pytest.mark.parametrize("damage", ["magic", "body_length", "topic_length"])
def test_garbage_below_the_bound_raises_after_the_records_before_it(tmp_path, columnar, damage):
    cfg, scalar, vector = sides(tmp_path)
    w = CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, 0, {})
    rec = encode_record("TopicA", 0, b"x" * 40, encode_properties({"TAGS": "t", "UNIQ_KEY": "u1"}))
    w.append([Block(rec, ("TopicA", 0))] * 30)
    bad = 12 * len(rec)
    mf = w._files.get(bad)
    if damage == "magic":
        mf.mm[bad + 4:bad + 8] = b"\0\0\0\0"
    elif damage == "body_length":
        mf.mm[bad + POS_BODYLEN:bad + POS_BODYLEN + 4] = struct.pack(">i", 10_000)
    else:
        mf.mm[bad + POS_BODYLEN + 4 + 40] = 0  # TOPICLEN 0
    written = w.wrote_position
    w.close()
    for side in (scalar, vector):
        with pytest.raises(CorruptRecordError) as err:
            side.dispatcher.dispatch(0, written)
        assert err.value.offset == bad
        # the walk stops at a bad magic; lengths are checked per record, or per chunk by numpy
        assert side.queues.get("TopicA", 0).max_offset == (12 if damage == "magic" or side is scalar else 0)
        side.close()
    if damage == "magic":  # the walk finds it before parsing: both wrote the 12 records before it
        assert scalar.files() == vector.files()


# ----------------------------------------------------------------------------- the pieces

NAME_PARTS = [b"TAGS", b"KEYS", b"UNIQ_KEY", b"DELAY", b"\x01", b"\x02", b"a", b" ", b"X", b"\xc3\xa9", b"TAG"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from(NAME_PARTS), max_size=14).map(b"".join), min_size=1, max_size=12),
       st.integers(0, 40))
def test_property_values_match_the_regex(props_list, gap):
    """Properties anywhere in a file, separated by arbitrary bytes, found as findall finds them."""
    filler = b"\x02\x01TAGS\x01junk\x02 "
    data, starts, ends = b"", [], []
    for props in props_list:
        data += (filler * 3)[:gap]
        starts.append(len(data))
        data += props
        ends.append(len(data))
    u8 = np.frombuffer(data + filler, np.uint8)
    rows = gather_properties(u8, np.array(starts), np.array(ends))
    names = (b"TAGS", b"KEYS", b"UNIQ_KEY", b"DELAY")
    found = property_values(rows, names)
    for i, props in enumerate(props_list):
        expected = dict(_DISPATCH_PROPS.findall(props))
        for name, (at, length) in zip(names, found):
            got = rows.buf[at[i]:at[i] + length[i]].tobytes() if at[i] >= 0 else None
            assert got == expected.get(name), (props, name)
    keys = found[1]
    token_rows, token_at, token_len = key_tokens(rows.buf, keys[0], keys[1])
    tokens = [(int(r), rows.buf[a:a + n].tobytes()) for r, a, n in zip(token_rows, token_at, token_len)]
    expected_tokens = [(i, t) for i, props in enumerate(props_list)
                       for t in dict(_DISPATCH_PROPS.findall(props)).get(b"KEYS", b"").split(b" ") if t]
    assert tokens == expected_tokens


def test_property_rows_packed_when_one_record_is_long():
    props = [b"TAGS\x01a", b"KEYS\x01" + b"k" * 20_000, b"UNIQ_KEY\x01u"] * 3
    data = b"\x01\x02".join(props)
    starts = np.cumsum([0] + [len(p) + 2 for p in props[:-1]])
    rows = gather_properties(np.frombuffer(data, np.uint8), starts, starts + [len(p) for p in props])
    assert rows.width == 0 and len(rows.buf) < 70_000  # not 9 rows of 20,000+ bytes
    tags, keys, uniq, delay = property_values(rows, (b"TAGS", b"KEYS", b"UNIQ_KEY", b"DELAY"))
    assert list(tags[0] >= 0) == [True, False, False] * 3 and list(keys[1]) == [0, 20_000, 0] * 3
    assert list(uniq[1]) == [0, 0, 1] * 3 and (delay[0] == -1).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=300), min_size=1, max_size=20))
def test_span_hashes_match_java_hash(texts):
    raw = [t.encode("utf-8", "surrogatepass") for t in texts]
    data = b"".join(raw)
    lengths = np.array([len(r) for r in raw])
    starts = np.cumsum(lengths) - lengths
    hashes, scalar = span_hashes_u32(np.frombuffer(data, np.uint8), starts, lengths)
    for r, h, s in zip(raw, hashes, scalar):
        if s:
            assert not r.isascii() or len(r) > 256
        else:
            assert int(h) == java_hash_u32(r)


def test_put_entries_crosses_files_and_only_continues_the_queue(tmp_path):
    from smartgo.store import ConsumeQueueWriter
    cq = ConsumeQueueWriter(tmp_path, "T", 0, 100)  # 5 entries per file
    cq.put(0, 10, 5, 1)
    entries = b"".join(ENTRY.pack(100 + i, 7, i) for i in range(12))
    assert not cq.put_entries(2, entries)  # not the max offset: nothing written
    assert cq.put_entries(1, entries)
    assert cq.max_offset == 13 and cq.max_phys_end == 111 + 7
    assert cq.files.starts() == [0, 100, 200]
    assert not cq.put_entries(13, b"")
    assert cq.put(13, 500, 1, 0)
    cq.close()
    data = b"".join((tmp_path / "T" / "0" / f"{s:020d}").read_bytes() for s in (0, 100, 200))
    assert data[:14 * 20] == ENTRY.pack(10, 5, 1) + entries + ENTRY.pack(500, 1, 0)
