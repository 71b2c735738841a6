"""INVOKE_BROKER_TO_RESET_OFFSET (222) against a real node, as Broker2Client.resetOffset: the table
per write queue, RESET_CONSUMER_CLIENT_OFFSET to each online consumer (the list form for a C++
one), and the refusals (unknown topic, a group without offsets, nobody online)."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.support.broker import ClientStub, pull_command, send_command, update_offset_command
from smartgo.client.bodies import parse_reset_offsets
from smartgo.net.codes import LanguageCode, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import decode_records
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(60)


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def reset(broker, group: str, topic: str, timestamp: int, force: bool = True) -> RemotingCommand:
    return broker.call(RemotingCommand(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext_fields={
        "topic": topic, "group": group, "timestamp": str(timestamp), "isForce": str(force).lower()}))


def stored(broker, topic: str, count: int) -> list:
    def pulled():
        r = broker.call(pull_command(topic, 0, 0))
        msgs = decode_records(r.body_bytes()) if r.code == ResponseCode.SUCCESS else []
        return msgs if len(msgs) >= count else None
    return wait_until(pulled, message=f"{count} messages dispatched")


def two_batches(broker, topic: str) -> int:
    """Five messages to queue 0, then (a later millisecond) five more; the store time of the sixth."""
    for i in range(10):
        if i == 5:
            last = stored(broker, topic, 5)[-1].store_timestamp
            wait_until(lambda: time.time() * 1000 > last + 1, message="a later millisecond")
        assert broker.call(send_command(topic, b"m%d" % i, queue_id=0, default_queues=2)).code == 0
    return stored(broker, topic, 10)[5].store_timestamp


def commit(broker, group: str, topic: str, offsets: dict[int, int]) -> None:
    for q, offset in offsets.items():
        assert broker.call(update_offset_command(group, topic, q, offset)).code == ResponseCode.SUCCESS
    wait_until(lambda: all(broker.call(RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields={
        "consumerGroup": group, "topic": topic, "queueId": str(q)})).ext_fields.get("offset") == str(o)
        for q, o in offsets.items()), message="offsets committed")


def by_queue(table: dict) -> dict[int, int]:
    return {mq.queue_id: offset for mq, offset in table.items()}


def test_online_consumers_get_the_table_and_the_answer_carries_it(broker):
    group, topic = uid("G"), uid("Reset")
    middle = two_batches(broker, topic)
    commit(broker, group, topic, {0: 10, 1: 0})
    java, cpp = ClientStub(broker.addr, uid("127.0.0.1@java")), ClientStub(broker.addr, uid("127.0.0.1@cpp"))
    try:
        assert java.heartbeat({group: {topic: "*"}}).code == 0
        assert cpp.heartbeat({group: {topic: "*"}}, language=LanguageCode.CPP).code == 0
        r = reset(broker, group, topic, middle)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert by_queue(parse_reset_offsets(r.body_bytes())) == {0: 5, 1: 0}
        wait_until(lambda: java.resets and cpp.resets, message="both consumers told")
        (to_java,), (to_cpp,) = java.resets, cpp.resets
        assert to_java.ext_fields == {"topic": topic, "group": group, "timestamp": str(middle), "isForce": "false"}
        assert by_queue(parse_reset_offsets(to_java.body_bytes())) == {0: 5, 1: 0}
        assert sorted(json.loads(to_cpp.body_bytes())["offsetTable"], key=lambda e: e["queueId"]) == [
            {"brokerName": "broker-a", "offset": 5, "queueId": 0, "topic": topic},
            {"brokerName": "broker-a", "offset": 0, "queueId": 1, "topic": topic}]
        # not forced: only backwards (queue 0 stays at 3, below the time's offset 5); -1: the queue ends
        commit(broker, group, topic, {0: 3})
        assert by_queue(parse_reset_offsets(reset(broker, group, topic, middle, force=False).body_bytes())) == \
            {0: 3, 1: 0}
        assert by_queue(parse_reset_offsets(reset(broker, group, topic, -1).body_bytes())) == {0: 10, 1: 0}
        # the broker's offsets are the consumers' to commit, as in 4.x
        assert broker.call(RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields={
            "consumerGroup": group, "topic": topic, "queueId": "0"})).ext_fields["offset"] == "3"
    finally:
        java.close()
        cpp.close()


def test_refusals_name_the_reason(broker):
    group, topic = uid("G"), uid("ResetNo")
    assert broker.call(send_command(topic, b"x", default_queues=1)).code == 0
    unknown = reset(broker, group, uid("Nope"), 0)
    assert unknown.code == ResponseCode.SYSTEM_ERROR and "no topic in this broker" in unknown.remark
    fresh = reset(broker, group, topic, 0)
    assert fresh.code == ResponseCode.SYSTEM_ERROR and f"<{group}> not exist" in fresh.remark
    commit(broker, group, topic, {0: 1})
    offline = reset(broker, group, topic, 0)
    assert offline.code == ResponseCode.CONSUMER_NOT_ONLINE and "Consumer not online" in offline.remark
