"""4.x's remaining admin codes on consume progress, statistics and clients against a real node,
with 4.x's bodies and refusals: GET_PRODUCER_CONNECTION_LIST (204), VIEW_BROKER_STATS_DATA (315),
GET_BROKER_CONSUME_STATS (317), QUERY_CONSUME_TIME_SPAN (303), QUERY_CONSUME_QUEUE (321),
CLONE_GROUP_OFFSET (314), GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305) and INVOKE_BROKER_TO_GET_CONSUMER_STATUS
(223, relayed to each consumer as GET_CONSUMER_STATUS_FROM_CLIENT 221). The SDK's side is in
tests/client/test_traffic_e2e.py."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.support.broker import ClientStub, pull_command, send_command, update_offset_command
from smartgo.client.bodies import loads, parse_broker_consume_stats, parse_client_offsets, parse_time_spans
from smartgo.client.message import MessageQueue
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(60)
NODE_SETTINGS = {"stats_sample_interval": 2}            # the stats items' minute list: 2 s, not 10 s


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def cmd(code: int, **fields: object) -> RemotingCommand:
    return RemotingCommand(code, ext_fields={k: str(v) for k, v in fields.items()})


def filled(broker, topic: str, per_queue: tuple[int, ...]) -> None:
    for q, n in enumerate(per_queue):
        for i in range(n):
            assert broker.call(send_command(topic, b"m%d" % i, queue_id=q, tags="TagA")).code == ResponseCode.SUCCESS
    wait_until(lambda: all(broker.call(cmd(RequestCode.GET_MAX_OFFSET, topic=topic, queueId=q)).ext_fields["offset"]
                           == str(n) for q, n in enumerate(per_queue)), message="every message dispatched")


def create(broker, topic: str, queues: int, order: bool = False) -> None:
    r = broker.call(cmd(RequestCode.UPDATE_AND_CREATE_TOPIC, topic=topic, defaultTopic="TBW102", readQueueNums=queues,
                        writeQueueNums=queues, perm=6, topicFilterType="SINGLE_TAG", topicSysFlag=0,
                        order=str(order).lower()))
    assert r.code == ResponseCode.SUCCESS


def test_producer_connections_list_the_group_while_connected(broker):
    group = uid("PG")
    stub = ClientStub(broker.addr, uid("127.0.0.1@producer"))
    try:
        assert stub.heartbeat(producers=(group,)).code == ResponseCode.SUCCESS
        r = broker.call(cmd(RequestCode.GET_PRODUCER_CONNECTION_LIST, producerGroup=group))
        assert r.code == ResponseCode.SUCCESS
        (conn,) = json.loads(r.body_bytes())["connectionSet"]
        assert conn["clientId"] == stub.client_id and conn["language"] == "PYTHON" and conn["version"] > 0
        assert conn["clientAddr"].startswith("127.0.0.1:")
    finally:
        stub.close()
    wait_until(lambda: broker.call(cmd(RequestCode.GET_PRODUCER_CONNECTION_LIST, producerGroup=group)).code
               == ResponseCode.SYSTEM_ERROR, message="the group gone with its connection")
    r = broker.call(cmd(RequestCode.GET_PRODUCER_CONNECTION_LIST, producerGroup=group))
    assert r.remark == f"the producer group[{group}] not exist"


def test_stats_items_count_puts_and_gets_per_topic_and_group(broker):
    """TOPIC_PUT_NUMS / SIZE by topic, GROUP_GET_NUMS by topic@group, BROKER_* by the cluster; the
    minute list samples every 2 s here (NODE_SETTINGS), so the counts show up within 2 s."""
    topic, group = uid("Stats"), uid("G")
    create(broker, topic, 1)
    filled(broker, topic, (6,))
    assert broker.call(pull_command(topic, 0, 0, group=group, max_nums=4)).code == ResponseCode.SUCCESS

    def stats(name: str, key: str) -> dict | None:
        r = broker.call(cmd(RequestCode.VIEW_BROKER_STATS_DATA, statsName=name, statsKey=key))
        return json.loads(r.body_bytes()) if r.code == ResponseCode.SUCCESS else None
    put = wait_until(lambda: (s := stats("TOPIC_PUT_NUMS", topic)) and s["statsMinute"]["sum"] == 6 and s,
                     timeout=25, message="six puts in the last minute")
    assert put["statsMinute"]["avgpt"] == 1.0 and put["statsMinute"]["tps"] > 0      # one message a request
    assert set(put) == {"statsMinute", "statsHour", "statsDay"} and set(put["statsHour"]) == {"sum", "tps", "avgpt"}
    get = wait_until(lambda: (s := stats("GROUP_GET_NUMS", f"{topic}@{group}")) and s["statsMinute"]["sum"] == 4 and s,
                     timeout=25, message="four messages pulled in one request")
    assert get["statsMinute"]["avgpt"] == 4.0
    assert stats("TOPIC_PUT_SIZE", topic)["statsMinute"]["sum"] > 6 * 100
    assert stats("BROKER_PUT_NUMS", "DefaultCluster")["statsMinute"]["sum"] >= 6
    r = broker.call(cmd(RequestCode.VIEW_BROKER_STATS_DATA, statsName="TOPIC_PUT_NUMS", statsKey="NoSuchTopic"))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "The stats <TOPIC_PUT_NUMS> <NoSuchTopic> not exist")
    r = broker.call(RemotingCommand(RequestCode.VIEW_BROKER_STATS_DATA, ext_fields={"statsName": "GROUP_GET_LATENCY"}))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "The stats <GROUP_GET_LATENCY> <None> not exist")


def test_broker_consume_stats_list_every_group_with_its_lag(broker):
    topic, ordered, group = uid("Lag"), uid("Ordered"), uid("G")
    create(broker, topic, 2)
    create(broker, ordered, 1, order=True)
    filled(broker, topic, (3, 2))
    filled(broker, ordered, (4,))
    for t, q, offset in ((topic, 0, 1), (topic, 1, 2), (ordered, 0, 4)):
        assert broker.call(update_offset_command(group, t, q, offset)).code == ResponseCode.SUCCESS
    idle = uid("Idle")
    assert broker.call(RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                       body=json.dumps({"groupName": idle}).encode())).code == ResponseCode.SUCCESS

    def consume_stats(order: bool):
        r = broker.call(cmd(RequestCode.GET_BROKER_CONSUME_STATS, isOrder=str(order).lower()))
        assert r.code == ResponseCode.SUCCESS
        return parse_broker_consume_stats(r.body_bytes())
    every = consume_stats(False)
    assert every.broker_addr == broker.addr and idle in every.groups and every.groups[idle] == []
    lags = {(q.queue.topic, q.queue.queue_id): (q.broker_offset, q.consumer_offset) for s in every.groups[group]
            for q in s.queues}
    assert lags == {(topic, 0): (3, 1), (topic, 1): (2, 2), (ordered, 0): (4, 4)}
    assert every.total_diff >= 2                        # this group's 2, and any other group's lag
    only_ordered = consume_stats(True)
    assert [q.queue.topic for s in only_ordered.groups[group] for q in s.queues] == [ordered]


def test_consume_time_span_and_consume_queue_entries(broker):
    topic, group = uid("Span"), uid("G")
    create(broker, topic, 2)
    before = int(time.time() * 1000)
    filled(broker, topic, (3, 0))
    assert broker.call(update_offset_command(group, topic, 0, 1)).code == ResponseCode.SUCCESS
    r = broker.call(cmd(RequestCode.QUERY_CONSUME_TIME_SPAN, topic=topic, group=group))
    assert r.code == ResponseCode.SUCCESS
    q0, q1 = parse_time_spans(r.body_bytes())
    assert before - 1000 <= q0.min_timestamp <= q0.consume_timestamp <= q0.max_timestamp
    assert q0.delay_ms >= 0 and q0.queue == MessageQueue(topic, "broker-a", 0)
    assert (q1.min_timestamp, q1.max_timestamp, q1.delay_ms) == (-1, -1, 0)      # an empty queue
    raw = loads(r.body_bytes())["consumeTimeSpanSet"][0]
    assert raw["minTimeStampStr"].count("#") == 1 and len(raw["minTimeStampStr"]) == 23   # yyyy-MM-dd#HH:mm:ss:SSS
    r = broker.call(cmd(RequestCode.QUERY_CONSUME_TIME_SPAN, topic=uid("NoTopic"), group=group))
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and r.remark.endswith("not exist")

    r = broker.call(cmd(RequestCode.QUERY_CONSUME_QUEUE, topic=topic, queueId=0, index=1, count=5,
                        consumerGroup=group))
    body = json.loads(r.body_bytes())
    assert (body["minQueueIndex"], body["maxQueueIndex"], body["filterData"]) == (0, 3, f"{group}@{topic} is not online!")
    first, second = body["queueData"]                   # from index 1 to the end: two entries
    assert second["physicOffset"] == first["physicOffset"] + first["physicSize"] and first["tagsCode"] != 0
    r = broker.call(cmd(RequestCode.QUERY_CONSUME_QUEUE, topic=topic, queueId=0, index=3, count=5))
    assert (r.code, r.remark, r.body) == (ResponseCode.SUCCESS, f"Index 3 of 0@{topic} is not exist!", None)
    r = broker.call(cmd(RequestCode.QUERY_CONSUME_QUEUE, topic=topic, queueId=7, index=0, count=5))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, f"7@{topic} is not exist!")


def test_clone_group_offset_copies_the_offsets_of_a_topic_or_all(broker):
    a, b, src, dest, online = uid("A"), uid("B"), uid("Src"), uid("Dest"), uid("Online")
    for t in (a, b):
        create(broker, t, 1)
        assert broker.call(update_offset_command(src, t, 0, 5)).code == ResponseCode.SUCCESS
        assert broker.call(update_offset_command(online, t, 0, 7)).code == ResponseCode.SUCCESS

    def offset(group: str, t: str) -> int:
        return int(broker.call(cmd(RequestCode.QUERY_CONSUMER_OFFSET, consumerGroup=group, topic=t, queueId=0))
                   .ext_fields["offset"])
    assert broker.call(cmd(RequestCode.CLONE_GROUP_OFFSET, srcGroup=src, destGroup=dest, topic=a)).code == 0
    assert offset(dest, a) == 5
    every = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_CONSUMER_OFFSET)).body_bytes())["offsetTable"]
    assert f"{a}@{dest}" in every and f"{b}@{dest}" not in every
    assert broker.call(cmd(RequestCode.CLONE_GROUP_OFFSET, srcGroup=src, destGroup=dest)).code == 0
    assert offset(dest, b) == 5                         # no topic: every topic of the source
    stub = ClientStub(broker.addr, uid("127.0.0.1@online"))
    try:                                                # an online source that subscribes only to a
        assert stub.heartbeat({online: {a: "*"}}).code == 0
        assert broker.call(cmd(RequestCode.CLONE_GROUP_OFFSET, srcGroup=online, destGroup=dest)).code == 0
        assert (offset(dest, a), offset(dest, b)) == (7, 5)
        assert broker.call(cmd(RequestCode.CLONE_GROUP_OFFSET, srcGroup=online, destGroup=dest, offline="true")).code == 0
        assert offset(dest, b) == 7
    finally:
        stub.close()


def test_system_topics(broker):
    r = broker.call(RemotingCommand(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER))
    topics = json.loads(r.body_bytes())["topicList"]
    assert {"TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "OFFSET_MOVED_EVENT", "DefaultCluster",
            "broker-a", "DefaultCluster_REPLY_TOPIC"} <= set(topics)


def test_consumer_status_is_asked_of_each_consumer(broker):
    """223 fans out as 221 ({topic, group}) to every consumer of the group, or only the one whose
    client id is clientAddr; a consumer that answers garbage is left out; no consumer is 4.x's
    refusal."""
    group, topic = uid("G"), uid("T")
    good, bad = ClientStub(broker.addr, uid("127.0.0.1@good")), ClientStub(broker.addr, uid("127.0.0.1@bad"))

    async def offsets(conn, c):
        return c.make_response(ResponseCode.SUCCESS, body=b'{"consumerTable":{},"messageQueueTable":{'
                               b'{"brokerName":"broker-a","queueId":1,"topic":"%s"}:42}}' % topic.encode())

    async def garbage(conn, c):
        return c.make_response(ResponseCode.SUCCESS, body=b'{"messageQueueTable":{"not a queue":1}}')
    good.answer, bad.answer = offsets, garbage
    try:
        for stub in (good, bad):
            assert stub.heartbeat({group: {topic: "*"}}).code == ResponseCode.SUCCESS
        r = broker.call(cmd(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, topic=topic, group=group), 15)
        assert r.code == ResponseCode.SUCCESS
        assert parse_client_offsets(r.body_bytes()) == {good.client_id: {MessageQueue(topic, "broker-a", 1): 42}}
        (asked,) = good.relayed
        assert asked.code == RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT and asked.ext_fields == {
            "topic": topic, "group": group}
        assert len(bad.relayed) == 1
        r = broker.call(cmd(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, topic=topic, group=group,
                            clientAddr=bad.client_id), 15)
        assert (r.code, parse_client_offsets(r.body_bytes())) == (ResponseCode.SUCCESS, {})
        assert len(good.relayed) == 1 and len(bad.relayed) == 2
    finally:
        good.close()
        bad.close()
    r = broker.call(cmd(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, topic=topic, group=uid("Nobody")))
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark.startswith("No Any Consumer online in the consumer group")
