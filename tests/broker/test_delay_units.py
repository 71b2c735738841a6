"""Delayed messages without processes: the send rewrite, the re-published record, copy
signatures, delayOffset.json, GET_ALL_DELAY_OFFSET, the level table setting; and the transaction
rewrites of the same module (the half message, the committed message)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from smartgo.broker.schedule.schedule_message import (HALF_TOPIC, ScheduleRecordError, copy_signature, deliver_time,
                                                      end_transaction_record, half_copy, half_rewrite,
                                                      is_copy_candidate, republish, schedule_rewrite)
from smartgo.broker.schedule.schedule_offsets import DelayOffsetFile, DelayState, decode_state, get_all_delay_offset
from smartgo.broker.settings import delay_levels
from smartgo.config import ConfigError, NodeConfig
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store import Block, CommitLogReader, CommitLogWriter
from smartgo.store.errors import MessageIllegalError
from smartgo.store.record import (BORNHOST_V6_FLAG, MULTI_TAGS_FLAG, SCHEDULE_TOPIC, TRANSACTION_COMMIT_TYPE,
                                  decode_properties, decode_record, encode_properties, encode_record, pack_host,
                                  peek_head)

ROOT = Path(__file__).resolve().parents[2]


def props(**kv: str) -> str:
    return encode_properties(kv).decode()


# ---- the send path's rewrite ------------------------------------------------------------------------------

@pytest.mark.parametrize("tran, reconsumed, delay, half", [
    ("true", 0, None, True), ("TRUE", 0, None, True), ("false", 0, None, False), ("yes", 0, None, False),
    ("true", 1, "3", False),           # an old client's send-back of a transactional message: stored as sent
    ("true", 1, None, True), ("true", 0, "3", True),
])
def test_half_rewrite_goes_by_tran_msg_as_java_parses_it(tran, reconsumed, delay, half):
    extra = {"DELAY": delay} if delay else {}
    out = half_rewrite(props(TAGS="A", TRAN_MSG=tran, REAL_QID="9", **extra), "Orders", 5, reconsumed)
    assert (out is not None) == half
    if half:
        assert out[:2] == (HALF_TOPIC, 0)
        assert decode_properties(out[2]) == {"TAGS": "A", "TRAN_MSG": tran, **extra, "REAL_TOPIC": "Orders",
                                             "REAL_QID": "5"}


def test_a_committed_half_is_its_message_again():
    half = encode_record(HALF_TOPIC, 0, b"body", props(TAGS="A", TRAN_MSG="true", PGROUP="G", REAL_TOPIC="Orders",
                                                       REAL_QID="5").encode(),
                         flag=7, sys_flag=MULTI_TAGS_FLAG, born_timestamp=123, reconsume_times=2, queue_offset=9,
                         physical_offset=4096, store_timestamp=456)
    final = end_transaction_record(half, TRANSACTION_COMMIT_TYPE, 4096)
    msg = decode_record(final.data, check_crc=True)
    assert (final.topic, final.queue_id, msg.topic, msg.queue_id) == ("Orders", 5, "Orders", 5)
    assert msg.sys_flag == MULTI_TAGS_FLAG | TRANSACTION_COMMIT_TYPE and msg.prepared_transaction_offset == 4096
    assert (msg.body, msg.flag, msg.born_timestamp, msg.reconsume_times) == (b"body", 7, 123, 2)
    assert (msg.queue_offset, msg.commit_log_offset, msg.store_timestamp) == (0, 0, 0)    # the commit actor's
    assert msg.properties == {"TAGS": "A", "PGROUP": "G"}
    with pytest.raises(ScheduleRecordError):          # a half without its route
        end_transaction_record(encode_record(HALF_TOPIC, 0, b"x", props(TRAN_MSG="true").encode()),
                               TRANSACTION_COMMIT_TYPE, 0)


@pytest.mark.parametrize("topic, checks", [("TRANS_CHECK_MAX_TIME_TOPIC", 15), (HALF_TOPIC, 0)])
def test_a_half_copy_keeps_everything_but_topic_queue_and_check_times(topic, checks):
    """The given-up copy and the half RESUME_CHECK_HALF_MESSAGE puts back (4.x's toMessageExtBrokerInner)."""
    half = encode_record(HALF_TOPIC, 0, b"body", props(TAGS="A", TRAN_MSG="true", PGROUP="G", REAL_TOPIC="Orders",
                                                       REAL_QID="5", TRANSACTION_CHECK_TIMES="3", UNIQ_KEY="U").encode(),
                         flag=7, sys_flag=MULTI_TAGS_FLAG, born_timestamp=123, reconsume_times=2, queue_offset=9,
                         physical_offset=4096, store_timestamp=456, born_host=pack_host("10.0.0.9", 1234))
    copy = decode_record(half_copy(half, topic, checks), check_crc=True)
    original = decode_record(half)
    assert (copy.topic, copy.queue_id) == (topic, 0)
    assert (copy.queue_offset, copy.commit_log_offset, copy.store_timestamp) == (0, 0, 0)    # the commit actor's
    for kept in ("body", "flag", "sys_flag", "born_timestamp", "born_host", "store_host", "reconsume_times"):
        assert getattr(copy, kept) == getattr(original, kept), kept
    assert copy.properties == {**original.properties, "TRANSACTION_CHECK_TIMES": str(checks)}


@pytest.mark.parametrize("properties, error", [
    (props(TAGS="A"), "REAL_TOPIC"),                                  # a plain message: no producer could end it
    (props(REAL_TOPIC="Orders", REAL_QID="5", BIG="p" * 32727), "32767"),   # no room for the check count
])
def test_a_half_copy_refuses_what_it_cannot_copy(properties, error):
    with pytest.raises(ScheduleRecordError, match=error):
        half_copy(encode_record("Orders", 0, b"x", properties.encode()), HALF_TOPIC, 0)


def test_rewrite_moves_a_delayed_message_to_the_schedule_queue_of_its_level():
    topic, queue, out = schedule_rewrite(props(TAGS="A", DELAY="3", UNIQ_KEY="U"), "Orders", 5, 18)
    assert (topic, queue) == (SCHEDULE_TOPIC, 2)
    assert decode_properties(out) == {"TAGS": "A", "DELAY": "3", "UNIQ_KEY": "U", "REAL_TOPIC": "Orders",
                                      "REAL_QID": "5"}
    assert out.split("\x02")[:3] == ["TAGS\x01A", "DELAY\x013", "UNIQ_KEY\x01U"]      # order kept, real ones last


def test_rewrite_caps_the_level_and_replaces_stale_real_topic_and_queue():
    topic, queue, out = schedule_rewrite(props(DELAY="40", REAL_TOPIC="Old", REAL_QID="9", K="v"), "New", 1, 18)
    assert queue == 17
    p = decode_properties(out)
    assert p == {"DELAY": "18", "K": "v", "REAL_TOPIC": "New", "REAL_QID": "1"}
    assert out.count("REAL_TOPIC") == 1 and out.count("REAL_QID") == 1


@pytest.mark.parametrize("delay", ["0", "-2"])
def test_rewrite_leaves_level_zero_or_below_alone(delay):
    assert schedule_rewrite(props(DELAY=delay), "T", 0, 18) is None
    assert schedule_rewrite(props(TAGS="DELAY"), "T", 0, 18) is None


def test_rewrite_takes_the_last_delay_and_refuses_a_non_integer():
    assert schedule_rewrite("DELAY\x015\x02DELAY\x012", "T", 0, 18)[1] == 1
    with pytest.raises(MessageIllegalError, match="not a delay level"):
        schedule_rewrite(props(DELAY="soon"), "T", 0, 18)


# ---- the re-published record --------------------------------------------------------------------------------

def scheduled_record(extra: dict | None = None, **kw) -> bytes:
    p = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABC", "DELAY": "2", "own": "x", "REAL_TOPIC": "Real",
         "REAL_QID": "3", "CLUSTER": "DefaultCluster", **(extra or {})}
    args = dict(flag=7, sys_flag=MULTI_TAGS_FLAG, born_timestamp=1_700_000_000_123,
                born_host=pack_host("10.1.2.3", 5555), store_host=pack_host("127.0.0.1", 10911), reconsume_times=4,
                queue_offset=12, physical_offset=4096, store_timestamp=1_700_000_000_456)
    args.update(kw)
    return encode_record(SCHEDULE_TOPIC, 1, b"the body", encode_properties(p), **args)


def test_republish_keeps_everything_but_delay_and_routes_to_the_real_queue():
    original = decode_record(scheduled_record())
    out = republish(scheduled_record())
    assert (out.topic, out.queue_id) == ("Real", 3)
    copy = decode_record(out.data, check_crc=True)
    assert copy.topic == "Real" and copy.queue_id == 3
    assert "DELAY" not in copy.properties
    assert copy.properties == {k: v for k, v in original.properties.items() if k != "DELAY"}
    for name in ("body", "flag", "sys_flag", "born_timestamp", "born_host", "store_host", "reconsume_times",
                 "body_crc", "prepared_transaction_offset"):
        assert getattr(copy, name) == getattr(original, name), name
    assert (copy.queue_offset, copy.commit_log_offset, copy.store_timestamp) == (0, 0, 0)   # commit's to fill
    assert copy.store_size == len(out.data)


@pytest.mark.parametrize("props, error", [
    ({"DELAY": "1", "REAL_QID": "1"}, "no REAL_TOPIC"), ({"DELAY": "1", "REAL_TOPIC": "T"}, "no REAL_TOPIC"),
    ({"REAL_TOPIC": "T", "REAL_QID": "x"}, "REAL_QID"), ({"REAL_TOPIC": "T", "REAL_QID": "-1"}, "REAL_QID"),
    ({"REAL_TOPIC": "bad topic!", "REAL_QID": "0"}, "REAL_TOPIC"),
])
def test_republish_refuses_records_it_cannot_route(props, error):
    with pytest.raises(ScheduleRecordError, match=error):
        republish(encode_record(SCHEDULE_TOPIC, 0, b"b", encode_properties(props)))


@pytest.mark.parametrize("cut", [10, 60, 95])
def test_republish_refuses_a_garbled_record(cut):
    rec = bytearray(scheduled_record())
    with pytest.raises(ScheduleRecordError):
        republish(bytes(rec[:cut]))
    rec[4] ^= 0xFF                                      # bad magic
    with pytest.raises(ScheduleRecordError):
        republish(bytes(rec))


def test_republish_handles_an_ipv6_born_host_of_a_foreign_store():
    rec = bytearray(scheduled_record())
    # turn the 8-byte born host into a 20-byte one (IPv6 + port) and flag it
    v6 = bytes(16) + rec[52:56]
    rec[48:56] = v6
    rec[36:40] = (MULTI_TAGS_FLAG | BORNHOST_V6_FLAG).to_bytes(4, "big")
    rec[0:4] = len(rec).to_bytes(4, "big")
    out = republish(bytes(rec))
    copy = decode_record(out.data, check_crc=True)
    assert copy.born_host == ("::", 5555) and copy.body == b"the body" and "DELAY" not in copy.properties
    assert copy_signature(out.data) == copy_signature(out.data)


def test_copy_signature_matches_the_appended_copy_only(tmp_path):
    out = republish(scheduled_record())
    writer = CommitLogWriter(tmp_path, 1 << 16, 0, {("Real", 3): 41})
    writer.append([Block(encode_record("Other", 0, b"noise", b"REAL_QID\x013"), ("Other", 0)),
                   Block(out.data, ("Real", 3))])
    reader = CommitLogReader(tmp_path, 1 << 16)
    try:
        (p1, mm, r1, s1), (p2, _, r2, s2) = list(reader.walk(0, writer.wrote_position))
        noise, copy = bytes(mm[r1:r1 + s1]), bytes(mm[r2:r2 + s2])
        assert decode_record(copy).queue_offset == 41 and decode_record(copy).commit_log_offset == p2
        assert copy_signature(copy) == copy_signature(out.data)
        assert copy_signature(noise) != copy_signature(out.data)
        other = republish(scheduled_record({"UNIQ_KEY": "DEF"}))
        assert copy_signature(other.data) != copy_signature(copy)
        _, topic, _, _, _, _, raw_props = peek_head(mm, r2)
        assert is_copy_candidate(topic, raw_props)
        assert not is_copy_candidate(b"Other", b"TAGS\x01a")
        assert not is_copy_candidate(SCHEDULE_TOPIC.encode(), b"REAL_QID\x011")
    finally:
        reader.close()
        writer.close()


def test_deliver_time_is_corrected_when_further_than_the_level_delay():
    assert deliver_time(1500, 1000, 1000) == 1500
    assert deliver_time(2000, 1000, 1000) == 2000
    assert deliver_time(2001, 1000, 1000) == 1000          # beyond now + delay: the clock went back


# ---- delayOffset.json -----------------------------------------------------------------------------------------

def test_offsets_file_round_trip_keeps_the_previous_state_as_bak(tmp_path):
    f = DelayOffsetFile(tmp_path)
    assert f.load() is None
    f.save(DelayState({1: 12, 3: 0}, 4096))
    assert json.loads(f.path.read_bytes()) == {"offsetTable": {"1": 12, "3": 0}, "scanFrom": 4096}
    f.save(DelayState({1: 13, 3: 2}, 8192))
    assert f.load() == DelayState({1: 13, 3: 2}, 8192)
    assert decode_state(f.file.bak.read_bytes()) == DelayState({1: 12, 3: 0}, 4096)


def test_offsets_file_reads_rocketmq_bare_keys_and_falls_back_to_bak(tmp_path, caplog):
    f = DelayOffsetFile(tmp_path)
    f.path.parent.mkdir(parents=True)
    f.path.write_text('{\n\t"offsetTable":{1:5,2:7}\n}')          # what RocketMQ's fastjson writes
    assert f.load() == DelayState({1: 5, 2: 7}, None)
    f.save(DelayState({1: 6}, 100))
    f.path.write_bytes(b'{"offsetTable":')                         # corrupt: the .bak holds the older state
    assert f.load() == DelayState({1: 5, 2: 7}, None)
    f.file.bak.write_bytes(b'{"offsetTable":{"1":-4}}')
    assert f.load() is None
    assert "negative" in caplog.text


@pytest.mark.parametrize("raw", [b"[]", b'{"offsetTable":[1]}', b'{"offsetTable":{"x":1}}', b'{"offsetTable":{"1":2},'
                                 b'"scanFrom":"a"}', b"\xff"])
def test_decode_state_refuses_what_is_not_an_offset_table(raw):
    with pytest.raises(ValueError):
        decode_state(raw)


def test_get_all_delay_offset_answers_the_table_without_our_field(tmp_path):
    request = RemotingCommand(RequestCode.GET_ALL_DELAY_OFFSET)
    r = asyncio.run(get_all_delay_offset(tmp_path, request))
    assert r.code == ResponseCode.SUCCESS and json.loads(r.body) == {"offsetTable": {}}
    DelayOffsetFile(tmp_path).save(DelayState({2: 9, 1: 4}, 77))
    r = asyncio.run(get_all_delay_offset(tmp_path, request))
    assert r.body == b'{"offsetTable":{"1":4,"2":9}}'
    DelayOffsetFile(tmp_path).path.write_bytes(b"garbage")           # unreadable, no .bak: an empty table
    r = asyncio.run(get_all_delay_offset(tmp_path, request))
    assert r.code == ResponseCode.SUCCESS and json.loads(r.body) == {"offsetTable": {}}


# ---- the level table -----------------------------------------------------------------------------------------

def test_level_table_setting():
    assert delay_levels(NodeConfig(role="master"))[:3] == (1000, 5000, 10000)
    assert delay_levels(NodeConfig(role="master", message_delay_level="2s 1m 1h 1d")) == (2000, 60000, 3600000,
                                                                                           86400000)
    for bad in ("", "5", "1x", "s", "1.5s"):
        with pytest.raises(ConfigError, match="message_delay_level"):
            delay_levels(NodeConfig(role="master", message_delay_level=bad))


def test_a_malformed_level_table_stops_the_supervisor_with_a_settings_error(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "supervisor.py"), "--role", "master", "--store-dir",
                          str(tmp_path), "--message-delay-level", "1s 5q"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "message_delay_level" in out.stderr
