"""The in-process MessageStore: put/get, pull edge cases, filters, limits, queries, views,
time search, transactions, lock, disk full, cleanup, corrupt entries."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import time

import pytest

from smartgo.store import reads
from smartgo.store import (
    DiskFullError, GetStatus, InvalidMessageIdError, Message, MessageIllegalError, MessageStore, StoreLock,
    StoreLockedError,
)
from smartgo.store.cleanup import (
    delete_commitlog_before, delete_consume_queue_before, delete_index_before, expired_commitlog_files,
)
from smartgo.store.consume_queue import ENTRY, queue_dir
from smartgo.store.java_hash import tags_code
from smartgo.store.mapped_file import segment_name
from smartgo.store.record import (TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, decode_properties, decode_record,
                                  decode_records)

from .conftest import Clock, small_config


@pytest.fixture
def store(config):
    s = MessageStore(config, clock=Clock())
    s.open()
    yield s
    if s._opened:
        s.shutdown()


def msg(i, queue_id=0, topic="TopicA", tags=None, keys=None, body=None):
    props = {"UNIQ_KEY": f"UNIQ{i:08d}"}
    if tags:
        props["TAGS"] = tags
    if keys:
        props["KEYS"] = keys
    return Message(topic, body if body is not None else b"m%d" % i, queue_id=queue_id, properties=props,
                   born_host=("10.1.1.1", 5000))


def bodies(result):
    return [decode_record(b).body for b in result.buffers]


def test_put_then_get(store):
    for i in range(10):
        r = store.put(msg(i, queue_id=i % 2))
    assert r.queue_offset == 4 and len(r.msg_ids) == 1
    got = store.get_messages("TopicA", 1, 0, 32)
    assert got.status is GetStatus.FOUND and bodies(got) == [b"m1", b"m3", b"m5", b"m7", b"m9"]
    assert (got.next_begin_offset, got.min_offset, got.max_offset) == (5, 0, 5)
    assert got.buffer_total_size == sum(len(b) for b in got.buffers) == len(got.body())
    m = decode_records(got.body(), check_crc=True)[2]
    assert m.queue_offset == 2 and m.store_host == ("127.0.0.1", 10911) and m.born_host == ("10.1.1.1", 5000)
    store.reader.commitlog.forget_before(1 << 40)  # the reader unmaps: views handed out stay valid
    assert decode_record(got.buffers[0]).body == b"m1"


def test_pull_edge_cases(store, config):
    assert (s := store.get_messages("TopicA", 0, 0)).status is GetStatus.NO_MESSAGE_IN_QUEUE and s.next_begin_offset == 0
    assert store.get_messages("TopicA", 0, 5).next_begin_offset == 0
    for i in range(60):
        store.put(msg(i, body=b"x" * 400))
    one = store.get_messages("TopicA", 0, 60)
    assert (one.status, one.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 60)
    bad = store.get_messages("TopicA", 0, 99)
    assert (bad.status, bad.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 60)
    # cleanup removes the oldest CommitLog files: the queue's minimum moves up
    fs = config.commitlog_file_size
    store.flush()
    assert delete_commitlog_before(config, 2 * fs) == [0, fs]
    assert delete_consume_queue_before(config, store.commitlog_min_offset()) >= 1
    low = store.min_offset("TopicA", 0)
    assert low > 0
    small = store.get_messages("TopicA", 0, 0)
    assert (small.status, small.next_begin_offset, small.min_offset) == (GetStatus.OFFSET_TOO_SMALL, low, low)
    found = store.get_messages("TopicA", 0, low, 4)
    assert found.status is GetStatus.FOUND and decode_record(found.buffers[0]).queue_offset == low


def test_tag_filter_and_no_match(store):
    for i in range(20):
        store.put(msg(i, tags="TagA" if i % 5 == 0 else "TagB"))
    got = store.get_messages("TopicA", 0, 0, 32, {tags_code("TagA")})
    assert bodies(got) == [b"m0", b"m5", b"m10", b"m15"] and got.next_begin_offset == 20
    none = store.get_messages("TopicA", 0, 16, 32, {tags_code("TagC")})
    assert (none.status, none.next_begin_offset, none.buffers) == (GetStatus.NO_MATCHED_MESSAGE, 20, [])


def test_property_match_filters_by_the_record_itself(store, config, caplog):
    """The SQL92 hook (isMatchedByCommitLog): match sees each candidate's raw properties, after the
    tag filter; a record whose properties cannot be read is skipped with a log line."""
    seen = []
    results = [store.put(msg(i, tags="TagA" if i % 2 else "TagB")) for i in range(8)]

    def match(props: bytes) -> bool:
        seen.append(decode_properties(props)["UNIQ_KEY"])
        return int(seen[-1][4:]) % 3 == 0
    got = store.get_messages("TopicA", 0, 0, 32, {tags_code("TagA")}, match)
    assert bodies(got) == [b"m3"] and got.next_begin_offset == 8
    assert seen == [f"UNIQ{i:08d}" for i in (1, 3, 5, 7)]          # only what the tag filter let through
    none = store.get_messages("TopicA", 0, 0, 32, None, lambda props: False)
    assert (none.status, none.next_begin_offset) == (GetStatus.NO_MATCHED_MESSAGE, 8)
    with open(config.commitlog_dir / segment_name(0), "r+b") as f:
        f.seek(results[6].physical_offset + 84)                     # BODYLEN of m6: past its record
        f.write((1 << 30).to_bytes(4, "big"))
    got = store.get_messages("TopicA", 0, 0, 32, None, lambda props: True)
    assert bodies(got) == [b"m%d" % i for i in (0, 1, 2, 3, 4, 5, 7)]
    assert "properties cannot be read" in caplog.text


def test_pull_limits(tmp_path):
    with MessageStore(small_config(tmp_path / "a", commitlog_file_size=1 << 20)) as s:
        for i in range(50):
            s.put(msg(i, body=b"y" * 10))
        got = s.get_messages("TopicA", 0, 0, 100)
        assert got.message_count == 32 and got.next_begin_offset == 32  # 32 messages max
        assert s.get_messages("TopicA", 0, 0, 5).message_count == 5
    cfg = small_config(tmp_path / "b", commitlog_file_size=1 << 20, max_transfer_bytes_on_message_in_memory=2000)
    with MessageStore(cfg) as s:
        for i in range(10):
            s.put(msg(i, body=b"z" * 700))
        big = s.get_messages("TopicA", 0, 0, 32)
        assert big.message_count == 2 and big.buffer_total_size <= 2000 and big.next_begin_offset == 2
        # a single message larger than the byte limit is still delivered
        s.put(msg(10, queue_id=1, body=b"w" * 3000))
        assert s.get_messages("TopicA", 1, 0, 32).message_count == 1


def test_pull_limits_for_records_out_of_memory(tmp_path, monkeypatch):
    """isTheBatchFull: a record more than access_message_in_memory_max_ratio % of RAM behind the
    written position is "in disk", and a pull then stops at 64 KiB instead of 256 KiB (per record),
    still at 32 messages (4.x's 8 only multiplied the pulls of a consumer catching up)."""
    monkeypatch.setattr(reads, "physical_memory", lambda: 100 * 10_000)   # ratio 1: a 10,000-byte window
    cfg = small_config(tmp_path / "a", commitlog_file_size=1 << 20, access_message_in_memory_max_ratio=1)
    with MessageStore(cfg) as s:
        for i in range(100):
            s.put(msg(i, body=b"y" * 300))
        size = len(s.get_messages("TopicA", 0, 0, 1).buffers[0])
        in_memory = 10_000 // size                         # the newest records, within the window
        assert s.get_messages("TopicA", 0, 0, 32).message_count == 32
        assert s.get_messages("TopicA", 0, 0, 5).message_count == 5
        recent = s.get_messages("TopicA", 0, 100 - in_memory, 32)
        assert recent.message_count == in_memory and 8 < in_memory < 29
        # a pull starting 3 records outside the window runs on into it under the memory limits
        crossing = s.get_messages("TopicA", 0, 100 - in_memory - 3, 32)
        assert crossing.message_count == in_memory + 3
        assert s.reader.in_memory(s.written - 10_000, s.written) and not s.reader.in_memory(s.written - 10_001,
                                                                                            s.written)
    cfg = small_config(tmp_path / "b", commitlog_file_size=1 << 20, access_message_in_memory_max_ratio=0,
                       max_transfer_bytes_on_message_in_disk=1000)
    with MessageStore(cfg) as s:                            # ratio 0: everything counts as in disk
        for i in range(10):
            s.put(msg(i, body=b"z" * 300))
        got = s.get_messages("TopicA", 0, 0, 32)
        assert got.message_count == 2 and got.buffer_total_size <= 1000 and got.next_begin_offset == 2
    cfg = small_config(tmp_path / "c", commitlog_file_size=1 << 20, access_message_in_memory_max_ratio=0)
    with MessageStore(cfg) as s:                            # the byte budget: 64 KiB of 3 KB records
        for i in range(40):
            s.put(msg(i, body=b"k" * 3000))
        got = s.get_messages("TopicA", 0, 0, 32)
        assert got.message_count == (64 << 10) // len(got.buffers[0]) == 21


def page_cache_residency(path, start: int, length: int) -> list[bool]:
    """mincore(2): which pages of the file's [start, start + length) are in the page cache."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    buf = (ctypes.c_char * len(mm)).from_buffer(mm)
    try:
        vec = (ctypes.c_ubyte * -(-length // mmap.PAGESIZE))()
        if libc.mincore(ctypes.addressof(buf) + start, length, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return [bool(v & 1) for v in vec]
    finally:
        del buf
        mm.close()


@pytest.mark.timeout(60)
def test_a_pull_far_behind_the_newest_record_reads_the_commitlog_ahead(tmp_path):
    """A pull more than READ_AHEAD behind the written position asks the kernel to read the
    CommitLog ahead of it (MADV_WILLNEED), so a consumer catching up finds its next records in
    the page cache instead of stalling the net actor on page faults. The reader's mapping is made
    MADV_RANDOM here, so the kernel's own fault read-around reads nothing beyond the pages touched."""
    import mmap
    from tests.store.test_cold_queries import evict
    from tests.support.waits import wait_until
    cfg = small_config(tmp_path / "s", commitlog_file_size=16 << 20)
    with MessageStore(cfg) as s:
        while s.written < (6 << 20):
            s.put_batch([msg(i, body=b"r" * 400) for i in range(200)])
        path = cfg.commitlog_dir / segment_name(0)
        s.reader.release_pages()
        evict(cfg.commitlog_dir)
        ahead = range(1 << 20, (4 << 20) - mmap.PAGESIZE, mmap.PAGESIZE)      # reads.READ_AHEAD: 4 MiB
        assert not any(page_cache_residency(path, ahead.start, ahead.stop - ahead.start)), "pages not evicted"
        s.reader.commitlog.segment(0).mm.madvise(mmap.MADV_RANDOM)
        got = s.get_messages("TopicA", 0, 0, 32)
        assert got.message_count == 32 and got.max_phys_offset_pulling < 32 * 1024
        wait_until(lambda: all(page_cache_residency(path, ahead.start, ahead.stop - ahead.start)), timeout=20,
                   message="the CommitLog read ahead of the pull")


def test_put_batch_is_contiguous_with_consecutive_offsets(store):
    store.put(msg(0))
    r = store.put_batch([msg(i) for i in range(1, 6)])
    assert r.queue_offset == 1 and len(r.msg_ids) == 5
    msgs = [store.view_by_offset_msg_id(mid) for mid in r.msg_ids]
    assert [m.queue_offset for m in msgs] == [1, 2, 3, 4, 5]
    assert [m.body for m in msgs] == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert msgs[1].commit_log_offset == msgs[0].commit_log_offset + msgs[0].store_size
    with pytest.raises(Exception, match="one topic and queue"):
        store.put_batch([msg(1), msg(2, queue_id=1)])


def test_illegal_message_is_rejected_before_writing(store):
    before = store.written
    with pytest.raises(MessageIllegalError):
        store.put(Message("bad topic!", b"x"))
    with pytest.raises(MessageIllegalError):
        store.put(Message("TopicA", b"x" * (store.config.max_message_size + 1)))
    assert store.written == before


def test_query_by_key_filters_collisions_and_time(tmp_path):
    cfg = small_config(tmp_path / "s", index_slot_count=1, index_entry_count=500)  # all keys collide
    clock = Clock()
    with MessageStore(cfg, clock=clock) as s:
        for i in range(12):
            s.put(msg(i, keys="Aa" if i % 2 else "BB other"))
        s.put(msg(99, topic="TopicB", keys="Aa"))
        aa = s.query_by_key("TopicA", "Aa")
        assert sorted(m.body for m in aa.messages()) == [b"m%d" % i for i in (1, 11, 3, 5, 7, 9)]
        assert all(m.topic == "TopicA" and "Aa" in m.keys for m in aa.messages())
        assert [m.body for m in s.query_by_key("TopicA", "UNIQ00000004").messages()] == [b"m4"]
        assert len(s.query_by_key("TopicA", "other", max_num=3).buffers) == 3
        assert s.query_by_key("TopicA", "nothing").buffers == []
        times = [m.store_timestamp for m in aa.messages()]
        lo, hi = sorted(times)[1], sorted(times)[3]
        ranged = s.query_by_key("TopicA", "Aa", begin=lo, end=hi).messages()
        assert sorted(m.store_timestamp for m in ranged) == sorted(times)[1:4]
        assert aa.index_last_update_phyoffset > 0 and aa.index_last_update_timestamp > 0


def test_view_by_offset_msg_id(store):
    r = store.put(msg(7))
    m = store.view_by_offset_msg_id(r.msg_ids[0])
    assert m.body == b"m7" and m.msg_id == r.msg_ids[0]
    assert store.view_message(r.physical_offset + 3) is None
    assert store.view_message(10**9) is None
    with pytest.raises(InvalidMessageIdError):
        store.view_by_offset_msg_id("nothex")


def test_search_offset_by_time_and_earliest_time(store):
    assert store.earliest_message_time("TopicA", 0) == -1
    assert store.search_offset_by_time("TopicA", 0, 0) == 0
    stamps = [store.put(msg(i)).store_timestamp for i in range(10)]
    assert store.earliest_message_time("TopicA", 0) == stamps[0]
    assert store.search_offset_by_time("TopicA", 0, 0) == 0
    assert store.search_offset_by_time("TopicA", 0, stamps[4]) == 4
    assert store.search_offset_by_time("TopicA", 0, stamps[4] + 1) == 5
    assert store.search_offset_by_time("TopicA", 0, stamps[-1] + 10**6) == 10


def test_transactions_prepared_not_consumable_commit_is(store):
    p = store.put(Message("TopicA", b"half", properties={"TRAN_MSG": "true", "KEYS": "tx1"},
                          sys_flag=TRANSACTION_PREPARED_TYPE))
    assert p.queue_offset == 0 and store.max_offset("TopicA", 0) == 0
    assert store.query_by_key("TopicA", "tx1").buffers == []
    c = store.put(Message("TopicA", b"done", properties={"KEYS": "tx1"}, sys_flag=TRANSACTION_COMMIT_TYPE,
                          prepared_transaction_offset=p.physical_offset))
    assert c.queue_offset == 0 and store.max_offset("TopicA", 0) == 1
    assert [m.body for m in store.query_by_key("TopicA", "tx1").messages()] == [b"done"]
    assert store.view_message(p.physical_offset).body == b"half"


def test_schedule_topic_tags_code_is_delivery_time(store):
    r = store.put(Message("SCHEDULE_TOPIC_XXXX", b"later", queue_id=2,
                          properties={"DELAY": "3", "REAL_TOPIC": "TopicA", "REAL_QID": "0"}))
    entry = store.reader.queue("SCHEDULE_TOPIC_XXXX", 2).entry(0)
    assert entry == (r.physical_offset, len(store.view_message(r.physical_offset).body) + entry[1] - 5, r.store_timestamp + 10_000)


def test_clean_shutdown_and_reopen(config):
    s = MessageStore(config, clock=Clock())
    s.open()
    assert config.abort_path.exists()
    for i in range(30):
        s.put(msg(i, queue_id=i % 3))
    s.shutdown()
    assert not config.abort_path.exists()
    s2 = MessageStore(config, clock=Clock(start=1_800_000_000_000))
    state = s2.open()
    assert not state.abnormal and state.redispatched == 0 and state.queue_offsets == {("TopicA", q): 10 for q in range(3)}
    assert bodies(s2.get_messages("TopicA", 2, 8)) == [b"m26", b"m29"]
    assert s2.put(msg(30, queue_id=0)).queue_offset == 10
    s2.shutdown()


def _hold_lock(path, ready, release):
    lock = StoreLock(path).acquire()
    ready.set()
    release.wait(30)
    lock.release()


@pytest.mark.timeout(60)
def test_second_broker_on_the_same_store_is_refused(config):
    with MessageStore(config):
        with pytest.raises(StoreLockedError) as err:
            MessageStore(config).open()
        assert str(config.store_path) in str(err.value) and err.value.holder_pid == os.getpid()
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_lock, args=(config.store_path, ready, release))
    child.start()
    try:
        assert ready.wait(30)
        with pytest.raises(StoreLockedError) as err:
            MessageStore(config).open()
        assert err.value.holder_pid == child.pid and f"process {child.pid}" in str(err.value)
    finally:
        release.set()
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
    with MessageStore(config) as s:  # free again
        assert s.written == 0


def test_disk_full_put_raises_and_store_keeps_working(store, monkeypatch):
    real = os.posix_fallocate
    for i in range(8):
        store.put(msg(i, body=b"x" * 400))

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(DiskFullError):
        for i in range(20):
            store.put(msg(100 + i, body=b"x" * 400))
    written = store.written
    monkeypatch.setattr(os, "posix_fallocate", real)
    r = store.put(msg(200, body=b"x" * 400))
    assert r.physical_offset >= written
    assert bodies(store.get_messages("TopicA", 0, store.max_offset("TopicA", 0) - 1)) == [b"x" * 400]


def test_corrupt_consume_queue_entry_is_skipped_with_a_log(store, config, caplog):
    for i in range(4):
        store.put(msg(i))
    path = queue_dir(config.consume_queue_dir, "TopicA", 0) / segment_name(0)
    with open(path, "r+b") as f:
        f.seek(20)
        f.write(ENTRY.pack(3, 50, 0))  # points into the middle of record 0
    got = store.get_messages("TopicA", 0, 0, 32)
    assert bodies(got) == [b"m0", b"m2", b"m3"] and "points at no record" in caplog.text


def test_cleanup_primitives(store, config):
    for i in range(40):
        store.put(msg(i, body=b"x" * 400, keys=f"k{i}"))
    store.flush()
    now = time.time_ns() // 1_000_000  # file times are real
    assert expired_commitlog_files(config, now) == []  # all younger than 72 h
    old = expired_commitlog_files(config, now + 73 * 3_600_000)
    assert old == expired_commitlog_files(config, now, force=True) and len(old) >= 2
    assert config.commitlog_file_size * len(old) <= store.written
    deleted = delete_commitlog_before(config, old[-1] + config.commitlog_file_size)
    assert deleted == old
    cl_min = store.commitlog_min_offset()
    delete_index_before(config, cl_min)
    assert store.query_by_key("TopicA", "k0").buffers == []  # its record is gone: never returned
    assert [m.body for m in store.query_by_key("TopicA", "k39").messages()] == [b"x" * 400]
