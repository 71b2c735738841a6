"""QUERY_MESSAGE, VIEW_MESSAGE_BY_ID and the four per-queue offset requests against a real node."""

from __future__ import annotations

import time

from tests.support.broker import offset_command, pull_command, send_command, uniq_key
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import decode_records, parse_offset_msg_id
from tests.support.waits import wait_until

FOREVER = 1 << 62


def query(broker, topic, key, max_num=32, unique=False):
    ext = {"topic": topic, "key": key, "maxNum": str(max_num), "beginTimestamp": "0", "endTimestamp": str(FOREVER)}
    if unique:
        ext["_UNIQUE_KEY_QUERY"] = "true"
    return broker.call(RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields=ext))


def max_offset(broker, topic, queue_id=0):
    return int(broker.call(offset_command(RequestCode.GET_MAX_OFFSET, topic, queue_id)).ext_fields["offset"])


def test_query_by_key_and_by_unique_key(broker):
    topic = "Queried"
    keys = [uniq_key() for _ in range(3)]
    for i, k in enumerate(keys):
        assert broker.call(send_command(topic, b"q%d" % i, keys="order-7 shared", uniq=k)).code == 0
    wait_until(lambda: max_offset(broker, topic) == 3)
    by_key = query(broker, topic, "order-7")
    assert by_key.code == ResponseCode.SUCCESS
    assert sorted(m.body for m in decode_records(by_key.body_bytes())) == [b"q0", b"q1", b"q2"]
    assert int(by_key.ext_fields["indexLastUpdateTimestamp"]) > 0
    assert "indexLastUpdatePhyoffset" in by_key.ext_fields
    one = query(broker, topic, keys[1], unique=True)
    assert [m.body for m in decode_records(one.body_bytes())] == [b"q1"]
    limited = query(broker, topic, "shared", max_num=2)
    assert len(decode_records(limited.body_bytes())) == 2
    missing = query(broker, topic, "no-such-key")
    assert missing.code == ResponseCode.QUERY_NOT_FOUND and "can not find message" in missing.remark
    assert query(broker, "OtherTopic", "order-7").code == ResponseCode.QUERY_NOT_FOUND   # keys are per topic


def test_view_by_id(broker):
    sent = broker.call(send_command("Viewed", b"look at me", tags="V"))
    _, _, offset = parse_offset_msg_id(sent.ext_fields["msgId"])
    r = broker.call(RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID, ext_fields={"offset": str(offset)}))
    assert r.code == ResponseCode.SUCCESS
    (m,) = decode_records(r.body_bytes(), check_crc=True)
    assert (m.body, m.msg_id, m.tags) == (b"look at me", sent.ext_fields["msgId"], "V")
    bad = broker.call(RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID, ext_fields={"offset": str(offset + 3)}))
    assert bad.code == ResponseCode.SYSTEM_ERROR and "can not find message by the offset" in bad.remark
    beyond = broker.call(RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID, ext_fields={"offset": str(FOREVER)}))
    assert beyond.code == ResponseCode.SYSTEM_ERROR


def test_max_min_earliest_and_search_by_time(broker):
    topic = "Timed"
    before = int(time.time() * 1000) - 1
    for i in range(3):
        assert broker.call(send_command(topic, b"t%d" % i)).code == 0
        time.sleep(0.02)
    wait_until(lambda: max_offset(broker, topic) == 3)
    r = broker.call(pull_command(topic, 0, 0))
    stamps = [m.store_timestamp for m in decode_records(r.body_bytes())]
    assert int(broker.call(offset_command(RequestCode.GET_MIN_OFFSET, topic, 0)).ext_fields["offset"]) == 0
    earliest = broker.call(offset_command(RequestCode.GET_EARLIEST_MSG_STORETIME, topic, 0))
    assert int(earliest.ext_fields["timestamp"]) == stamps[0] >= before

    def search(ts):
        return int(broker.call(offset_command(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic, 0,
                                              timestamp=ts)).ext_fields["offset"])
    assert search(before) == 0
    assert search(stamps[1]) == (1 if stamps[1] > stamps[0] else 0)
    assert search(stamps[2] + 1) == 3
    assert max_offset(broker, "NeverSeen", 0) == 0                      # unknown queues are empty, as in 4.x
    assert broker.call(offset_command(RequestCode.GET_EARLIEST_MSG_STORETIME, "NeverSeen", 0)) \
        .ext_fields["timestamp"] == "-1"
