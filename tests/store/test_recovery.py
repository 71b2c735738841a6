"""Recovery: torn tails, corrupt bytes, lost ConsumeQueue/index files, checkpoint start,
and a property test over random crash points."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from smartgo.store import GetStatus, Message, MessageStore, recover
from smartgo.store.consume_queue import ENTRY, queue_dir
from smartgo.store.mapped_file import segment_name, segment_starts
from smartgo.store.record import POS_QUEUEOFFSET, QUEUE_AND_PHYS, check_record, decode_record, store_timestamp_at

from .conftest import Clock, small_config

QUEUES = [("TopicA", 0), ("TopicA", 1), ("TopicB", 0)]


def put_many(store, n, start=0, body_len=None):
    """Put n messages round-robin over QUEUES; returns {phys: (raw bytes, topic, qid, qoff)}."""
    out = {}
    for i in range(start, start + n):
        topic, qid = QUEUES[i % len(QUEUES)]
        body = b"%d|" % i + b"b" * (body_len if body_len is not None else (i * 37) % 500)
        r = store.put(Message(topic, body, queue_id=qid, properties={"UNIQ_KEY": f"U{i}", "KEYS": f"k{i}",
                                                                     "TAGS": f"t{i % 4}"}))
        out[r.physical_offset] = (bytes(store.reader.view(r.physical_offset, store.written)), topic, qid,
                                  r.queue_offset)
    return out


def crashed(config, n, clock=None, **kw):
    """A store that took n messages, flushed, then stopped as a crash would (abort kept).
    Returns (originals, written, flushed)."""
    s = MessageStore(config, clock=clock or Clock())
    s.open()
    originals = put_many(s, n, **kw)
    flushed = s.flush()
    s.abandon()
    return originals, s.written, flushed


def served_records(store):
    """(phys, raw, topic, qid, offset) of every record reachable through the QUEUES, stepping
    over holes (a damaged record's offset); phys and offset from the header (a damaged record
    may not decode)."""
    for topic, qid in QUEUES:
        off = store.min_offset(topic, qid)
        while off < store.max_offset(topic, qid):
            got = store.get_messages(topic, qid, off, 32)
            assert got.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE) and got.next_begin_offset > off, (
                topic, qid, off, got.status)
            for buf in got.buffers:
                qoff, phys = QUEUE_AND_PHYS.unpack_from(buf, POS_QUEUEOFFSET)
                yield phys, bytes(buf), topic, qid, qoff
            off = got.next_begin_offset


def served(store):
    """Every record reachable through every ConsumeQueue: {phys: (raw, topic, qid, offset)}."""
    return {r[0]: r[1:] for r in served_records(store)}


def assert_nothing_after(config, end):
    """Recovery leaves no byte of torn or corrupt data on disk past the recovered end."""
    fs = config.commitlog_file_size
    assert all(start <= end for start in segment_starts(config.commitlog_dir))
    path = commitlog_file(config, end)
    if path.exists():
        with open(path, "rb") as f:
            f.seek(end % fs)
            assert not any(f.read())


def commitlog_file(config, phys):
    fs = config.commitlog_file_size
    return config.commitlog_dir / segment_name(phys - phys % fs)


def test_normal_recovery_cuts_a_torn_tail(config):
    with MessageStore(config, clock=Clock()) as s:
        originals = put_many(s, 12)
        end = s.written
    last = max(originals)
    with open(commitlog_file(config, end), "r+b") as f:  # half a record after the end
        f.seek(end % config.commitlog_file_size)
        f.write(originals[last][0][:60])
    with MessageStore(config, clock=Clock(1_800_000_000_000)) as s:
        assert not s.recovered.abnormal and s.written == end
        assert_nothing_after(config, end)
        assert served(s) == originals
        r = s.put(Message("TopicA", b"next", queue_id=0))
        assert r.physical_offset == end and r.queue_offset == 4


def test_a_clean_restart_checks_from_the_clean_end_with_the_same_result(config):
    """A clean stop records its end in the checkpoint: the next normal recovery walks from there
    (not from the third-last file) and checks each ConsumeQueue from its last entry, and recovers
    what the full check does. The end is used once: the recovery after it checks the usual way."""
    with MessageStore(config, clock=Clock()) as s:
        originals = put_many(s, 60, body_len=300)
        end = s.written
    files = segment_starts(config.commitlog_dir)
    assert len(files) >= 4
    fast = recover(config)
    assert not fast.abnormal and fast.written == end and fast.checked_from == end
    full = recover(config)
    assert full.checked_from == files[-3] and full.written == end
    assert (fast.queue_offsets, fast.last_store_timestamp) == (full.queue_offsets, full.last_store_timestamp)
    assert fast.last_store_timestamp > 0 and fast.queue_offsets == {q: 20 for q in QUEUES}
    with MessageStore(config, clock=Clock(1_800_000_000_000)) as s:
        assert served(s) == originals


def test_a_clean_restart_takes_the_queue_ends_saved_at_the_stop(config):
    """A clean stop saves every queue's end beside its CommitLog end: the next recovery reads no
    queue's files (each costs disk reads once the page cache is full of CommitLog) and ends with
    the offsets the full check finds. The file describes one stop: used once; a file from
    another position, or damaged, is ignored, and the queues are read."""
    from smartgo.store import queue_ends
    with MessageStore(config, clock=Clock()) as s:
        put_many(s, 60, body_len=300)
        end = s.written
    saved = (config.root / queue_ends.QUEUE_ENDS_FILE).read_bytes()
    fast = recover(config)
    assert (fast.queues_read, fast.queue_offsets, fast.redispatched) == (0, {q: 20 for q in QUEUES}, 0)
    assert not (config.root / queue_ends.QUEUE_ENDS_FILE).exists()
    with MessageStore(config, clock=Clock(1_800_000_000_000)) as s:   # the queues go on from the saved ends
        assert s.put(Message("TopicB", b"next", queue_id=0)).queue_offset == 20
    assert recover(config).queues_read == 0
    (config.root / queue_ends.QUEUE_ENDS_FILE).write_bytes(saved)      # saved at an older end
    assert recover(config).queues_read == len(QUEUES)
    with MessageStore(config, clock=Clock(1_800_000_000_000)):
        pass
    damaged = bytearray((config.root / queue_ends.QUEUE_ENDS_FILE).read_bytes())
    damaged[-9] ^= 1
    (config.root / queue_ends.QUEUE_ENDS_FILE).write_bytes(damaged)
    state = recover(config)
    assert state.queues_read == len(QUEUES) and state.queue_offsets[("TopicB", 0)] == 21
    assert queue_ends.decode(queue_ends.encode(end, {("T", 7): 5, ("Ü", 65_535): 0})) == \
        (end, {("T", 7): 5, ("Ü", 65_535): 0})


def test_a_clean_end_is_not_trusted_after_a_crash(config):
    """Once a store runs again its clean end is gone: a crash then gets abnormal recovery, and
    a clean end left behind by hand (the abort marker removed) is ignored unless it is the flushed
    offset."""
    from smartgo.store.checkpoint import Checkpoint
    with MessageStore(config, clock=Clock()) as s:
        put_many(s, 30)
    s = MessageStore(config, clock=Clock(1_800_000_000_000))
    s.open()
    assert Checkpoint(config.checkpoint_path).clean_end == 0
    put_many(s, 30, start=30)
    s.flush()
    s.abandon()
    state = recover(config)
    assert state.abnormal and state.checked_from < state.written
    cp = Checkpoint(config.checkpoint_path)
    cp.clean_end = cp.physic_offset - 1             # not what was flushed: not a clean stop's end
    cp.close()
    (Path(config.store_path) / "abort").unlink()
    state = recover(config)
    assert not state.abnormal and state.checked_from == segment_starts(config.commitlog_dir)[-3]


def test_abnormal_recovery_rebuilds_lost_queues_and_index(config):
    originals, _, _ = crashed(config, 40)
    shutil.rmtree(config.consume_queue_dir)
    shutil.rmtree(config.index_dir)
    with MessageStore(config, clock=Clock(1_800_000_000_000)) as s:
        assert s.recovered.abnormal and s.recovered.redispatched == 40
        assert served(s) == originals
        assert [decode_record(b).body[:3] for b in s.query_by_key("TopicB", "k20").buffers] == [b"20|"]


def test_abnormal_recovery_starts_from_the_checkpoint_file(config):
    # 10 s per message: the 3 s checkpoint margin spans few messages
    originals, written, _ = crashed(config, 60, Clock(step=10_000), body_len=300)
    files = segment_starts(config.commitlog_dir)
    assert len(files) >= 4
    state = recover(config)
    assert state.abnormal and 0 < state.redispatched < 60  # not from the first file
    assert state.written == written and state.queue_offsets == {q: 20 for q in QUEUES}
    with MessageStore(config, clock=Clock(1_800_000_000_000)) as s2:
        assert served(s2) == originals


def test_abnormal_recovery_checks_queue_entries_only_from_the_walk_start(config):
    """Entries whose records are older than where the CommitLog walk starts were flushed before the
    checkpoint (as those records were): only the entries from the walk's start are checked against
    their records, not each queue's last three files (seconds a queue at a large backlog)."""
    config = small_config(config.store_path, consume_queue_file_size=100)   # 5 entries a file
    originals, written, _ = crashed(config, 60, Clock(step=10_000), body_len=300)
    assert all(len(segment_starts(queue_dir(config.consume_queue_dir, *q))) == 4 for q in QUEUES)
    state = recover(config)
    assert state.abnormal and state.written == written and 0 < state.checked_from < written
    after = sum(1 for phys in originals if phys >= state.checked_from)
    assert after <= state.entries_checked <= after + len(QUEUES) < 3 * 5 * len(QUEUES)
    with MessageStore(config, clock=Clock(1_800_000_000_000)) as s:
        assert served(s) == originals


def test_commitlog_cut_truncates_consume_queues(config):
    """Flushed CommitLog data gone (a file cut short, the later ones deleted): the queues lose
    their entries for it, but keep its offsets as holes (consumers may have read them), so
    new messages continue after them."""
    originals, _, _ = crashed(config, 30)
    cut = sorted(originals)[17]
    path = commitlog_file(config, cut)
    os.truncate(path, cut % config.commitlog_file_size + 10)  # mid-record, file left short
    for start in segment_starts(config.commitlog_dir):
        if start > cut:
            os.unlink(config.commitlog_dir / segment_name(start))
    with MessageStore(config, clock=Clock(1_800_000_000_000)) as s2:
        assert s2.written == cut and os.path.getsize(path) == config.commitlog_file_size
        kept = {p: v for p, v in originals.items() if p < cut}
        assert served(s2) == kept
        expect = {q: sum(1 for v in originals.values() if v[1:3] == q) for q in QUEUES}
        assert {q: s2.max_offset(*q) for q in QUEUES} == expect
        r = s2.put(Message("TopicA", b"after", queue_id=1, properties={"KEYS": "afterkey"}))
        assert r.physical_offset == cut and r.queue_offset == expect[("TopicA", 1)]
        assert [m.body for m in s2.query_by_key("TopicA", "afterkey").messages()] == [b"after"]


def test_damaged_consume_queue_entry_is_rebuilt(tmp_path):
    config = small_config(tmp_path / "store", trust_clean_stop=False)   # damage made while stopped cleanly
    with MessageStore(config, clock=Clock()) as s:
        originals = put_many(s, 30)
    path = queue_dir(config.consume_queue_dir, "TopicA", 1) / segment_name(0)
    with open(path, "r+b") as f:
        f.seek(2 * 20)
        f.write(ENTRY.pack(12345, 77, 0))
    with MessageStore(config, clock=Clock(1_800_000_000_000)) as s:
        assert s.recovered.redispatched > 0
        assert served(s) == originals


@pytest.mark.timeout(120)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.integers(1, 40), after=st.integers(0, 40), cut_at=st.floats(0, 1),
       flips=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), max_size=4),
       lose_queue_tail=st.none() | st.sampled_from(QUEUES))
@example(before=39, after=9, cut_at=0.908203125, flips=[(0.0, 1), (0.5343268206606749, 1)], lose_queue_tail=None)
@example(before=39, after=9, cut_at=0.908203125, flips=[(0.5343268206606749, 1), (0.25, 1)], lose_queue_tail=None)
def test_crash_anywhere_after_the_flush(tmp_path_factory, before, after, cut_at, flips, lose_queue_tail):
    """Crash after a flush: the CommitLog is cut anywhere past the flushed position, bytes
    past it are flipped, unflushed ConsumeQueue entries are lost, the abort file stays.
    Recovery must keep everything flushed intact and reachable, and serve nothing torn."""
    config = small_config(tmp_path_factory.mktemp("crash") / "store")
    s = MessageStore(config, clock=Clock())
    s.open()
    originals = put_many(s, before)
    flushed_queues = {q: s.max_offset(*q) for q in QUEUES}
    flushed = s.flush()
    originals.update(put_many(s, after, start=before))
    written = s.written
    s.abandon()
    assert config.abort_path.exists()
    fs = config.commitlog_file_size
    cut = flushed + int((written - flushed) * cut_at)
    if cut < written:
        os.truncate(commitlog_file(config, cut), cut % fs)
        for start in segment_starts(config.commitlog_dir):
            if start > cut - cut % fs:
                os.unlink(config.commitlog_dir / segment_name(start))
    first_flip = None
    for where, xor in flips:
        pos = flushed + int((cut - flushed) * where)
        if pos < cut:
            with open(commitlog_file(config, pos), "r+b") as f:
                f.seek(pos % fs)
                byte = f.read(1)
                f.seek(pos % fs)
                f.write(bytes([byte[0] ^ xor]))
            first_flip = pos if first_flip is None else min(first_flip, pos)
    if lose_queue_tail:  # ConsumeQueue pages written after the flush never reached the disk
        topic, qid = lose_queue_tail
        keep = flushed_queues[(topic, qid)]
        path = queue_dir(config.consume_queue_dir, topic, qid) / segment_name(0)
        if path.exists() and keep * 20 < os.path.getsize(path):
            with open(path, "r+b") as f:
                f.seek(keep * 20)
                f.write(bytes(os.path.getsize(path) - keep * 20))

    s2 = MessageStore(config, clock=Clock(1_800_000_000_000))
    s2.open()
    try:
        assert s2.recovered.abnormal
        # the end is the cut, or the next file's start when the cut fell in a blank filler
        assert flushed <= s2.written <= cut or (
            s2.written % fs == 0 and s2.written - cut < fs and not any(cut <= p < s2.written for p in originals))
        assert_nothing_after(config, s2.written)
        got = served(s2)
        for phys, (raw, topic, qid, qoff) in originals.items():
            if phys + len(raw) <= flushed:  # flushed: intact and reachable through its queue
                assert got[phys] == (raw, topic, qid, qoff)
        for phys, (raw, topic, qid, qoff) in got.items():
            assert phys + len(raw) <= s2.written  # nothing past the recovered end
            assert check_record(memoryview(raw), 0, len(raw), phys) == len(raw)  # nothing torn
            if first_flip is None or phys + len(raw) <= first_flip:
                assert originals[phys] == (raw, topic, qid, qoff)
        for topic, qid in QUEUES:  # queues stay dense: offsets continue where the data ends
            r = s2.put(Message(topic, b"new", queue_id=qid))
            assert r.queue_offset == s2.max_offset(topic, qid) - 1
            assert decode_record(s2.get_messages(topic, qid, r.queue_offset, 1).buffers[0]).body == b"new"
    finally:
        s2.shutdown()


def test_checkpoint_keeps_rocketmq_fields_and_the_flushed_offset(tmp_path):
    """RocketMQ's three timestamps stay at bytes 0, 8 and 16 of the 4 KiB page; the flushed
    CommitLog offset (where abnormal recovery must start at the latest) is at byte 64, and a
    store's flush writes it."""
    import struct

    from smartgo.store.checkpoint import Checkpoint
    config = small_config(tmp_path / "store")
    with MessageStore(config, clock=Clock()) as s:
        put_many(s, 30)
        flushed = s.flush()
    assert flushed > 2 * config.commitlog_file_size
    raw = config.checkpoint_path.read_bytes()
    assert len(raw) == 4096 and struct.unpack_from(">q", raw, 64)[0] == flushed
    cp = Checkpoint(config.checkpoint_path)
    cp.physic_timestamp, cp.logics_timestamp, cp.index_timestamp, cp.physic_offset = 11, 22, 33, 44
    cp.flush()
    cp.close()
    raw = config.checkpoint_path.read_bytes()
    assert struct.unpack_from(">qqq", raw, 0) == (11, 22, 33) and struct.unpack_from(">q", raw, 64)[0] == 44


@pytest.mark.parametrize("crash", [False, True])
def test_a_cut_for_failover_drops_the_tail_and_its_queue_offsets(config, crash):
    """A demoted master's CommitLog is cut where its successor's term began (always a record
    boundary there; a cut inside a record goes back to its start). Unlike lost flushed data, the
    offsets of what is cut are not kept as holes: the new master gave them to other messages,
    whose records replication brings next."""
    if crash:
        originals, _, _ = crashed(config, 30)
    else:
        with MessageStore(config, clock=Clock()) as s:
            originals = put_many(s, 30)
    starts = sorted(originals)
    cut = starts[17]
    state = recover(config, cut + 10)
    assert state.written == cut
    assert state.last_store_timestamp == store_timestamp_at(originals[starts[16]][0], 0)
    assert_nothing_after(config, cut)
    with MessageStore(config, clock=Clock(1_800_000_000_000)) as s2:
        kept = {p: v for p, v in originals.items() if p < cut}
        assert served(s2) == kept
        expect = {q: sum(1 for v in kept.values() if v[1:3] == q) for q in QUEUES}
        assert {q: s2.max_offset(*q) for q in QUEUES} == expect
        r = s2.put(Message("TopicB", b"after", queue_id=0))
        assert r.physical_offset == cut and r.queue_offset == expect[("TopicB", 0)]


def test_a_cut_at_a_file_start_keeps_the_last_timestamp_before_it(config):
    """A cut where a CommitLog file begins (the record before it ends the previous file, or a
    filler does): the recovered newest store timestamp is that record's, which a demoted master
    turned slave later compares with its new master's oldest record."""
    with MessageStore(config, clock=Clock()) as s:
        originals = put_many(s, 30)
    fs = config.commitlog_file_size
    starts = sorted(originals)
    i = next(i for i, p in enumerate(starts) if i and p % fs == 0)
    state = recover(config, starts[i])
    assert state.written == starts[i]
    assert state.last_store_timestamp == store_timestamp_at(originals[starts[i - 1]][0], 0) > 0
    assert_nothing_after(config, starts[i])
