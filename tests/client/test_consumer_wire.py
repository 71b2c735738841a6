"""Push and pull consumers against a scripted fake broker: the requests a RocketMQ consumer
makes (heartbeat, consumer list, offset queries, long-polling pulls with commit offsets,
send-back, locks, unregister), and how answers drive it (rebalance on notify, consume-from)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from smartgo.client import (AsyncLitePullConsumer, AsyncPullConsumer, AsyncPushConsumer, BrokerError, ConsumeResult,
                            MessageModel, MessageQueue, MessageSelector, PullStatus, SubscriptionError)
from smartgo.net.codes import PullSysFlag, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from tests.support.waits import async_wait_until

from .conftest import Background, FakeBroker, arun, fake_cluster, pull_response, response


class ScriptedQueues:
    """Pull answers from per-queue record lists; an empty queue holds the pull briefly (a short
    long poll) and answers PULL_NOT_FOUND."""

    def __init__(self, broker: FakeBroker, topic: str, queue_0: list[tuple[bytes, dict]] | None = None,
                 committed: int = 0) -> None:
        """queue_0: the records of queue 0, the group's offset there committed."""
        self.broker = broker
        self.topic = topic
        self.queues: dict[int, list[tuple[bytes, dict]]] = {} if queue_0 is None else {0: queue_0}
        self.offsets: dict[tuple[str, int], int] = {} if queue_0 is None else {(topic, 0): committed}
        self.consumers: list[str] = []
        h = broker.handlers
        h[RequestCode.HEART_BEAT] = self.heartbeat
        h[RequestCode.GET_CONSUMER_LIST_BY_GROUP] = lambda c, cmd: response(
            cmd, body=json.dumps({"consumerIdList": self.consumers}).encode())
        h[RequestCode.QUERY_CONSUMER_OFFSET] = self.query_offset
        h[RequestCode.UPDATE_CONSUMER_OFFSET] = self.update_offset
        h[RequestCode.GET_MAX_OFFSET] = lambda c, cmd: response(cmd, ext={"offset": "1"})
        h[RequestCode.PULL_MESSAGE] = self.pull
        h[RequestCode.CONSUMER_SEND_MSG_BACK] = lambda c, cmd: response(cmd)
        h[RequestCode.UNREGISTER_CLIENT] = lambda c, cmd: response(cmd)
        h[RequestCode.LOCK_BATCH_MQ] = lambda c, cmd: response(
            cmd, body=json.dumps({"lockOKMQSet": json.loads(cmd.body)["mqSet"]}).encode())
        h[RequestCode.UNLOCK_BATCH_MQ] = lambda c, cmd: response(cmd)

    def heartbeat(self, conn, cmd):
        cid = json.loads(cmd.body)["clientID"]
        if json.loads(cmd.body)["consumerDataSet"] and cid not in self.consumers:
            self.consumers.append(cid)
        return response(cmd)

    def query_offset(self, conn, cmd):
        key = (cmd.ext_fields["topic"], int(cmd.ext_fields["queueId"]))
        if key not in self.offsets:
            return response(cmd, ResponseCode.QUERY_NOT_FOUND, remark="Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return response(cmd, ext={"offset": str(self.offsets[key])})

    def update_offset(self, conn, cmd):
        self.offsets[(cmd.ext_fields["topic"], int(cmd.ext_fields["queueId"]))] = int(cmd.ext_fields["commitOffset"])
        return response(cmd)

    async def pull(self, conn, cmd):
        ext = cmd.ext_fields
        qid, offset = int(ext["queueId"]), int(ext["queueOffset"])
        records = self.queues.get(qid, []) if ext["topic"] == self.topic else []
        if offset < len(records):
            body = b"".join(self.broker.record(self.topic, qid, off, *records[off])
                            for off in range(offset, min(len(records), offset + int(ext["maxMsgNums"]))))
            return pull_response(cmd, 0, min(len(records), offset + int(ext["maxMsgNums"])), 0, len(records), body)
        await asyncio.sleep(0.05)
        return pull_response(cmd, ResponseCode.PULL_NOT_FOUND, offset, 0, len(records))


def test_push_consumer_requests_and_send_back(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 2, "%RETRY%G": 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            q = ScriptedQueues(broker, "T")
            q.offsets[("T", 1)] = 0
            q.queues = {0: [(b"old", {"TAGS": "A"})] + [(f"m{i}".encode(), {"TAGS": "AB"[i % 2], "UNIQ_KEY": f"U{i}"})
                                                       for i in range(6)],
                        1: [(b"fail", {"TAGS": "A", "UNIQ_KEY": "UFAIL"}), (b"ok", {"TAGS": "A"})]}
            got = []
            failed_once = set()

            def listener(msg):
                got.append((msg.queue_id, msg.queue_offset, msg.body))
                if msg.body == b"fail" and msg.body not in failed_once:
                    failed_once.add(msg.body)
                    return ConsumeResult.RECONSUME_LATER
                return ConsumeResult.SUCCESS
            c = AsyncPushConsumer("G", registry, listener=listener, consume_threads=2)
            c.subscribe("T", "A")
            await c.start()
            await async_wait_until(lambda: len(got) >= 5, 10, message="messages")
            await async_wait_until(lambda: broker.of(RequestCode.CONSUMER_SEND_MSG_BACK), 5, message="send back")

            def offset_committed_on_a_pull() -> bool:     # committed offsets ride on later pulls
                return any(p.ext_fields["topic"] == "T" and int(p.ext_fields["sysFlag"]) & PullSysFlag.COMMIT_OFFSET
                           and int(p.ext_fields["commitOffset"]) > 0 for p in broker.of(RequestCode.PULL_MESSAGE))
            await async_wait_until(offset_committed_on_a_pull, 10, message="a pull committing an offset")
            cid = c.client_id
            await c.close()
            return broker, q, got, cid
    broker, q, got, cid = arun(main())
    bodies = sorted(b for _, _, b in got)
    # queue 0 is new: consume from last = GET_MAX_OFFSET (1) skips "old"; only tag A (client re-filters too)
    assert bodies == sorted([b"m0", b"m2", b"m4", b"fail", b"ok"])
    hb = json.loads(broker.of(RequestCode.HEART_BEAT)[0].body)
    (cdata,) = hb["consumerDataSet"]
    assert cdata["groupName"] == "G" and cdata["consumeType"] == "CONSUME_PASSIVELY"
    assert cdata["messageModel"] == "CLUSTERING" and cdata["consumeFromWhere"] == "CONSUME_FROM_LAST_OFFSET"
    subs = {s["topic"]: s for s in cdata["subscriptionDataSet"]}
    assert subs["T"]["tagsSet"] == ["A"] and subs["T"]["codeSet"] == [65] and subs["%RETRY%G"]["subString"] == "*"
    pulls = [p for p in broker.of(RequestCode.PULL_MESSAGE) if p.ext_fields["topic"] == "T"]
    first = pulls[0].ext_fields
    assert int(first["sysFlag"]) & PullSysFlag.SUSPEND and first["suspendTimeoutMillis"] == "15000"
    assert first["subscription"] == "A" and first["maxMsgNums"] == "32" and first["expressionType"] == "TAG"
    assert int(first["sysFlag"]) & PullSysFlag.SUBSCRIPTION == 0
    assert any(int(p.ext_fields["sysFlag"]) & PullSysFlag.COMMIT_OFFSET and int(p.ext_fields["commitOffset"]) > 0
               for p in pulls)  # committed offsets ride on later pulls
    (back,) = broker.of(RequestCode.CONSUMER_SEND_MSG_BACK)
    ext = back.ext_fields
    assert ext["offset"] == str(1000 + 0 * 200) and ext["group"] == "G" and ext["delayLevel"] == "0"
    assert ext["originMsgId"] == "UFAIL" and ext["originTopic"] == "T" and ext["maxReconsumeTimes"] == "16"
    # offsets committed at close: queue 0 up to 7 (all pulled), queue 1 up to 2
    assert q.offsets[("T", 0)] == 7 and q.offsets[("T", 1)] == 2
    assert broker.of(RequestCode.UNREGISTER_CLIENT)[0].ext_fields == {"clientID": cid, "consumerGroup": "G"}
    assert any(int(r.ext_fields["queueId"]) == 0 for r in broker.of(RequestCode.GET_MAX_OFFSET))


def test_send_back_failure_consumes_again_locally(tmp, monkeypatch):
    monkeypatch.setattr("smartgo.client.push_consumer.RECONSUME_LATER_DELAY", 0.1)

    async def main():
        broker = FakeBroker(topics={"T": 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            q = ScriptedQueues(broker, "T", [(b"x", {})])
            broker.handlers[RequestCode.CONSUMER_SEND_MSG_BACK] = lambda c, cmd: response(
                cmd, ResponseCode.SYSTEM_ERROR, remark="no")
            calls = []
            c = AsyncPushConsumer("G", registry, listener=lambda m: ConsumeResult.SUCCESS if calls.append(
                m.reconsume_times) or len(calls) > 1 else ConsumeResult.RECONSUME_LATER)
            c.subscribe("T")
            async with c:
                await async_wait_until(lambda: len(calls) >= 2, 10, message="second delivery")
            return calls, q.offsets[("T", 0)]
    calls, offset = arun(main())
    assert calls[:2] == [0, 1] and offset == 1


def test_rebalance_on_notify(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 4})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            q = ScriptedQueues(broker, "T")
            for i in range(4):
                q.offsets[("T", i)] = 0
            q.consumers = ["0.0.0.0@other"]
            c = AsyncPushConsumer("G", registry, listener=lambda m: None)
            c.subscribe("T")
            async with c:
                await async_wait_until(lambda: len(c.process_queues) == 2, 5, message="half the queues")
                mine = sorted(mq.queue_id for mq in c.process_queues)
                q.consumers.remove("0.0.0.0@other")
                conn = broker.connections[-1]
                for conn in broker.connections:
                    conn.invoke_oneway(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                       ext_fields={"consumerGroup": "G"}))
                await async_wait_until(lambda: len(c.process_queues) == 4, 3, message="all queues after notify")
            return mine
    # sorted ids: "0.0.0.0@other" < "<ip>@<pid>" -> the other consumer gets queues 0-1
    assert arun(main()) == [2, 3]


def test_a_queue_whose_start_cannot_be_told_yet_is_held_and_read_once_its_broker_answers(tmp, monkeypatch):
    """Its broker restarting, say: the rebalance holds the queue anyway, and its pull loop asks
    where to start as it retries a pull, not at the next rebalance (20 s on, as Java)."""
    monkeypatch.setattr("smartgo.client.rebalance.PULL_DELAY_ON_ERROR", 0.05)

    async def main():
        broker = FakeBroker(topics={"T": 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            q = ScriptedQueues(broker, "T", [(b"done", {}), (b"new", {})], committed=1)
            answer = q.query_offset
            refused: list[int] = []

            def starting(conn, cmd):
                if len(refused) < 2:
                    refused.append(1)
                    return response(cmd, ResponseCode.SYSTEM_ERROR, remark="the broker is starting")
                return answer(conn, cmd)
            broker.handlers[RequestCode.QUERY_CONSUMER_OFFSET] = starting
            got: list[bytes] = []
            c = AsyncPushConsumer("G", registry, listener=lambda m: got.append(m.body))
            c.subscribe("T")
            async with c:
                await async_wait_until(lambda: got, 5, message="the message after the stored offset")
            return got, refused
    got, refused = arun(main())
    assert got == [b"new"] and len(refused) == 2


def test_orderly_one_at_a_time_in_order(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 2})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            q = ScriptedQueues(broker, "T")
            q.offsets.update({("T", 0): 0, ("T", 1): 0})
            q.queues = {i: [(f"{i}-{n}".encode(), {}) for n in range(20)] for i in range(2)}
            seen: dict[int, list[int]] = {0: [], 1: []}
            running: dict[int, int] = {0: 0, 1: 0}
            overlap = []
            lock = threading.Lock()

            def listener(msg):
                with lock:
                    running[msg.queue_id] += 1
                    overlap.append(running[msg.queue_id])
                seen[msg.queue_id].append(msg.queue_offset)
                if msg.queue_offset == 5 and seen[msg.queue_id].count(5) == 1:
                    with lock:
                        running[msg.queue_id] -= 1
                    return ConsumeResult.RECONSUME_LATER  # suspended, then the same message again
                with lock:
                    running[msg.queue_id] -= 1
                return ConsumeResult.SUCCESS
            c = AsyncPushConsumer("G", registry, listener=listener, orderly=True, consume_threads=4,
                                  suspend_current_queue_time=0.05)
            c.subscribe("T")
            async with c:
                await async_wait_until(lambda: all(len(v) == 21 for v in seen.values()), 10, message="all")
            return seen, overlap, broker
    seen, overlap, broker = arun(main())
    for offsets in seen.values():
        assert offsets == list(range(6)) + list(range(5, 20))
    assert max(overlap) == 1
    lock_body = json.loads(broker.of(RequestCode.LOCK_BATCH_MQ)[0].body)
    assert set(lock_body) == {"clientId", "consumerGroup", "mqSet"} and lock_body["consumerGroup"] == "G"
    assert broker.of(RequestCode.UNLOCK_BATCH_MQ)


def test_broadcasting_uses_local_offsets(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            q = ScriptedQueues(broker, "T")
            q.queues = {0: [(b"a", {}), (b"b", {})]}
            got = []
            c = AsyncPushConsumer("G", registry, listener=lambda m: got.append(m.body), model=MessageModel.BROADCASTING,
                                  consume_from="CONSUME_FROM_FIRST_OFFSET", offset_store_dir=tmp / "offsets",
                                  instance_name="b1")
            c.subscribe("T")
            async with c:
                await async_wait_until(lambda: len(got) == 2, 5, message="both")
            return got, broker
    got, broker = arun(main())
    assert sorted(got) == [b"a", b"b"]          # concurrent listeners: either may finish first
    assert not broker.of(RequestCode.QUERY_CONSUMER_OFFSET) and not broker.of(RequestCode.GET_CONSUMER_LIST_BY_GROUP)
    assert not broker.of(RequestCode.UPDATE_CONSUMER_OFFSET)
    saved = json.loads((tmp / "offsets" / "b1" / "G" / "offsets.json").read_text())
    assert saved["offsetTable"] == [{"brokerName": "broker-a", "offset": 2, "queueId": 0, "topic": "T"}]


def test_pull_consumer(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 2})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            q = ScriptedQueues(broker, "T")
            q.queues = {0: [(b"a", {"TAGS": "X"}), (b"b", {"TAGS": "Y"})]}
            broker.handlers[RequestCode.GET_MIN_OFFSET] = lambda c, cmd: response(cmd, ext={"offset": "0"})
            broker.handlers[RequestCode.SEARCH_OFFSET_BY_TIMESTAMP] = lambda c, cmd: response(cmd, ext={"offset": "1"})
            async with AsyncPullConsumer("PC", registry) as pc:
                queues = await pc.fetch_queues("T")
                r = await pc.pull(queues[0], "Y", 0, 32)
                empty = await pc.pull(queues[0], "*", 2, 32)
                await pc.update_consume_offset(queues[0], 2)
                stored = await pc.fetch_consume_offset(queues[0])
                limits = (await pc.min_offset(queues[0]), await pc.max_offset(queues[0]),
                          await pc.search_offset(queues[0], 5))
            return queues, r, empty, stored, limits, broker
    queues, r, empty, stored, limits, broker = arun(main())
    assert queues == [MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-a", 1)]
    assert r.status is PullStatus.FOUND and [m.body for m in r.messages] == [b"b"] and r.next_begin_offset == 2
    assert r.messages[0].properties["MAX_OFFSET"] == "2"
    assert empty.status is PullStatus.NO_NEW_MSG and stored == 2 and limits == (0, 1, 1)
    pull = broker.of(RequestCode.PULL_MESSAGE)[0].ext_fields
    assert int(pull["sysFlag"]) == PullSysFlag.SUBSCRIPTION and pull["consumerGroup"] == "PC"
    assert broker.of(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)[0].ext_fields["timestamp"] == "5"


def test_pull_errors_are_clear(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[RequestCode.PULL_MESSAGE] = lambda c, cmd: response(
                cmd, ResponseCode.SUBSCRIPTION_NOT_EXIST, remark="the consumer's subscription not exist")
            async with AsyncPullConsumer("PC", registry) as pc:
                (queue,) = await pc.fetch_queues("T")
                with pytest.raises(Exception, match="SUBSCRIPTION_NOT_EXIST"):
                    await pc.pull(queue)
                with pytest.raises(Exception, match="no route"):
                    await pc.fetch_queues("Missing")
    arun(main())


def test_blocking_facades(tmp):
    """Producer and PushConsumer (blocking) over their async twins, on their own loop threads."""
    import concurrent.futures

    from smartgo.client import ClientStateError, Message, Producer, PushConsumer, SendStatus
    from tests.support.waits import wait_until

    bg = Background()
    broker = FakeBroker(topics={"T": 2})
    ctx = fake_cluster(tmp, [broker])
    registry, _ = bg.run(ctx.__aenter__())
    try:
        broker.handlers[RequestCode.SEND_MESSAGE_V2] = broker.send_ok()
        q = ScriptedQueues(broker, "T")
        q.offsets.update({("T", 0): 0, ("T", 1): 0})
        q.queues = {0: [(b"a", {})], 1: [(b"b", {})]}
        with Producer("PG", registry) as p:
            assert p.send(Message("T", b"x")).status is SendStatus.SEND_OK
            fut = p.send_async(Message("T", b"y"))
            assert isinstance(fut, concurrent.futures.Future) and fut.result(5).status is SendStatus.SEND_OK
        with pytest.raises(ClientStateError):
            p.send(Message("T", b"z"))
        got = []
        consumer = PushConsumer("G", registry)
        consumer.subscribe("T")
        consumer.set_listener(lambda m: got.append(m.body))
        with consumer:
            wait_until(lambda: sorted(got) == [b"a", b"b"], 10, message="both messages")
            assert len(consumer.assigned_queues) == 2
    finally:
        bg.run(ctx.__aexit__(None, None, None))
        bg.stop()


def test_sql92_consumer_checks_its_expression_in_the_brokers_at_start(tmp):
    """checkClientInBroker: CHECK_CLIENT_CONFIG before the first heartbeat; a refusal fails start()
    with the broker's reason, and the SQL92 subscription goes out as is (no tags, no codes)."""
    async def main():
        broker = FakeBroker(topics={"T": 1, "%RETRY%G": 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            ScriptedQueues(broker, "T", [(b"m", {"a": "1"})])
            verdict = [ResponseCode.SUBSCRIPTION_PARSE_FAILED]
            broker.handlers[RequestCode.CHECK_CLIENT_CONFIG] = lambda c, cmd: response(
                cmd, verdict[0], remark="invalid SQL92 expression")
            refused = AsyncPushConsumer("G", registry, listener=lambda m: ConsumeResult.SUCCESS)
            refused.subscribe("T", MessageSelector.by_sql("a = 1"))
            with pytest.raises(BrokerError, match="SUBSCRIPTION_PARSE_FAILED"):
                await refused.start()
            heartbeats_after_refusal = len(broker.of(RequestCode.HEART_BEAT))
            verdict[0] = ResponseCode.SUCCESS
            got = []
            c = AsyncPushConsumer("G", registry, listener=lambda m: got.append(m.body))
            c.subscribe("T", MessageSelector.by_sql("a = 1"))
            async with c:
                await async_wait_until(lambda: got, 10, message="the message")
            return broker, heartbeats_after_refusal
    broker, heartbeats_after_refusal = arun(main())
    assert heartbeats_after_refusal == 0
    checks = [json.loads(r.body) for r in broker.of(RequestCode.CHECK_CLIENT_CONFIG)]
    assert len(checks) == 2 and checks[0]["group"] == "G" and checks[0]["clientId"]
    assert {k: checks[0]["subscriptionData"][k] for k in ("topic", "subString", "expressionType", "tagsSet",
                                                           "codeSet")} == \
        {"topic": "T", "subString": "a = 1", "expressionType": "SQL92", "tagsSet": [], "codeSet": []}
    pull = next(p.ext_fields for p in broker.of(RequestCode.PULL_MESSAGE) if p.ext_fields["topic"] == "T")
    assert pull["expressionType"] == "SQL92" and pull["subscription"] == "a = 1"


def test_sql92_subscription_errors_show_at_subscribe():
    c = AsyncPushConsumer("G", "127.0.0.1:1", listener=lambda m: ConsumeResult.SUCCESS)
    with pytest.raises(SubscriptionError, match="does not compile"):
        c.subscribe("T", MessageSelector.by_sql("a >"))
    with pytest.raises(SubscriptionError, match="unknown expression type"):
        c.subscribe("T", MessageSelector("JAVASCRIPT", "true"))
    c.subscribe("T", MessageSelector.by_tag("A || B"))
    assert c.subscriptions["T"].tags_set == ["A", "B"] and c.subscriptions["T"].expression_type == "TAG"


def test_lite_pull_consumer_requests_and_a_garbled_answer(tmp, monkeypatch, caplog):
    """Java's DefaultLitePullConsumer on the wire: CONSUME_ACTIVELY with its subscriptions, pulls
    held 20 s that commit nothing (offsets go by UPDATE_CONSUMER_OFFSET), 10 at a time. A pull
    answer that does not decode is logged and the queue pulled again; the other queue is polled
    meanwhile."""
    monkeypatch.setattr("smartgo.client.rebalance.PULL_DELAY_ON_ERROR", 0.05)

    async def main():
        broker = FakeBroker(topics={"T": 2})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            q = ScriptedQueues(broker, "T")
            q.offsets.update({("T", 0): 0, ("T", 1): 0})
            q.queues = {i: [(f"q{i}-{n}".encode(), {"TAGS": "A"}) for n in range(12)] for i in range(2)}
            garbled = []

            async def pull(conn, cmd):
                if cmd.ext_fields["queueId"] == "0" and not garbled:
                    garbled.append(cmd)
                    return pull_response(cmd, 0, 5, 0, 12, b"\x00\x00\x00\x10not a record")
                return await q.pull(conn, cmd)
            broker.handlers[RequestCode.PULL_MESSAGE] = pull
            c = AsyncLitePullConsumer("G", registry, auto_commit=False)
            c.subscribe("T", "A")
            async with c:
                got = []
                while len(got) < 24:
                    got += await c.poll(5.0)
                await c.commit()
            return broker, q, got
    with caplog.at_level("WARNING", "smartgo.client.lite_pull_consumer"):
        broker, q, got = arun(main())
    assert sorted(m.body for m in got) == sorted(f"q{i}-{n}".encode() for i in range(2) for n in range(12))
    assert any("pull from" in r.message and "does not decode" in r.message for r in caplog.records)
    assert q.offsets == {("T", 0): 12, ("T", 1): 12}
    hb = json.loads(broker.of(RequestCode.HEART_BEAT)[0].body)
    (cdata,) = hb["consumerDataSet"]
    assert cdata["consumeType"] == "CONSUME_ACTIVELY" and cdata["messageModel"] == "CLUSTERING"
    assert [s["topic"] for s in cdata["subscriptionDataSet"]] == ["T"]
    first = broker.of(RequestCode.PULL_MESSAGE)[0].ext_fields
    assert int(first["sysFlag"]) == PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION
    assert first["suspendTimeoutMillis"] == "20000" and first["maxMsgNums"] == "10" and first["subscription"] == "A"
