"""Pure parts of the client: allocation, queue selection and fault tolerance (injected clock),
UNIQ_KEY layout, subscriptions, offset stores, process queues, fastjson bodies, and the request
header field names of every call, checked against the reference tables (facts C)."""

from __future__ import annotations

import asyncio
import json
import struct
import time
import zlib

import pytest

from smartgo.client import api, bodies, rebalance
from smartgo.client.allocate import ConsistentHashAllocator, allocate_averagely, allocate_by_circle
from smartgo.client.config import ClientConfig, split_registry
from smartgo.client.fault import LatencyFaultTolerance, not_available_duration
from smartgo.client.listener import acked_batch, acked_one
from smartgo.client.lite_pull_consumer import AsyncLitePullConsumer
from smartgo.client.message import ConsumeFromWhere, ConsumeResult, Message, MessageModel, MessageQueue, inflate_body
from smartgo.client.offset_store import LocalOffsetStore
from smartgo.client.process_queue import ProcessQueue
from smartgo.client.pull import pull_sys_flag
from smartgo.client.push_consumer import AsyncPushConsumer
from smartgo.client.rebalance import ConsumerOptions
from smartgo.client.route import TopicPublishInfo, TopicRouteData, select_by_hash
from smartgo.client.subscription import SubscriptionError, build_subscription
from smartgo.client.uniq_id import UniqIdGenerator, uniq_id_ip, uniq_id_time
from smartgo.net.codes import RequestCode
from smartgo.store.record import MessageExt, encode_record, iter_records
from tests.support.waits import async_wait_until


def mqs(n: int, topic: str = "T", broker: str = "b") -> list[MessageQueue]:
    return [MessageQueue(topic, broker, i) for i in range(n)]


# -- allocation ------------------------------------------------------------------------------------

def test_averagely_matches_java():
    cids = ["c0", "c1", "c2"]
    got = [[q.queue_id for q in allocate_averagely("G", c, mqs(8), cids)] for c in cids]
    assert got == [[0, 1, 2], [3, 4, 5], [6, 7]]  # Java: mod=2 -> first two get 3
    got = [[q.queue_id for q in allocate_averagely("G", c, mqs(2), cids)] for c in cids]
    assert got == [[0], [1], []]
    assert allocate_averagely("G", "stranger", mqs(4), cids) == []


@pytest.mark.parametrize("n_queues,n_cids", [(1, 1), (4, 3), (16, 3), (7, 7), (5, 9)])
def test_strategies_partition_the_queues(n_queues, n_cids):
    cids = [f"10.0.0.{i}@{i}" for i in range(n_cids)]
    for strategy in (allocate_averagely, allocate_by_circle, ConsistentHashAllocator()):
        parts = [strategy("G", c, mqs(n_queues), cids) for c in cids]
        flat = [q for p in parts for q in p]
        assert sorted(flat) == mqs(n_queues), strategy  # every queue exactly once


def test_consistent_hash_moves_few_queues():
    queues = mqs(64)
    cids = [f"c{i}" for i in range(4)]
    alloc = ConsistentHashAllocator(10)
    before = {q: c for c in cids for q in alloc("G", c, queues, cids)}
    after = {q: c for c in cids[:3] for q in alloc("G", c, queues, cids[:3])}
    moved = [q for q in queues if before[q] != after[q]]
    assert all(before[q] == "c3" for q in moved)  # only the leaver's queues move


def test_circle():
    assert [q.queue_id for q in allocate_by_circle("G", "b", mqs(5), ["a", "b"])] == [1, 3]


# -- queue selection and fault tolerance -----------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def route(*brokers: str, queues: int = 2) -> TopicRouteData:
    return TopicRouteData.parse(json.dumps({
        "brokerDatas": [{"brokerAddrs": {"0": f"127.0.0.1:{10911 + i}"}, "brokerName": b, "cluster": "C"}
                        for i, b in enumerate(brokers)],
        "queueDatas": [{"brokerName": b, "perm": 6, "readQueueNums": queues, "writeQueueNums": queues,
                        "topicSynFlag": 0} for b in brokers]}))


def test_not_available_duration_table():
    assert [not_available_duration(x) for x in (0, 49, 50, 100, 549, 550, 1800, 3000, 5000, 10000, 15000, 30000)] \
        == [0, 0, 0, 0, 0, 2000, 5000, 6000, 10000, 10000, 30000, 30000]


def test_fault_tolerance_avoids_then_recovers():
    clock = Clock()
    fault = LatencyFaultTolerance(clock)
    info = TopicPublishInfo("T", route("a", "b"))
    fault.update("a", 600)  # slow: out for 2 s
    assert not fault.is_available("a")
    assert {info.select(None, fault).broker_name for _ in range(20)} == {"b"}
    clock.now += 2.1
    assert fault.is_available("a")
    assert {info.select(None, fault).broker_name for _ in range(20)} == {"a", "b"}
    fault.update("b", 0, isolation=True)  # failed: out for 10 s (4.x: 10 minutes)
    clock.now += 9.9
    assert not fault.is_available("b")
    clock.now += 0.2
    assert fault.is_available("b")


def test_fault_tolerance_fast_success_costs_nothing_and_heals():
    fault = LatencyFaultTolerance(Clock())
    fault.update("a", 3)
    assert fault._items == {}
    fault.update("a", 0, isolation=True)
    fault.update("a", 3)  # a fast success makes it available again at once
    assert fault.is_available("a")


def test_selection_when_every_broker_is_out_and_retry_avoids_last():
    clock = Clock()
    fault = LatencyFaultTolerance(clock)
    info = TopicPublishInfo("T", route("a", "b"))
    fault.update("a", 0, isolation=True)
    fault.update("b", 2000)
    picks = {info.select(None, fault).broker_name for _ in range(10)}
    assert picks <= {"a", "b"} and picks  # still sends somewhere
    plain = TopicPublishInfo("T", route("a", "b"))
    assert all(plain.select("a", None).broker_name == "b" for _ in range(10))
    assert {plain.select(None, None).queue_id for _ in range(10)} == {0, 1}


def test_route_parsing_and_default_route():
    r = TopicRouteData.parse(b'{"brokerDatas":[{"brokerAddrs":{0:"1.2.3.4:10911",1:"1.2.3.5:10911"},'
                             b'"brokerName":"b","cluster":"C"}],"queueDatas":[{"brokerName":"b","perm":7,'
                             b'"readQueueNums":8,"writeQueueNums":8,"topicSynFlag":0}]}')
    assert r.broker("b").master_addr == "1.2.3.4:10911" and r.broker("b").broker_addrs[1] == "1.2.3.5:10911"
    assert len(r.publish_queues("T")) == 8
    d = r.as_default_route(4)
    assert [q.queue_id for q in d.publish_queues("New")] == [0, 1, 2, 3]
    ro = TopicRouteData.parse(json.dumps({"brokerDatas": [{"brokerAddrs": {"0": "x:1"}, "brokerName": "b"}],
                                          "queueDatas": [{"brokerName": "b", "perm": 4, "readQueueNums": 2,
                                                          "writeQueueNums": 2}]}))
    assert ro.publish_queues("T") == [] and len(ro.subscribe_queues("T")) == 2
    ordered = TopicRouteData.parse(json.dumps({"brokerDatas": [], "queueDatas": [], "orderTopicConf": "b:3;c:2"}))
    assert [(q.broker_name, q.queue_id) for q in ordered.publish_queues("T")] == \
        [("b", 0), ("b", 1), ("b", 2), ("c", 0), ("c", 1)]
    with pytest.raises(ValueError):
        TopicRouteData.parse(b'{"queueDatas":[{"brokerName":"b"}]}')


def test_select_by_hash_is_java_compatible():
    queues = mqs(8)
    # "order-1".hashCode() = -1207111310 (Java); % 8 = -6 -> abs 6
    assert select_by_hash(queues, "order-1").queue_id == 6
    assert select_by_hash(queues, 13).queue_id == 5
    assert select_by_hash(queues, -13).queue_id == 5


# -- ids -------------------------------------------------------------------------------------------

def test_uniq_key_layout():
    now = time.time()
    gen = UniqIdGenerator("10.1.2.3", pid=70000, process_hash=-2, clock=lambda: now)
    a, b = gen.next_id(), gen.next_id()
    assert len(a) == 32 and a == a.upper() and a != b
    raw = bytes.fromhex(a)
    assert raw[:4] == bytes([10, 1, 2, 3])
    assert struct.unpack(">h", raw[4:6])[0] == struct.unpack(">h", (70000 & 0xFFFF).to_bytes(2, "big"))[0]
    assert struct.unpack(">i", raw[6:10])[0] == -2
    assert struct.unpack(">h", raw[14:16])[0] + 1 == struct.unpack(">h", bytes.fromhex(b)[14:16])[0]
    assert uniq_id_ip(a) == "10.1.2.3"
    assert abs(uniq_id_time(a, int(now * 1000) + 5000) - int(now * 1000)) <= 1


def test_client_id_and_registry_parsing():
    assert split_registry("a:1; b:2,c:3") == ["a:1", "b:2", "c:3"]
    for bad in ("", "nohost", "a:x"):
        with pytest.raises(ValueError):
            split_registry(bad)
    c1 = ClientConfig(["a:1"], client_ip="10.0.0.1", instance_name="worker")
    assert c1.client_id.startswith("10.0.0.1@") and c1.client_id.endswith("#worker")
    assert ClientConfig(["a:1"]).client_id != ClientConfig(["a:1"]).client_id


# -- subscriptions ---------------------------------------------------------------------------------

def test_subscription_parsing():
    s = build_subscription("T", " TagA || TagB ||TagA", 7)
    assert s.tags_set == ["TagA", "TagB"] and s.code_set == [2598919, 2598920]  # Java hashCode (facts D)
    assert s.to_json() == {"classFilterMode": False, "codeSet": [2598919, 2598920], "expressionType": "TAG",
                           "subString": "TagA || TagB ||TagA", "subVersion": 7, "tagsSet": ["TagA", "TagB"],
                           "topic": "T"}
    assert build_subscription("T", "*").takes_all and build_subscription("T", "").sub_string == "*"
    with pytest.raises(SubscriptionError):
        build_subscription("T", "||")


def test_client_side_tag_filter():
    s = build_subscription("T", "A||B")
    def m(tags):
        return MessageExt("T", 0, 0, 0, 0, 0, 0, ("1.1.1.1", 1), 0, ("1.1.1.1", 1), 0, 0, b"",
                          {"TAGS": tags} if tags else {})
    assert [s.matches(m(t)) for t in ("A", "B", "C", None)] == [True, True, False, False]


# -- messages --------------------------------------------------------------------------------------

def test_inflate_and_properties():
    rec = encode_record("T", 0, zlib.compress(b"x" * 5000), b"", sys_flag=1)
    msg = next(iter_records(rec))
    inflate_body(msg)
    assert msg.body == b"x" * 5000 and msg.sys_flag & 1 == 0
    assert Message("T", "text").body == b"text"
    props = Message("T", b"x", tags="A", keys=["a", "b"], delay_level=3, wait_store_ok=False).wire_properties()
    assert props == {"TAGS": "A", "KEYS": "a b", "DELAY": "3", "WAIT": "false"}


# -- process queue and offsets ---------------------------------------------------------------------

def _msg(offset: int) -> MessageExt:
    return MessageExt("T", 0, offset, 0, 0, 0, 0, ("1.1.1.1", 1), 0, ("1.1.1.1", 1), 0, 0, b"abc")


def test_process_queue_commit_offsets():
    pq = ProcessQueue(0)
    msgs = [_msg(i) for i in range(10, 15)]
    pq.put(msgs)
    assert pq.count == 5 and pq.span == 4 and pq.msg_size == 15
    assert pq.remove([msgs[1]]) == 10  # the oldest is still in flight
    assert pq.remove([msgs[0]]) == 12
    assert pq.remove(msgs[2:]) == 15 and pq.count == 0 and pq.msg_size == 0
    pq.next_offset = 18                # the pull also scanned 15..17 and the tag filter skipped them
    pq.put([_msg(15)])
    assert pq.remove([_msg(16)]) == 15 and pq.remove([_msg(15)]) == 18


def test_process_queue_orderly_take_commit_again():
    pq = ProcessQueue(0)
    pq.put([_msg(i) for i in range(3)])
    first = pq.take(1)
    assert [m.queue_offset for m in first] == [0]
    pq.make_again(first)
    assert [m.queue_offset for m in pq.take(2)] == [0, 1]
    assert pq.commit() == 2 and pq.count == 1


def test_process_queue_commit_stops_at_a_batch_part_put_back():
    pq = ProcessQueue(0)
    pq.put([_msg(i) for i in range(6)])
    batch = pq.take(4)
    pq.make_again(batch[2:])           # the first two consumed, the last two to come again
    assert pq.commit() == 2 and pq.count == 4 and pq.msg_size == 12
    assert [m.queue_offset for m in pq.take(4)] == [2, 3, 4, 5] and pq.commit() == 6 and pq.msg_size == 0


@pytest.mark.parametrize("value, acked, one", [(None, 3, 1), (True, 3, 1), (ConsumeResult.SUCCESS, 3, 1),
                                               (False, 0, 0), (ConsumeResult.RECONSUME_LATER, 0, 0), ("odd", 0, 0),
                                               (2, 2, 0), (0, 0, 0), (-1, 0, 0), (7, 3, 0)])
def test_a_listeners_answer_is_a_count_of_messages_consumed(value, acked, one):
    """A batch listener may answer with a count (clamped); a message listener may not."""
    assert acked_batch(value, [_msg(i) for i in range(3)]) == acked
    assert acked_one(value, _msg(0)) == one


def test_local_offset_store_roundtrip(tmp_path):
    async def main():
        store = LocalOffsetStore(tmp_path, "inst", "G")
        assert await store.read(MessageQueue("T", "b", 0)) == -1
        store.update(MessageQueue("T", "b", 0), 42)
        store.update(MessageQueue("T", "b", 0), 40, increase_only=True)
        store.update(MessageQueue("T", "b", 1), 7)
        await store.persist([])
        store.update(MessageQueue("T", "b", 0), 43)
        await store.persist([])
        again = LocalOffsetStore(tmp_path, "inst", "G")
        return await again.read(MessageQueue("T", "b", 0)), await again.read(MessageQueue("T", "b", 1)), store.path
    a, b, path = asyncio.run(main())
    assert (a, b) == (43, 7) and path.with_name("offsets.json.bak").exists()
    path.write_text("{garbage")
    assert asyncio.run(LocalOffsetStore(tmp_path, "inst", "G").read(MessageQueue("T", "b", 0))) == 42  # from .bak



def test_local_offset_store_keeps_an_offset_when_its_queue_is_let_go(tmp_path):
    """A broadcasting consumer that lets a queue go and holds it again (a rebalance) reads on from its
    stored offset, not from consume_from (the MQTT feed skipped messages after a restart that way)."""
    mq = MessageQueue("T", "b", 0)

    async def main():
        store = LocalOffsetStore(tmp_path, "inst", "G")
        store.update(mq, 42)
        await store.persist([mq])
        again = LocalOffsetStore(tmp_path, "inst", "G")
        assert await again.read(mq) == 42
        again.remove(mq)
        return await again.read(mq)
    assert asyncio.run(main()) == 42

# -- fastjson bodies -------------------------------------------------------------------------------

def test_fastjson_object_keys():
    text = ('{"consumeTps":1.5,"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:'
            '{"brokerOffset":10,"consumerOffset":4,"lastTimestamp":9},'
            '{"brokerName":"b","queueId":0,"topic":"T"}:{"brokerOffset":3,"consumerOffset":3,"lastTimestamp":0}}}')
    stats = bodies.parse_consume_stats(text.encode())
    assert [(q.queue.queue_id, q.lag) for q in stats.queues] == [(0, 0), (1, 6)] and stats.total_lag == 6
    assert bodies.loads('{0:"a",1:{"x":[1,2]}}') == {0: "a", 1: {"x": [1, 2]}}
    st = bodies.parse_topic_stats(b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:'
                                  b'{"lastUpdateTimestamp":5,"maxOffset":9,"minOffset":1}}}')
    assert st[0].max_offset == 9 and st[0].min_offset == 1
    for bad in (b'{"a":1', b'{"a":1}x', b'{"offsetTable":{"x":1}}'):
        with pytest.raises(ValueError):
            bodies.parse_topic_stats(bad)


# -- request headers vs the reference tables (facts C) ---------------------------------------------

def fields(cmd) -> set[str]:
    return set(cmd.ext_fields or {})


def test_header_field_names_match_reference():
    assert fields(api.pull_request("G", "T", 1, 2, 32, 3, 4, 15000, "*", 5)) == {
        "consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag", "commitOffset",
        "suspendTimeoutMillis", "subscription", "subVersion", "expressionType"}
    assert fields(api.query_consumer_offset_request("G", "T", 0)) == {"consumerGroup", "topic", "queueId"}
    assert fields(api.update_consumer_offset_request("G", "T", 0, 5)) == {"consumerGroup", "topic", "queueId",
                                                                           "commitOffset"}
    assert fields(api.send_back_request(99, "G", 0, "ID", "T", 16)) == {
        "offset", "group", "delayLevel", "originMsgId", "originTopic", "unitMode", "maxReconsumeTimes"}
    assert fields(api.offset_request(RequestCode.GET_MAX_OFFSET, "T", 0)) == {"topic", "queueId"}
    assert fields(api.offset_request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, "T", 0, 5)) == {"topic", "queueId",
                                                                                             "timestamp"}
    q = api.query_message_request("T", "k", 32, 0, 9)
    assert fields(q) == {"topic", "key", "maxNum", "beginTimestamp", "endTimestamp", "_UNIQUE_KEY_QUERY"}
    assert api.query_message_request("T", "k", 32, 0, 9, unique=True).ext_fields["_UNIQUE_KEY_QUERY"] == "true"
    assert fields(api.view_message_request(5)) == {"offset"}
    assert fields(api.consumer_list_request("G")) == {"consumerGroup"}
    assert fields(api.unregister_client_request("id", None, "G")) == {"clientID", "consumerGroup"}
    assert fields(api.route_request("T")) == {"topic", "acceptStandardJsonOnly"}
    assert fields(api.create_topic_request("T", 8, 8, 6)) == {
        "topic", "defaultTopic", "readQueueNums", "writeQueueNums", "perm", "topicFilterType", "topicSysFlag", "order"}
    assert fields(api.topic_request(RequestCode.DELETE_TOPIC_IN_BROKER, "T")) == {"topic"}
    assert fields(api.consume_stats_request("G", "T")) == {"consumerGroup", "topic"}
    assert fields(api.consumer_connection_request("G")) == {"consumerGroup"}
    v1 = api.send_request(api.send_fields("PG", "T", 0, 0, 1, 0, ""), b"x", v1=True)
    assert v1.code == RequestCode.SEND_MESSAGE and {"producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums",
                                                   "queueId", "sysFlag", "bornTimestamp", "flag", "properties"} <= fields(v1)
    every_value = [v for cmd in (q, api.send_back_request(1, "G", 0, "x", "T", 16)) for v in cmd.ext_fields.values()]
    assert all(isinstance(v, str) for v in every_value)


def test_json_bodies_match_reference():
    hb = json.loads(api.heartbeat_request("1.2.3.4@5", ["PG"], [api.consumer_data(
        "G", "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET",
        [build_subscription("T", "TagA || TagB", 1).to_json()])]).body)
    assert set(hb) == {"clientID", "consumerDataSet", "producerDataSet"}
    assert set(hb["consumerDataSet"][0]) == {"consumeFromWhere", "consumeType", "groupName", "messageModel",
                                             "subscriptionDataSet", "unitMode"}
    lock = json.loads(api.lock_body("cid", "G", [MessageQueue("T", "b", 0)]))
    assert lock == {"clientId": "cid", "consumerGroup": "G", "mqSet": [{"brokerName": "b", "queueId": 0, "topic": "T"}]}
    assert pull_sys_flag(True, True, False) == 3 and pull_sys_flag(False, False, True) == 4


def test_the_blocking_admin_offers_every_async_admin_call():
    """Admin (blocking) wraps each public coroutine of AsyncAdmin except its lifecycle."""
    import inspect

    from smartgo.client import Admin, AsyncAdmin
    calls = {n for n, f in inspect.getmembers(AsyncAdmin, inspect.iscoroutinefunction) if not n.startswith("_")}
    missing = sorted(n for n in calls - {"start", "close"} if not hasattr(Admin, n))
    assert missing == []


def test_acl_version_from_a_4_9_3_and_an_older_broker():
    """allAclFileVersion (4.9.3+, one entry per file) wins; before it only "version" came."""
    ident = {"clusterName": "C", "brokerName": "b", "brokerAddr": "127.0.0.1:10911"}
    new = bodies.parse_acl_version({**ident, "version": '{"counter":9,"timestamp":5}',
                                    "allAclFileVersion": '{"/a/plain_acl.yml":{"counter":3,"timestamp":1700000000000},'
                                                         '"/a/acl/x.yml":{"counter":1,"stateVersion":0,"timestamp":2}}'})
    assert new.files == {"/a/plain_acl.yml": (3, 1700000000000), "/a/acl/x.yml": (1, 2)}
    assert new.to_json()["files"]["/a/acl/x.yml"] == {"counter": 1, "timestamp": 2}
    old = bodies.parse_acl_version({**ident, "version": '{"counter":9,"timestamp":5}'})
    assert (old.cluster, old.broker_name, old.broker_addr, old.files) == ("C", "b", "127.0.0.1:10911", {"": (9, 5)})
    with pytest.raises(KeyError):
        bodies.parse_acl_version({"version": "{}"})


def test_a_rebalance_that_failed_runs_again_soon_backing_off(monkeypatch):
    """Java waits the whole interval (20 s) after a failed round, a broker away say; ours runs
    again after RETRY_FIRST, doubling, and back to the interval once a round succeeds."""
    monkeypatch.setattr(rebalance, "RETRY_FIRST", 0.05)
    runs: list[float] = []

    async def job() -> bool:
        runs.append(time.monotonic())
        if len(runs) == 2:
            raise RuntimeError("a broker refused")        # as a failure
        return len(runs) > 3

    async def main() -> float:
        loop = rebalance.RebalanceLoop(job, 60.0, "G")
        loop.start()
        try:
            await async_wait_until(lambda: len(runs) == 4, 10, message="three failed rounds run again")
            return loop._wait
        finally:
            await loop.stop()
    after = asyncio.run(main())
    gaps = [b - a for a, b in zip(runs, runs[1:])]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2 and after == 60.0


@pytest.mark.parametrize("consumer", ["push", "lite"])
def test_consumer_constructors_hand_every_shared_keyword_to_their_base(consumer, tmp_path):
    """The push and the lite pull consumer build one ConsumerOptions from their keyword
    arguments (docs/CLIENT.md's signatures); each lands where the base keeps it."""
    cls = AsyncPushConsumer if consumer == "push" else AsyncLitePullConsumer
    c = cls("G1", "127.0.0.1:9876;127.0.0.1:9877", model="BROADCASTING", consume_from="CONSUME_FROM_TIMESTAMP",
            consume_timestamp_ms=1234, allocate="circle", pull_batch_size=7, pull_threshold_for_queue=11,
            pull_threshold_size_mb=3, max_span=13, rebalance_interval=17.0, offset_store_dir=tmp_path,
            enable_msg_trace=True, trace_topic="MyTrace", instance_name="inst")
    assert (c.group, c.model, c.consume_from, c.consume_timestamp_ms) == \
        ("G1", MessageModel.BROADCASTING, ConsumeFromWhere.CONSUME_FROM_TIMESTAMP, 1234)
    assert c.allocate is allocate_by_circle
    assert (c.pull_batch_size, c.pull_threshold_for_queue, c.pull_threshold_size, c.max_span) == (7, 11, 3 << 20, 13)
    assert c._rebalancer.interval == 17.0
    assert c.config.registry == ["127.0.0.1:9876", "127.0.0.1:9877"] and c.config.instance_name == "inst"
    assert c.offsets.path == tmp_path / "inst" / "G1" / "offsets.json"
    assert c.tracer is not None and c.tracer.topic == "MyTrace"
    given = ClientConfig.make("127.0.0.1:1")
    assert cls("G2", "ignored:1", config=given).config is given


def test_consumer_options_check_the_shared_ranges_and_the_group():
    shared = dict(group="G", registry="127.0.0.1:1", model="CLUSTERING", consume_from="CONSUME_FROM_LAST_OFFSET",
                  consume_timestamp_ms=None, allocate="average", pull_batch_size=32, pull_threshold_for_queue=1000,
                  pull_threshold_size_mb=100, max_span=2000, rebalance_interval=20.0, offset_store_dir="~",
                  config=None, enable_msg_trace=False, trace_topic=None, config_options={})
    assert ConsumerOptions.of({**shared, "self": object(), "listener": None}) == ConsumerOptions(**shared)
    with pytest.raises(ValueError, match="a consumer needs a group name"):
        ConsumerOptions.of({**shared, "group": ""})
    with pytest.raises(ValueError, match=r"max_span out of range \[1, 65535\]"):
        ConsumerOptions.of({**shared, "max_span": 0})
