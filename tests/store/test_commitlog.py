"""CommitLog writer and reader: patching, rolling, atomic batches, bounds, disk full."""

from __future__ import annotations

import errno
import os

import pytest

from smartgo.store import Block, CommitLogReader, CommitLogWriter, DiskFullError, OffsetGoneError
from smartgo.store.errors import CorruptRecordError, StoreError
from smartgo.store.mapped_file import MappedFileQueue, segment_name
from smartgo.store.record import BLANK_MAGIC, SIZE_MAGIC, decode_record

from .conftest import rec


def writer(config, position=0, table=None, clock=lambda: 1000):
    return CommitLogWriter(config.commitlog_dir, config.commitlog_file_size, position,
                           {} if table is None else table, clock=clock, release_interval=8192)


def test_append_patches_offsets_and_store_time(config):
    table = {("TopicA", 1): 7}
    w = writer(config, table=table)
    r1 = rec(queue_id=1, body=b"one")
    res = w.append([Block(r1, ("TopicA", 1)), Block(r1 + r1, ("TopicA", 1), 2), Block(rec(queue_id=2), None)])
    assert [(r.physical_offset, r.queue_offset, r.count) for r in res] == [(0, 7, 1), (len(r1), 8, 2),
                                                                          (3 * len(r1), 0, 1)]
    assert table == {("TopicA", 1): 10}  # the prepared/rollback block (queue None) took no offset
    assert w.wrote_position == res[-1].end_offset == 3 * len(r1) + len(rec(queue_id=2))
    reader = CommitLogReader(config.commitlog_dir, config.commitlog_file_size)
    msgs = [decode_record(reader.record_at(off, w.wrote_position), check_crc=True)
            for off in (0, len(r1), 2 * len(r1), 3 * len(r1))]
    assert [(m.commit_log_offset, m.queue_offset, m.store_timestamp) for m in msgs] == [
        (0, 7, 1000), (len(r1), 8, 1000), (2 * len(r1), 9, 1000), (3 * len(r1), 0, 1000)]
    w.close()
    reader.close()


def test_store_time_never_goes_backwards(config):
    times = iter([5000, 4000])
    w = writer(config, clock=lambda: next(times))
    a, b = w.append([Block(rec(), ("TopicA", 0))]), w.append([Block(rec(), ("TopicA", 0))])
    assert a[0].store_timestamp == b[0].store_timestamp == 5000
    w.close()


def test_roll_writes_blank_filler_and_batch_never_straddles(config):
    fs = config.commitlog_file_size
    r = rec(body=b"x" * 300)  # 3xx bytes
    w = writer(config)
    per_file = (fs - 8) // len(r)
    res = w.append([Block(r, ("TopicA", 0)) for _ in range(per_file)])
    assert res[-1].end_offset == per_file * len(r)
    batch = r * 3
    [b] = w.append([Block(batch, ("TopicA", 0), 3)])
    assert b.physical_offset == fs and b.queue_offset == per_file  # whole batch in the next file
    mm = MappedFileQueue(config.commitlog_dir, fs, writable=False).get(0).mm
    size, magic = SIZE_MAGIC.unpack_from(mm, per_file * len(r))
    assert (size, magic) == (fs - per_file * len(r), BLANK_MAGIC)
    assert sorted(os.listdir(config.commitlog_dir)) == [segment_name(0), segment_name(fs)]
    reader = CommitLogReader(config.commitlog_dir, fs)
    walked = [(off, size) for off, _mm, _rel, size in reader.walk(0, w.wrote_position)]
    assert [o for o, _ in walked] == [i * len(r) for i in range(per_file)] + [fs, fs + len(r), fs + 2 * len(r)]
    w.close()
    reader.close()


def test_record_exactly_filling_all_but_8_bytes_fits(config):
    fs = config.commitlog_file_size
    w = writer(config)
    body = b"y" * (fs - 8 - len(rec(body=b"")))
    [r] = w.append([Block(rec(body=body), ("TopicA", 0))])
    assert r.physical_offset == 0 and r.end_offset == fs - 8
    [r2] = w.append([Block(rec(), ("TopicA", 0))])
    assert r2.physical_offset == fs
    w.close()


def test_bad_blocks_are_rejected_without_side_effects(config):
    table = {}
    w = writer(config, table=table)
    good = rec()
    res = w.append([
        Block(good, ("TopicA", 0)),
        Block(b"\x00" * 120, ("TopicA", 0)),  # not a record
        Block(good + good, ("TopicA", 0), 3),  # count mismatch
        Block(good, ("TopicA", 5)),  # record says queue 0, block says 5
        Block(rec(body=b"z" * 5000), ("TopicA", 0)),  # can never fit a 4 KiB file
        Block(b"abc", ("TopicA", 0)),
        Block(good, ("TopicA", 0)),
    ])
    assert [type(r).__name__ for r in res] == ["AppendResult"] + ["MessageIllegalError"] * 5 + ["AppendResult"]
    assert res[-1].physical_offset == len(good) and res[-1].queue_offset == 1
    assert table == {("TopicA", 0): 2}
    mm = MappedFileQueue(config.commitlog_dir, config.commitlog_file_size, writable=False).get(0).mm
    assert not any(mm[w.wrote_position:])  # nothing half-valid left beyond the written position
    w.close()


def test_a_queue_past_max_queues_is_refused_and_open_queues_go_on(config):
    table = {("TopicA", 0): 4}
    w = writer(config, table=table)
    w.max_queues = 2
    res = w.append([Block(rec(queue_id=1), ("TopicA", 1)), Block(rec(queue_id=2), ("TopicA", 2)),
                    Block(rec(), ("TopicA", 0)), Block(rec(queue_id=2), None)])
    assert [type(r).__name__ for r in res] == ["AppendResult", "QueuesFullError", "AppendResult", "AppendResult"]
    assert str(res[1]) == ("no room for queue 2 of topic TopicA: the broker holds 2 queues, its limit "
                           "(the board's queue table)")
    assert table == {("TopicA", 0): 5, ("TopicA", 1): 1}
    assert res[2].physical_offset == res[0].end_offset          # the refused block took no room
    w.close()


def test_disk_full_at_roll_is_a_clear_error_and_changes_nothing(config, monkeypatch):
    fs = config.commitlog_file_size
    r = rec(body=b"x" * 1000)
    w = writer(config)
    w.append([Block(r, ("TopicA", 0)), Block(r, ("TopicA", 0)), Block(r, ("TopicA", 0))])
    before = w.wrote_position
    real = os.posix_fallocate

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    res = w.append([Block(r, ("TopicA", 0)), Block(r, ("TopicA", 0))])
    assert all(isinstance(x, DiskFullError) for x in res)
    assert "disk full" in str(res[0]) and str(config.commitlog_dir) in str(res[0])
    assert w.wrote_position == before and w.queue_offsets[("TopicA", 0)] == 3
    assert sorted(os.listdir(config.commitlog_dir)) == [segment_name(0)]  # no half-made file left
    monkeypatch.setattr(os, "posix_fallocate", real)
    [ok] = w.append([Block(r, ("TopicA", 0))])
    assert ok.physical_offset == fs and ok.queue_offset == 3
    w.close()


def test_disk_full_when_creating_the_first_file(config, monkeypatch):
    monkeypatch.setattr(os, "posix_fallocate", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(DiskFullError):
        writer(config)


def test_reader_bounds_and_gone_files(config):
    fs = config.commitlog_file_size
    w = writer(config)
    r = rec(body=b"x" * 1000)
    for _ in range(8):
        w.append([Block(r, ("TopicA", 0))])
    written = w.wrote_position
    reader = CommitLogReader(config.commitlog_dir, fs)
    assert bytes(reader.read(0, 8, written)) == bytes(reader.record_at(0, written))[:8]
    with pytest.raises(ValueError):
        reader.read(written - 4, 8, written)
    with pytest.raises(CorruptRecordError):
        reader.record_at(5, written)  # not a record boundary
    with pytest.raises(CorruptRecordError):
        reader.record_at(0, 50)  # record passes the bound
    MappedFileQueue(config.commitlog_dir, fs, writable=True).delete_files_before(fs)
    reader.forget_before(fs)
    with pytest.raises(OffsetGoneError):
        reader.record_at(0, written)
    assert reader.min_offset() == fs
    assert bytes(reader.record_at(fs, written))[:4] == len(r).to_bytes(4, "big")
    w.close()
    reader.close()


def test_walk_raises_on_garbage_below_the_bound(config):
    w = writer(config)
    w.append([Block(rec(), ("TopicA", 0))])
    reader = CommitLogReader(config.commitlog_dir, config.commitlog_file_size)
    with pytest.raises(CorruptRecordError):
        list(reader.walk(0, w.wrote_position + 200))
    verify = reader.walk(0, None, verify=True)
    assert len(list(verify)) == 1 and verify.position == w.wrote_position and verify.stopped == "end of data"
    w.close()
    reader.close()


def test_replica_append_copies_bytes_verbatim(config, tmp_path):
    from .conftest import small_config
    w = writer(config)
    r = rec(body=b"x" * 1000)
    for _ in range(6):
        w.append([Block(r, ("TopicA", 0))])
    src = CommitLogReader(config.commitlog_dir, config.commitlog_file_size)
    slave_cfg = small_config(tmp_path / "slave")
    slave = writer(slave_cfg)
    pos = 0
    while pos < w.wrote_position:
        fs = config.commitlog_file_size
        chunk = src.read(pos, min(1500, fs - pos % fs, w.wrote_position - pos), w.wrote_position)
        pos = slave.append_replica(pos, chunk)
    assert slave.wrote_position == w.wrote_position
    with pytest.raises(StoreError):
        slave.append_replica(0, b"x")
    copy = CommitLogReader(slave_cfg.commitlog_dir, slave_cfg.commitlog_file_size)
    assert [bytes(m[1][m[2]:m[2] + m[3]]) for m in copy.walk(0, pos)] == \
        [bytes(m[1][m[2]:m[2] + m[3]]) for m in src.walk(0, pos)]
    for x in (w, slave, src, copy):
        x.close()


def test_whole_records_end_at_a_record_for_every_cut_of_a_replicated_tail(config, tmp_path):
    """A slave copies the master's bytes in chunks cut anywhere (mid-header, mid-record, inside
    a file's end filler): whole_records always stops at a record boundary at or below the copy's
    end, and reaches the master's written position when the copy does. 4 KiB files: fillers."""
    from .conftest import small_config
    w = writer(config)
    for i in range(40):
        w.append([Block(rec(body=bytes([65 + i % 26]) * (150 + 37 * i % 400)), ("TopicA", 0))])
    end = w.wrote_position
    src = CommitLogReader(config.commitlog_dir, config.commitlog_file_size)
    records = [(phys, size) for phys, _, _, size in src.walk(0, end)]
    starts = {phys for phys, _ in records}
    fs = config.commitlog_file_size
    boundaries = starts | {phys + size for phys, size in records}      # record starts and ends
    for step in (1, 7, 90, 1000):
        slave_cfg = small_config(tmp_path / f"slave{step}")
        slave = writer(slave_cfg)
        copy = CommitLogReader(slave_cfg.commitlog_dir, fs)
        pos = aligned = 0
        while pos < end:
            chunk = src.read(pos, min(step, fs - pos % fs, end - pos), end)
            pos = slave.append_replica(pos, chunk)
            aligned, last = copy.whole_records(aligned, pos)
            assert aligned <= pos and aligned in boundaries, (step, pos, aligned)
            assert last == -1 or last in starts
        assert aligned == end
        slave.close()
        copy.close()
    src.close()
    w.close()


def test_whole_records_refuses_bytes_that_are_not_a_log(config):
    w = writer(config)
    w.append([Block(rec(), ("TopicA", 0))])
    first = w.wrote_position
    w.append([Block(rec(), ("TopicA", 0))])
    reader = CommitLogReader(config.commitlog_dir, config.commitlog_file_size, writable=True)
    SIZE_MAGIC.pack_into(reader.segment(0).mm, first, 100, 12345)      # the second record's header
    assert reader.whole_records(0, first) == (first, 0)
    with pytest.raises(CorruptRecordError, match="neither a record nor a file-end filler"):
        reader.whole_records(0, w.wrote_position)
    w.close()
    reader.close()


def test_released_pages_keep_their_data(config):
    """madvise(DONTNEED) behind the writer drops pages from RSS, never data."""
    w = writer(config)
    r = rec(body=b"q" * 500)
    for _ in range(30):
        w.append([Block(r, ("TopicA", 0))])
    reader = CommitLogReader(config.commitlog_dir, config.commitlog_file_size)
    bodies = [decode_record(m[1], m[2], check_crc=True).body for m in reader.walk(0, w.wrote_position)]
    assert bodies == [b"q" * 500] * 30
    w.close()
    reader.close()


def test_disk_full_on_a_sparse_filesystem_is_caught_at_creation(config, monkeypatch):
    """Without fallocate the file stays sparse; the zeroed first page still meets ENOSPC at
    creation (a clear error, no half-made file) rather than as a SIGBUS on the first store."""
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    def no_space(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    monkeypatch.setattr(os, "pwrite", no_space)
    with pytest.raises(DiskFullError):
        writer(config)
    assert [n for n in os.listdir(config.commitlog_dir) if not n.startswith(".")] == []

