"""Message trace: Java's TraceDataEncoder text both ways, packing records into trace messages,
the traced listener, the dispatcher's bounds, and a traced producer against a scripted broker
(the trace message on the wire; a refused trace send costs the traced send nothing)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from smartgo.broker.managers.topics import default_topics, system_topics
from smartgo.client import AsyncProducer, Message, MessageQueue, SendResult, SendStatus
from smartgo.client import trace
from smartgo.client.config import ClientConfig
from smartgo.client.listener import acked_batch, acked_one
from smartgo.client.trace import ConsumeReturnType, MessageType, TraceRecord, TraceType
from smartgo.config import NodeConfig
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.store.record import MessageExt, decode_properties
from tests.support.waits import async_wait_until

from .conftest import FakeBroker, arun, fake_cluster

# Records as Java's TraceDataEncoder writes them (fields \x01, records ended by \x02), by hand.
JAVA_PUB = ("Pub\x011700000000123\x01DefaultRegion\x01PG\x01TopicA\x017F000001000018B4AAC2\x01TagA\x01k1 k2\x01"
            "127.0.0.1:10911\x01128\x013\x010\x017F00000100002A9F0000000000000064\x01true\x02")
JAVA_SUB_BEFORE = "SubBefore\x011700000000200\x01null\x01CG\x01REQ1\x01MSG1\x012\x01null\x02"
JAVA_SUB_AFTER = "SubAfter\x01REQ1\x01MSG1\x017\x01false\x01null\x014\x011700000000207\x02"
JAVA_END = ("EndTransaction\x011700000000300\x01DefaultRegion\x01PG\x01TopicA\x01MSG2\x01null\x01null\x01"
            "127.0.0.1:10911\x012\x01MSG2\x01COMMIT_MESSAGE\x01true\x02")


def test_encode_writes_java_text():
    pub = TraceRecord(TraceType.PUB, 1700000000123, "DefaultRegion", "PG", topic="TopicA",
                      msg_id="7F000001000018B4AAC2", tags="TagA", keys="k1 k2", store_host="127.0.0.1:10911",
                      body_length=128, cost_ms=3, msg_type=MessageType.NORMAL,
                      offset_msg_id="7F00000100002A9F0000000000000064", success=True)
    assert trace.encode(pub) == JAVA_PUB
    before = TraceRecord(TraceType.SUB_BEFORE, 1700000000200, "null", "CG", "REQ1", msg_id="MSG1", retry_times=2)
    assert trace.encode(before) == JAVA_SUB_BEFORE          # a missing key is Java's "null", never empty
    after = TraceRecord(TraceType.SUB_AFTER, 1700000000207, request_id="REQ1", msg_id="MSG1", cost_ms=7,
                        success=False, context_code=ConsumeReturnType.FAILED)
    assert trace.encode(after) == JAVA_SUB_AFTER
    end = TraceRecord(TraceType.END_TRANSACTION, 1700000000300, group="PG", topic="TopicA", msg_id="MSG2",
                      store_host="127.0.0.1:10911", msg_type=MessageType.TRANS_COMMIT, transaction_id="MSG2",
                      transaction_state="COMMIT_MESSAGE", from_check=True)
    assert trace.encode(end) == JAVA_END
    assert trace.index_keys(pub) == ["7F000001000018B4AAC2", "k1 k2"] and trace.index_keys(after) == ["MSG1"]


def test_decode_reads_java_text_of_every_version():
    records, bad = trace.decode(JAVA_PUB + JAVA_SUB_BEFORE + JAVA_SUB_AFTER + JAVA_END)
    assert bad == 0 and [r.type for r in records] == list(TraceType)
    pub, before, after, end = records
    assert (pub.timestamp, pub.group, pub.topic, pub.tags, pub.keys, pub.store_host, pub.body_length, pub.cost_ms,
            pub.msg_type, pub.offset_msg_id, pub.success) == (
        1700000000123, "PG", "TopicA", "TagA", "k1 k2", "127.0.0.1:10911", 128, 3, 0,
        "7F00000100002A9F0000000000000064", True)
    assert (before.request_id, before.msg_id, before.retry_times, before.group) == ("REQ1", "MSG1", 2, "CG")
    assert (after.request_id, after.cost_ms, after.success, after.context_code, after.timestamp) == (
        "REQ1", 7, False, 4, 1700000000207)
    assert (end.transaction_state, end.from_check, end.msg_type, end.transaction_id) == ("COMMIT_MESSAGE", True, 2,
                                                                                         "MSG2")
    # older clients: a Pub without offsetMsgId (13 fields), one with clientHost (15), a SubAfter
    # without context code and end time (6 fields)
    old_pub = "Pub\x011\x01R\x01PG\x01T\x01M\x01t\x01k\x01h:1\x015\x016\x013\x01false"
    (rec,), _ = trace.decode(old_pub)
    assert (rec.success, rec.offset_msg_id, rec.msg_type) == (False, "", MessageType.DELAY)
    (rec,), _ = trace.decode(old_pub.replace("\x01false", "\x01OFF\x01TRUE\x0110.0.0.9"))
    assert (rec.offset_msg_id, rec.success, rec.client_host) == ("OFF", True, "10.0.0.9")
    (rec,), _ = trace.decode("SubAfter\x01R\x01M\x019\x01true\x01k")
    assert (rec.context_code, rec.timestamp, rec.keys) == (0, 0, "k")


def test_decode_skips_what_does_not_parse_and_keeps_the_rest():
    text = "Pub\x01notanumber\x02" + "SubBefore\x011\x02" + "Unknown\x011\x02" + JAVA_SUB_AFTER + "\x02"
    records, bad = trace.decode(text)
    assert [r.type for r in records] == [TraceType.SUB_AFTER] and bad == 3


def test_pack_groups_by_traced_topic_and_splits_at_the_limits():
    def pub(topic: str, i: int, keys: str | None = None) -> TraceRecord:
        return TraceRecord(TraceType.PUB, 1, group="PG", topic=topic, msg_id=f"ID{i:04d}", keys=keys)
    recs = [pub("A", 1, "order-1"), pub("B", 2), pub("A", 3, "order-1")]
    packed = trace.pack(recs)
    assert [keys for _, keys in packed] == [["ID0001", "order-1", "ID0003"], ["ID0002"]]
    assert trace.decode(packed[0][0])[0] == [recs[0], recs[2]]
    one = len(trace.encode(pub("A", 0)))
    bodies = trace.pack([pub("A", i) for i in range(10)], limit=3 * one)
    assert [len(trace.decode(b)[0]) for b, _ in bodies] == [3, 3, 3, 1]
    by_keys = trace.pack([pub("A", i) for i in range(10)], keys_limit=4 * len("ID0000 "))
    assert [len(keys) for _, keys in by_keys] == [4, 4, 2]


def test_pub_records_give_each_message_of_a_batch_its_own_ids():
    mq = MessageQueue("T", "broker-a", 0)
    result = SendResult(SendStatus.SEND_OK, "U1,U2", "O1,O2", mq, 5, region_id="R1")
    msgs = [Message("T", b"abc", tags="x", keys=["a", "b"]), Message("T", b"de", delay_level=2)]
    one, two = trace.pub_records("PG", msgs, result, "127.0.0.1:1", 4)
    assert (one.msg_id, one.offset_msg_id, one.keys, one.tags, one.body_length, one.msg_type, one.region_id) == (
        "U1", "O1", "a b", "x", 3, MessageType.NORMAL, "R1")
    assert (two.msg_id, two.offset_msg_id, two.keys, two.msg_type, two.success) == ("U2", "O2", None,
                                                                                   MessageType.DELAY, True)
    failed = SendResult(SendStatus.FLUSH_DISK_TIMEOUT, "U3", "O3", mq, 6)
    (half,) = trace.pub_records("PG", msgs[:1], failed, "h:1", 1, half=True)
    assert (half.success, half.msg_type) == (False, MessageType.TRANS_HALF)


class Collect:
    def __init__(self) -> None:
        self.records: list[TraceRecord] = []

    def append(self, rec: TraceRecord) -> None:
        self.records.append(rec)


def _msg(**props: str) -> MessageExt:
    return MessageExt("T", 0, 0, 0, 0, 0, 0, ("127.0.0.1", 1), 0, ("127.0.0.1", 2), 1, 0, b"x",
                      {"UNIQ_KEY": "U9", **props}, msg_id="OFF9")


@pytest.mark.parametrize("value, ok, code", [(None, True, ConsumeReturnType.SUCCESS),
                                             (False, False, ConsumeReturnType.FAILED),
                                             (ValueError("boom"), False, ConsumeReturnType.EXCEPTION)])
@pytest.mark.parametrize("coroutine", [False, True])
def test_traced_listener_records_before_and_after(value, ok, code, coroutine):
    sink = Collect()

    def plain(msg):
        if isinstance(value, Exception):
            raise value
        return value

    async def coro(msg):
        return plain(msg)
    wrapped = trace.traced_listener(coro if coroutine else plain, "CG", sink, acked_one)  # type: ignore[arg-type]
    msg = _msg(KEYS="k1")
    if isinstance(value, Exception):
        with pytest.raises(ValueError):
            arun(wrapped(msg)) if coroutine else wrapped(msg)
    else:
        assert (arun(wrapped(msg)) if coroutine else wrapped(msg)) is value
    before, after = sink.records
    assert (before.type, before.group, before.msg_id, before.keys, before.retry_times) == (
        TraceType.SUB_BEFORE, "CG", "U9", "k1", 1)
    assert (after.type, after.request_id, after.msg_id, after.success, after.context_code) == (
        TraceType.SUB_AFTER, before.request_id, "U9", ok, code)
    assert len(before.request_id) == 32 and after.timestamp >= before.timestamp


def test_a_traced_batch_shares_one_request_id_and_its_cost_and_says_which_messages_failed(monkeypatch):
    sink = Collect()
    msgs = [_msg(), _msg(), _msg()]
    for i, m in enumerate(msgs):
        m.properties["UNIQ_KEY"] = f"U{i}"
    clock = [100.0]                         # the trace's perf_counter: the listener takes 30 ms of it
    monkeypatch.setattr(trace, "time", SimpleNamespace(perf_counter=lambda: clock[0], time=time.time))

    def listener(batch):
        clock[0] += 0.030
        return 2                            # the first two consumed, the third to come again
    wrapped = trace.traced_listener(listener, "CG", sink, acked_batch)
    assert wrapped(msgs) == 2
    befores, afters = sink.records[:3], sink.records[3:]
    assert [r.type for r in befores] == [TraceType.SUB_BEFORE] * 3 and [r.msg_id for r in afters] == ["U0", "U1", "U2"]
    assert len({r.request_id for r in sink.records}) == 1
    assert [(r.success, r.context_code) for r in afters] == [
        (True, ConsumeReturnType.SUCCESS), (True, ConsumeReturnType.SUCCESS), (False, ConsumeReturnType.FAILED)]
    assert [r.cost_ms for r in afters] == [10, 10, 10]                   # 30 ms shared by three, as Java does


def test_a_full_dispatcher_drops_and_counts():
    d = trace.TraceDispatcher(ClientConfig(["127.0.0.1:1"]))
    for i in range(trace.QUEUE_CAPACITY + 5):
        d.append(TraceRecord(TraceType.PUB, msg_id=str(i)))
    assert d.dropped == 5 and len(d._pending) == trace.QUEUE_CAPACITY


def test_a_slow_trace_broker_holds_records_back_instead_of_piling_up_sends():
    async def main():
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future] = []

        class Slow:                                 # the inner producer: sends that do not finish
            def send_async(self, msg, timeout):
                futures.append(loop.create_future())
                return futures[-1]

            async def close(self):
                pass
        d = trace.TraceDispatcher(ClientConfig(["127.0.0.1:1"]))
        d._producer, d._loop, d._wake = Slow(), loop, asyncio.Event()
        d._loop_thread = threading.get_ident()
        d._task = loop.create_task(d._run())
        for i in range(trace.MAX_IN_FLIGHT):        # one topic each: one trace message each
            d.append(TraceRecord(TraceType.PUB, topic=f"T{i}", msg_id=str(i)))
        await async_wait_until(lambda: len(futures) == trace.MAX_IN_FLIGHT, 5, 0.001, "the first sends")
        d.append(TraceRecord(TraceType.PUB, topic="late", msg_id="late"))
        await asyncio.sleep(0.05)
        held = (len(futures), len(d._pending))
        futures[0].set_result(None)                 # one send finishes: the held record goes
        await async_wait_until(lambda: len(futures) == trace.MAX_IN_FLIGHT + 1, 5, 0.001, "the held record's send")
        for f in futures[1:]:
            f.set_result(None)
        await d.close()
        return held, d.sent, d._pending
    held, sent, pending = arun(main())
    assert held == (trace.MAX_IN_FLIGHT, 1) and sent == trace.MAX_IN_FLIGHT + 1 and not pending


def test_broker_creates_the_trace_topic_when_asked():
    assert trace.TRACE_TOPIC not in {t.name for t in default_topics(NodeConfig())}
    cfg = NodeConfig(trace_topic_enable=True, msg_trace_topic_name="MY_TRACE")
    (mine,) = [t for t in default_topics(cfg) if t.name == "MY_TRACE"]
    assert (mine.read_queues, mine.write_queues, mine.perm) == (1, 1, 6)
    assert "MY_TRACE" in system_topics(cfg) and "MY_TRACE" not in system_topics(NodeConfig())


def test_traced_producer_writes_its_pub_to_the_trace_topic(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 2, trace.TRACE_TOPIC: 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[RequestCode.SEND_MESSAGE_V2] = broker.send_ok()
            broker.handlers[RequestCode.HEART_BEAT] = lambda conn, cmd: cmd.make_response(0)
            async with AsyncProducer("PG", registry, enable_msg_trace=True) as p:
                r = await p.send(Message("T", b"hello", tags="TagA", keys="order-7"))
                await async_wait_until(lambda: len(broker.of(RequestCode.SEND_MESSAGE_V2)) == 2, 10, 0.01,
                                       "the trace send")
                # counted when its answer is back, which may be after the broker has the request
                await async_wait_until(lambda: p.tracer.sent == 1, 10, 0.01, "the trace send's answer")
                sent = p.tracer.sent
            return r, broker.of(RequestCode.SEND_MESSAGE_V2), broker.addr, sent
    r, (_, traced), addr, sent = arun(main())
    ext = traced.ext_fields
    assert (ext["a"], ext["b"]) == (trace.TRACE_GROUP, trace.TRACE_TOPIC)
    keys = decode_properties(ext["i"])["KEYS"].split(" ")
    assert keys == [r.msg_id, "order-7"]
    (pub,), bad = trace.decode(traced.body.decode())
    assert bad == 0 and sent == 1
    assert (pub.type, pub.group, pub.topic, pub.msg_id, pub.offset_msg_id, pub.tags, pub.keys, pub.store_host,
            pub.body_length, pub.success) == (TraceType.PUB, "PG", "T", r.msg_id, r.offset_msg_id, "TagA", "order-7",
                                              addr, 5, True)


def test_a_refused_trace_costs_the_traced_send_nothing(tmp, caplog):
    async def main():
        broker = FakeBroker(topics={"T": 1, trace.TRACE_TOPIC: 1})
        ok = broker.send_ok()

        def send(conn, cmd):
            if cmd.ext_fields["b"] == trace.TRACE_TOPIC:
                return cmd.make_response(ResponseCode.NO_PERMISSION, "the trace topic is read-only here")
            return ok(conn, cmd)
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[RequestCode.SEND_MESSAGE_V2] = send
            broker.handlers[RequestCode.HEART_BEAT] = lambda conn, cmd: cmd.make_response(0)
            async with AsyncProducer("PG", registry, enable_msg_trace=True) as p:
                results = [await p.send(Message("T", b"x")) for _ in range(3)]
                await async_wait_until(lambda: p.tracer.failed >= 1, 10, 0.01, "the refused trace")
                await asyncio.sleep(0)
                return results, p.tracer.failed, p.tracer.sent
    results, failed, sent = arun(main())
    assert [r.status for r in results] == [SendStatus.SEND_OK] * 3
    assert failed >= 1 and sent == 0
    assert "was not stored in RMQ_SYS_TRACE_TOPIC" in caplog.text and "read-only" in caplog.text


def test_a_polled_batch_is_traced_as_javas_lite_consumer_hook_does():
    msgs = [MessageExt("T", 0, i, i * 200, 0, 0, 1, ("127.0.0.1", 1), 2, ("127.0.0.1", 2), i, 0, b"x",
                       {"UNIQ_KEY": f"U{i}", "KEYS": "k1 k2"} if i else {}, msg_id=f"OFFSET{i}") for i in range(2)]
    records: list[TraceRecord] = []
    trace.trace_polled("LG", msgs, records.append)
    assert [r.type for r in records] == [TraceType.SUB_BEFORE, TraceType.SUB_AFTER] * 2
    first_before, first_after, second_before, second_after = records
    assert (first_before.msg_id, second_before.msg_id, second_before.keys, second_before.retry_times) == (
        "OFFSET0", "U1", "k1 k2", 1)                            # no UNIQ_KEY: the offsetMsgId
    for before, after in ((first_before, first_after), (second_before, second_after)):
        assert after.request_id == before.request_id and before.request_id
        assert (after.group, after.topic, after.success, after.context_code, after.cost_ms) == (
            "LG", "T", True, ConsumeReturnType.SUCCESS, 0)
