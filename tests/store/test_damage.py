"""Damage in flushed CommitLog data (bit rot, a lost page write): recovery replaces the damaged
record with a filler and keeps every message after it (smartgo.store.damage)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smartgo.store import Message, MessageStore
from smartgo.store.commitlog import CommitLogReader
from smartgo.store.damage import DAMAGED_DIR, FILLER_TOPIC, FOUND, ScrubCursor, note_found
from smartgo.store.mapped_file import segment_starts
from smartgo.store.record import (BLANK_MAGIC, FIXED_SIZE, MESSAGE_MAGIC, POS_BODY, POS_MAGIC, POS_QUEUEOFFSET, SIZE_MAGIC,
                                  TRANSACTION_ROLLBACK_TYPE, check_record, decode_record, encode_properties)

from .conftest import Clock, small_config
from .test_recovery import QUEUES, commitlog_file, put_many, served_records

LATER = Clock(1_800_000_000_000)


@pytest.fixture
def config(tmp_path):
    """Recovery that walks the last files after a clean stop too (trust_clean_stop off): what these
    tests damage while the store is stopped is what that walk finds. With the default the
    background scrub finds it (test_after_a_clean_stop_damage_is_the_scrubs_to_find)."""
    return small_config(tmp_path / "store", trust_clean_stop=False)


def stored(config, n, **kw):
    """n messages, then a clean shutdown (everything flushed)."""
    with MessageStore(config, clock=Clock()) as s:
        return put_many(s, n, **kw)


def xor_byte(config, pos, mask=0x40):
    fs = config.commitlog_file_size
    with open(commitlog_file(config, pos), "r+b") as f:
        f.seek(pos % fs)
        b = f.read(1)[0]
        f.seek(pos % fs)
        f.write(bytes([b ^ mask]))


def record_at(config, phys):
    with open(commitlog_file(config, phys), "rb") as f:
        f.seek(phys % config.commitlog_file_size)
        size = SIZE_MAGIC.unpack(f.read(8))[0]
        f.seek(phys % config.commitlog_file_size)
        return f.read(size)


def following(originals, phys):
    """The record stored after the one at phys, or None if it ends its file."""
    later = [p for p in originals if p > phys]
    nxt = min(later) if later else None
    return nxt if nxt == phys + len(originals[phys][0]) else None


def middle_record(originals, config, followed=True):
    """A record from the middle of the last files (inside normal recovery's walk) that is
    (or is not) followed by another record in its file."""
    fs = config.commitlog_file_size
    last_files = sorted(segment_starts(config.commitlog_dir))[-3:]
    for phys in sorted(originals)[len(originals) // 2:]:
        if phys - phys % fs in last_files[:-1] and (following(originals, phys) is not None) == followed:
            return phys
    raise AssertionError("no such record")


def served(store, originals):
    """What the test queues serve: ({phys: (raw, topic, qid, offset)} of the records served
    intact, [raw of anything else served])."""
    intact, other = {}, []
    for phys, raw, topic, qid, qoff in served_records(store):
        if phys in originals and raw == originals[phys][0]:
            intact[phys] = (raw, topic, qid, qoff)
        else:
            other.append(raw)
    return intact, other


def assert_lost_only(s, originals, lost):
    """Every message except those at `lost` is served intact, at its queue offset; the lost
    ones' offsets are holes (queues keep their max offsets)."""
    assert served(s, originals) == ({p: v for p, v in originals.items() if p not in lost}, [])
    for q in QUEUES:
        assert s.max_offset(*q) == sum(1 for v in originals.values() if v[1:3] == q)


@pytest.mark.parametrize("where", ["body", "magic", "size"])
def test_damaged_flushed_record_is_replaced_and_the_rest_kept(config, caplog, where):
    originals = stored(config, 60)
    phys = middle_record(originals, config)
    raw, topic, qid, qoff = originals[phys]
    nxt = following(originals, phys)
    xor_byte(config, phys + {"body": POS_BODY + 1, "magic": POS_MAGIC, "size": 2}[where])
    damaged_bytes = record_at(config, phys) if where == "body" else None
    with caplog.at_level(logging.ERROR, logger="smartgo.store.damage"):
        s = MessageStore(config, clock=LATER)
        s.open()
    try:
        assert not s.recovered.abnormal
        [damage] = s.recovered.damaged
        assert (damage.begin, damage.end) == (phys, nxt)
        assert s.written == max(originals) + len(originals[max(originals)][0])  # nothing cut
        assert_lost_only(s, originals, {phys})
        assert any("fail the record checks" in r.getMessage() and str(phys) in r.getMessage()
                   for r in caplog.records)
        saved = damage.saved.read_bytes()
        assert len(saved) == nxt - phys and saved != raw
        if damaged_bytes is not None:
            assert saved == damaged_bytes
        # the filler: a valid rolled-back record of SMARTGO_DAMAGED, nowhere in a queue or the index
        filler = record_at(config, phys)
        assert len(filler) == nxt - phys and check_record(memoryview(filler), 0, len(filler), phys) == len(filler)
        m = decode_record(filler)
        assert m.topic == FILLER_TOPIC and m.sys_flag & TRANSACTION_ROLLBACK_TYPE == TRANSACTION_ROLLBACK_TYPE
        key = decode_record(raw).properties["KEYS"]
        assert s.query_by_key(topic, key).buffers == []
        r = s.put(Message(topic, b"after", queue_id=qid))
        assert r.queue_offset == s.max_offset(topic, qid) - 1 > qoff
    finally:
        s.shutdown()
    with MessageStore(config, clock=LATER) as s2:  # the repaired store recovers without damage
        assert s2.recovered.damaged == []
        assert served(s2, originals)[0].keys() == set(originals) - {phys}


@pytest.mark.parametrize("what", ["last record", "blank filler"])
def test_damage_at_a_file_end(config, what):
    """The last record of a file: the filler reaches the file's blank filler. The blank filler
    itself: it is written again, and the walk goes on in the next file."""
    originals = stored(config, 60)
    last = middle_record(originals, config, followed=False)
    blank = last + len(originals[last][0])
    fs = config.commitlog_file_size
    phys = last if what == "last record" else blank
    xor_byte(config, phys + (POS_BODY if what == "last record" else 2))
    with MessageStore(config, clock=LATER) as s:
        [damage] = s.recovered.damaged
        assert (damage.begin, damage.end) == (phys, blank if what == "last record" else blank - blank % fs + fs)
        assert_lost_only(s, originals, {last} if what == "last record" else set())
    data = commitlog_file(config, phys).read_bytes()
    assert SIZE_MAGIC.unpack_from(data, blank % fs) == (fs - blank % fs, BLANK_MAGIC)


def test_a_lost_page_loses_only_the_records_on_it(config):
    """A flushed 4 KiB-aligned run of zeros (a write the disk lost) spanning several records."""
    config = small_config(config.store_path, commitlog_file_size=16384, trust_clean_stop=False)
    originals = stored(config, 80)
    phys = middle_record(originals, config)
    start, stop = phys + 10, phys + 900
    fs = config.commitlog_file_size
    with open(commitlog_file(config, start), "r+b") as f:
        f.seek(start % fs)
        f.write(bytes(stop - start))
    lost = {p for p, v in originals.items() if p < stop and p + len(v[0]) > start}
    assert len(lost) >= 2
    with MessageStore(config, clock=LATER) as s:
        assert len(s.recovered.damaged) == 1
        assert_lost_only(s, originals, lost)


def test_damage_before_the_walk_is_repaired_during_redispatch(config):
    """Normal recovery checks the last three files only; a structurally damaged record in an
    older file stopped the store from opening when the queues had to be rebuilt from there."""
    originals = stored(config, 80)
    first_file = sorted(originals)[:4]
    phys = first_file[1]
    xor_byte(config, phys + POS_MAGIC)
    shutil.rmtree(config.consume_queue_dir)
    with MessageStore(config, clock=LATER) as s:
        [damage] = s.recovered.damaged
        assert damage.begin == phys
        assert_lost_only(s, originals, {phys})


def test_a_record_naming_another_queue_offset_becomes_a_hole(config):
    """A flushed record whose QUEUEOFFSET disagrees with its ConsumeQueue entry (a field no
    check covers): the entry keeps its offset as a hole and the record is replaced; cutting the
    queue there would give the offsets after it to new messages."""
    originals = stored(config, 60)
    phys = max(p for p, v in originals.items() if v[1:3] == ("TopicA", 1))  # the queue's last message
    xor_byte(config, phys + POS_QUEUEOFFSET + 7, 0x5A)
    with MessageStore(config, clock=LATER) as s:
        [damage] = s.recovered.damaged
        assert (damage.begin, damage.end) == (phys, phys + len(originals[phys][0]))
        assert_lost_only(s, originals, {phys})
        assert s.put(Message("TopicA", b"new", queue_id=1)).queue_offset == originals[phys][3] + 1


def test_a_damaged_topic_name_met_by_redispatch_is_replaced(config):
    """A flushed record in an old file whose topic bytes no send could store, met while the
    queues are rebuilt: replaced, instead of a queue directory named after the garbage."""
    originals = stored(config, 60)
    phys = sorted(originals)[2]
    raw = originals[phys][0]
    topic_at = len(raw) - len(encode_properties(decode_record(raw).properties)) - 2 - len(originals[phys][1])
    xor_byte(config, phys + topic_at, 0x40)                   # "TopicB" -> "\x14opicB"
    shutil.rmtree(config.consume_queue_dir)
    with MessageStore(config, clock=LATER) as s:
        [damage] = s.recovered.damaged
        assert damage.begin == phys
        assert_lost_only(s, originals, {phys})
    assert sorted(os.listdir(config.consume_queue_dir)) == ["TopicA", "TopicB"]


def test_damage_past_the_flushed_offset_is_still_cut(config):
    """Unflushed data after a crash is a torn tail: cut, as before (nothing acknowledged as durable)."""
    s = MessageStore(config, clock=Clock())
    s.open()
    put_many(s, 20)
    flushed = s.flush()
    later = put_many(s, 10, start=20)
    s.abandon()
    torn = min(later)
    assert torn >= flushed and len(later) == 10
    xor_byte(config, torn + POS_BODY)
    with MessageStore(config, clock=LATER) as s2:
        assert s2.recovered.abnormal and s2.recovered.damaged == [] and s2.written == torn


@pytest.mark.timeout(120)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(5, 60), hits=st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["flip", "page"])),
                                            min_size=1, max_size=3),
       abnormal=st.booleans())
def test_damage_anywhere_in_flushed_data(tmp_path_factory, n, hits, abnormal):
    """Byte flips and zeroed runs anywhere below the flushed offset, ConsumeQueues kept: the
    store opens, every record the damage did not touch is served intact at its queue offset,
    no filler is served, and no offset a consumer saw goes to a new message. (With the queues
    lost as well, a flip in a QUEUEOFFSET field can misplace a rebuilt queue: see the docs.)"""
    config = small_config(tmp_path_factory.mktemp("rot") / "store")
    s = MessageStore(config, clock=Clock())
    s.open()
    originals = put_many(s, n)
    flushed = s.flush()
    if abnormal:
        s.abandon()
    else:
        s.shutdown()
    fs = config.commitlog_file_size
    touched = []
    for where, kind in hits:
        pos = int(flushed * where * 0.999)
        if kind == "flip":
            xor_byte(config, pos, 0x5A)
            touched.append((pos, pos + 1))
        else:
            stop = min(pos + 300, pos - pos % fs + fs)
            with open(commitlog_file(config, pos), "r+b") as f:
                f.seek(pos % fs)
                f.write(bytes(stop - pos))
            touched.append((pos, stop))
    hit = {p for p, v in originals.items() if any(a < p + len(v[0]) and p < b for a, b in touched)}
    with MessageStore(config, clock=LATER) as s2:
        got, other = served(s2, originals)
        for phys, v in originals.items():
            if phys not in hit:
                assert got.get(phys) == v, phys
        # a hit record may still be served: a flip in a field no check covers, or in a file
        # older than recovery's walk (not read at start-up, as in RocketMQ); never a filler
        assert len(other) <= len(hit) and not any(FILLER_TOPIC.encode() in raw for raw in other)
        for topic, qid in QUEUES:
            seen = max((v[3] for v in originals.values() if v[1:3] == (topic, qid)), default=-1)
            r = s2.put(Message(topic, b"new", queue_id=qid))
            assert r.queue_offset > seen
    for damage in s2.recovered.damaged:
        assert damage.begin < flushed and os.path.exists(damage.saved)


def test_filler_record_sizes():
    """Every damaged length a real record can have gets a filler of exactly that length."""
    from smartgo.store.damage import _filler_record
    for length in (FIXED_SIZE + 1, FIXED_SIZE + 5, FIXED_SIZE + len(FILLER_TOPIC), 4000):
        raw = _filler_record(12345, length, 7)
        assert len(raw) == length and check_record(memoryview(raw), 0, length, 12345) == length
        assert SIZE_MAGIC.unpack_from(raw)[1] == MESSAGE_MAGIC and decode_record(raw).queue_offset == -1


def test_scrub_finds_damage_recovery_does_not_read_and_repairs_it(config, capsys):
    """`smartgo scrub`: damage in a file older than recovery's walk (with intact queues it would
    only show when a consumer reads it) is listed, exit 1; --repair replaces it, exit 0; a store
    whose node runs is refused."""
    from smartgo.cli.main import main
    from smartgo.store import StoreLock
    originals = stored(config, 60)
    phys = sorted(originals)[1]
    xor_byte(config, phys + POS_BODY + 2)
    store = str(config.store_path)
    assert main(["scrub", "--store-dir", store, "--json"]) == 1
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    nxt = sorted(originals)[2]
    assert out["damaged"] == [[phys, nxt]] and out["repaired"] == 0 and out["records"] == len(originals) - 1
    with StoreLock(store):
        assert main(["scrub", "--store-dir", store]) == 2
        assert "stop the node first" in capsys.readouterr().err
    (config.root / "run").mkdir()
    with open(config.root / "run" / "supervisor.lock", "w") as running:   # what a running supervisor holds
        fcntl.flock(running, fcntl.LOCK_EX)
        assert main(["scrub", "--store-dir", store, "--repair"]) == 2
        assert "is running" in capsys.readouterr().err
    assert main(["scrub", "--store-dir", store, "--repair"]) == 0
    assert "repaired: [%d, %d)" % (phys, nxt) in capsys.readouterr().out
    with MessageStore(config, clock=LATER) as s:
        assert s.recovered.damaged == []                   # recovery never read that file
        assert_lost_only(s, originals, {phys})
    assert main(["scrub", "--store-dir", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["damaged"] == []


def test_damage_a_running_scrub_listed_is_repaired_at_the_next_start(config):
    """The running node's scrub lists damage in a file recovery's walk does not read
    (damaged/found.jsonl); the next start repairs it like walked damage and consumes the list.
    A listed range that is good by then (repaired offline) is left alone."""
    originals = stored(config, 60)
    phys, good = sorted(originals)[1], sorted(originals)[5]
    xor_byte(config, phys + POS_BODY + 2)
    nxt = sorted(originals)[2]
    note_found(config.root, phys, nxt)
    note_found(config.root, good, good + len(originals[good][0]))
    (config.root / DAMAGED_DIR / FOUND).open("a").write("not json\n")
    with MessageStore(config, clock=LATER) as s:
        assert [(d.begin, d.end) for d in s.recovered.damaged] == [(phys, nxt)]
        assert_lost_only(s, originals, {phys})
    assert not (config.root / DAMAGED_DIR / FOUND).exists()


def test_the_scrub_cursor_walks_in_budgets_and_lists_damage_once(config):
    originals = stored(config, 60)
    phys = sorted(originals)[40]
    xor_byte(config, phys + POS_BODY + 2)
    bound = max(originals) + len(originals[max(originals)][0])
    cursor = ScrubCursor(config.root, CommitLogReader(config.commitlog_dir, config.commitlog_file_size))
    cursor.start_pass(0)
    steps = []
    while done := cursor.step(0, bound, 1000):
        steps.append(done)
    assert cursor.records == 59 and cursor.damaged == [(phys, sorted(originals)[41])]
    assert max(steps) < 1000 + max(len(raw) for raw, *_ in originals.values()) and sum(steps) == bound
    found = (config.root / DAMAGED_DIR / FOUND).read_text().splitlines()
    assert [json.loads(line)["begin"] for line in found] == [phys]
    assert cursor.step(0, bound, 1000) == 0                     # the pass is over until start_pass


def test_after_a_clean_stop_damage_is_the_scrubs_to_find(tmp_path):
    """With the default (trust_clean_stop) a start after a clean stop checks from the end that stop
    recorded, so damage made meanwhile in the last files is not looked for then: the background
    scrub lists it, and the next start repairs it, as for damage in older files."""
    config = small_config(tmp_path / "store")
    originals = stored(config, 60)
    phys = middle_record(originals, config)
    xor_byte(config, phys + POS_BODY + 1)
    s = MessageStore(config, clock=LATER)
    s.open()
    try:
        assert s.recovered.damaged == [] and s.recovered.checked_from == s.written
        cursor = ScrubCursor(config.root, CommitLogReader(config.commitlog_dir, config.commitlog_file_size))
        cursor.start_pass(0)
        while cursor.step(0, s.written, 1 << 20):
            pass
        assert [begin for begin, _ in cursor.damaged] == [phys]
    finally:
        s.shutdown()
    with MessageStore(config, clock=LATER) as s2:
        assert [d.begin for d in s2.recovered.damaged] == [phys]
        assert_lost_only(s2, originals, {phys})
