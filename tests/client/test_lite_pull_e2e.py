"""The lite pull consumer (Java's DefaultLitePullConsumer) against a real registry and broker:
balancing in subscribe mode, assign, seek, pause/resume, commits (automatic, explicit, at close),
tag filtering, broadcasting, long polling, an operator's offset reset and running info."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from smartgo.cli.main import main
from smartgo.client import (AsyncAdmin, AsyncLitePullConsumer, AsyncProducer, ClientStateError, LitePullConsumer,
                            Message, MessageModel, MessageQueue, MessageSelector, Producer, SubscriptionError)
from smartgo.client.lite_pull_consumer import SUSPENDED_PULL_TIMEOUT
from tests.support.waits import async_wait_until, wait_until

from .conftest import arun
from .test_push_e2e import create_topic, name, send_all

pytestmark = pytest.mark.timeout(120)


async def poll_until(consumer: AsyncLitePullConsumer, n: int, timeout: float = 30.0) -> list:
    """Poll until n messages came (more is a failure the caller sees)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"polled {len(got)} of {n}"
        got += await consumer.poll(0.5)
    return got


async def backlog(registry: str, topic: str, group: str, n: int, expression: str = "*",
                  **options: object) -> tuple[dict[str, str], AsyncLitePullConsumer]:
    """A one-queue topic holding n messages (tags A, B, A, ...) and a new consumer of it, not
    started, reading from the first offset."""
    await create_topic(registry, topic, 1)
    sent = await send_all(registry, topic, n)
    consumer = AsyncLitePullConsumer(group, registry, consume_from="CONSUME_FROM_FIRST_OFFSET", **options)
    consumer.subscribe(topic, expression)
    return sent, consumer


async def progress(registry: str, group: str, topic: str) -> dict[int, int]:
    async with AsyncAdmin(registry) as admin:
        stats = await admin.consumer_progress(group, topic)
    return {q.queue.queue_id: q.consumer_offset for q in stats.queues}


def test_subscribe_splits_the_queues_commits_and_takes_over(real_cluster):
    topic, group = name("LITE"), name("LG")

    async def main():
        await create_topic(real_cluster.registry, topic, 4)
        a = AsyncLitePullConsumer(group, real_cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                                  auto_commit=False, pull_batch_size=16)
        b = AsyncLitePullConsumer(group, real_cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                                  auto_commit=False, pull_batch_size=16)
        heard: dict[str, list] = {"a": [], "b": []}               # MessageQueueListener calls
        a.subscribe(topic, listener=lambda *args: heard["a"].append(args))
        b.subscribe(topic, listener=lambda *args: heard["b"].append(args))
        await a.start()
        await b.start()
        try:
            await async_wait_until(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2, 30, 0.05,
                                   "two queues each")
            assert not a.assignment() & b.assignment()
            all_queues = set(await a.fetch_queues(topic))
            assert heard["a"][-1] == (topic, all_queues, a.assignment())
            assert heard["b"][-1] == (topic, all_queues, b.assignment())
            sent = await send_all(real_cluster.registry, topic, 200)
            got_a, got_b = [], []
            deadline = time.monotonic() + 30
            while len(got_a) + len(got_b) < 200:
                assert time.monotonic() < deadline, f"polled {len(got_a) + len(got_b)} of 200"
                got_a += await a.poll(0.2)
                got_b += await b.poll(0.2)
            keys = [m.properties["UNIQ_KEY"] for m in got_a + got_b]
            assert sorted(keys) == sorted(sent)                       # each exactly once
            assert {m.queue_id for m in got_a} <= {mq.queue_id for mq in a.assignment()}
            assert {m.queue_id for m in got_b} <= {mq.queue_id for mq in b.assignment()}
            for got in (got_a, got_b):                                # offset order within a queue
                for qid in {m.queue_id for m in got}:
                    offsets = [m.queue_offset for m in got if m.queue_id == qid]
                    assert offsets == sorted(offsets)
            assert await progress(real_cluster.registry, group, topic) == dict.fromkeys(range(4), 0)  # none yet
            await a.commit()
            await b.commit()
            per_queue = Counter(m.queue_id for m in got_a + got_b)      # batches of 32 go to one queue each
            assert await progress(real_cluster.registry, group, topic) == per_queue
            for mq in a.assignment():
                assert await a.committed(mq) == per_queue[mq.queue_id]
        finally:
            await b.close()
        try:
            await async_wait_until(lambda: len(a.assignment()) == 4, 30, 0.05, "a takes b's queues")
            assert heard["a"][-1] == (topic, all_queues, all_queues)
            more = await send_all(real_cluster.registry, topic, 40)
            got = await poll_until(a, 40)
            assert sorted(m.properties["UNIQ_KEY"] for m in got) == sorted(more)   # b's commit was respected
        finally:
            await a.close()
        with pytest.raises(ClientStateError, match="not running"):
            await a.poll(0)
    arun(main())


def test_assign_seek_pause_resume_and_explicit_commit(real_cluster, tmp_path: Path):
    topic, group = name("LITEA"), name("LG")
    arun(create_topic(real_cluster.registry, topic, 2))
    with Producer("PG", real_cluster.registry) as p:
        queues = p.fetch_publish_queues(topic)
        for i in range(10):
            p.send_to_queue(Message(topic, f"q0-{i}".encode()), queues[0])
            p.send_to_queue(Message(topic, f"q1-{i}".encode()), queues[1])
    q0, q1 = sorted(queues)[:2]
    consumer = LitePullConsumer(group, real_cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                                pull_batch_size=32)
    consumer.assign([q0])
    with pytest.raises(ClientStateError, match="mutually exclusive"):
        consumer.subscribe(topic)
    with consumer:
        assert consumer.assignment() == {q0}
        got = consumer.poll(10.0)
        assert [m.body for m in got] == [f"q0-{i}".encode() for i in range(10)]
        assert {MessageQueue(m.topic, m.broker_name, m.queue_id) for m in got} == {q0}
        consumer.seek(q0, 3)
        again = consumer.poll(10.0)
        assert [m.queue_offset for m in again] == list(range(3, 10))
        with pytest.raises(ValueError, match="outside"):
            consumer.seek(q0, 11)
        with pytest.raises(ClientStateError, match="not assigned"):
            consumer.seek(q1, 0)
        consumer.seek_to_end(q0)
        consumer.pause([q0])
        with Producer("PG", real_cluster.registry) as p:
            p.send_to_queue(Message(topic, b"while paused"), q0)
        assert consumer.poll(1.0) == []                           # paused: not pulled
        consumer.resume([q0])
        assert [m.body for m in consumer.poll(10.0)] == [b"while paused"]
        consumer.commit({q0: 4, q1: 9})                           # q1 is not held: skipped
        assert consumer.committed(q0) == 4
        assert arun(progress(real_cluster.registry, group, topic)) == {q0.queue_id: 4, q1.queue_id: 0}
        consumer.assign([q1])                                     # q0 let go, q1 read from its start
        assert consumer.assignment() == {q1}
        assert [m.body for m in consumer.poll(10.0)] == [f"q1-{i}".encode() for i in range(10)]
    # close committed where poll got to in q1 (auto_commit), and q0's commit stays
    assert arun(progress(real_cluster.registry, group, topic)) == {q0.queue_id: 4, q1.queue_id: 10}


def test_assign_filters_by_each_topics_expression_and_a_blocking_subscriber_hears_its_share(real_cluster):
    """setSubExpressionForAssign per topic, and the blocking consumer's MessageQueueListener run on
    a worker thread (it may call the consumer)."""
    tagged, plain, group = name("LITET"), name("LITEP"), name("LG")

    async def setup():
        for topic in (tagged, plain):
            await backlog(real_cluster.registry, topic, group, 6)         # tags A, B, A, ...
    arun(setup())
    with Producer("PG", real_cluster.registry) as p:
        queues = p.fetch_publish_queues(tagged) + p.fetch_publish_queues(plain)
    consumer = LitePullConsumer(group, real_cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET")
    consumer.set_sub_expression_for_assign(tagged, "A")
    consumer.assign(queues)
    with consumer:
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < 9:
            assert time.monotonic() < deadline, f"polled {len(got)} of 9"
            got += consumer.poll(1.0)
        assert sorted(m.tags for m in got if m.topic == tagged) == ["A"] * 3
        assert sorted(m.tags for m in got if m.topic == plain) == ["A"] * 3 + ["B"] * 3
    heard: list = []
    subscriber = LitePullConsumer(name("LG"), real_cluster.registry)
    subscriber.subscribe(plain, listener=lambda topic, every, mine: heard.append((topic, mine,
                                                                                 subscriber.assignment())))
    with subscriber:
        wait_until(lambda: heard, 20, 0.05, "the queue listener")
    assert heard == [(plain, set(queues[1:]), set(queues[1:]))]


def test_auto_commit_and_a_restarted_consumer_goes_on_from_it(real_cluster):
    topic, group = name("LITEC"), name("LG")

    async def main():
        # 30 messages, so that nothing is pulled ahead of the last poll (more would be, at any time)
        sent, first = await backlog(real_cluster.registry, topic, group, 30, pull_batch_size=10,
                                    auto_commit_interval=0, persist_offset_interval=0.2)
        async with first:
            got = await poll_until(first, 30)
            assert len(got) == 30
            mq = next(iter(first.assignment()))
            assert await first.committed(mq) == 20      # each poll commits what the polls before it got
            assert await first.poll(0) == []
            assert await first.committed(mq) == 30
            await async_wait_until(lambda: _at(real_cluster.registry, group, topic, 30), 10, 0.1,
                                   "the periodic persistence")
        sent.update(await send_all(real_cluster.registry, topic, 20))
        # a consumer without auto commit reads from there and commits nothing at close
        second = AsyncLitePullConsumer(group, real_cluster.registry, auto_commit=False, pull_batch_size=10)
        second.subscribe(topic)
        async with second:
            rest = await poll_until(second, 20)
        keys = [m.properties["UNIQ_KEY"] for m in got + rest]
        assert sorted(keys) == sorted(sent)
        assert await progress(real_cluster.registry, group, topic) == {0: 30}
    arun(main())


def test_flow_control_bounds_what_is_cached(real_cluster):
    topic, group = name("LITEF"), name("LG")

    async def main():
        sent, consumer = await backlog(real_cluster.registry, topic, group, 100, pull_batch_size=10,
                                       pull_threshold_for_all=20)
        async with consumer:
            got = await poll_until(consumer, 10)
            await asyncio.sleep(0.5)                 # time for 8 more pulls, were they allowed
            (cached,) = [q["cachedMsgCount"] for q in consumer.running_info().queues.values()]
            assert 0 < cached <= 30                  # two batches waiting, one more in flight at most
            got += await poll_until(consumer, 90)
        assert sorted(m.properties["UNIQ_KEY"] for m in got) == sorted(sent)
    arun(main())


async def _at(registry: str, group: str, topic: str, offset: int) -> bool:
    return await progress(registry, group, topic) == {0: offset}


def test_tag_filter_commits_past_skipped_messages_and_long_poll_wakes(real_cluster):
    topic, group = name("LITET"), name("LG")

    async def main():
        _, consumer = await backlog(real_cluster.registry, topic, group, 20, "A")     # the last is a B
        async with consumer:
            got = await poll_until(consumer, 10)
            assert {m.tags for m in got} == {"A"}
            mq = next(iter(consumer.assignment()))
            await async_wait_until(lambda: committed_after_commit(consumer, mq, 20), 10, 0.05,
                                   "the filtered-out last message committed too")
            waiting = asyncio.get_running_loop().create_task(consumer.poll(SUSPENDED_PULL_TIMEOUT / 3))
            await asyncio.sleep(0.3)                              # the pull is held at the broker by now
            async with AsyncProducer("PG", real_cluster.registry) as p:
                await p.send(Message(topic, b"wake", tags="A"))
            woken = await waiting
            assert [m.body for m in woken] == [b"wake"]
    arun(main())


async def committed_after_commit(consumer: AsyncLitePullConsumer, mq: MessageQueue, offset: int) -> bool:
    await consumer.commit()
    return await consumer.committed(mq) == offset


def test_broadcasting_reads_everything_in_each_consumer_and_keeps_offsets_locally(real_cluster, tmp_path: Path):
    topic, group = name("LITEB"), name("LG")

    async def main():
        await create_topic(real_cluster.registry, topic, 2)
        consumers = [AsyncLitePullConsumer(group, real_cluster.registry, model=MessageModel.BROADCASTING,
                                           consume_from="CONSUME_FROM_FIRST_OFFSET", offset_store_dir=tmp_path,
                                           instance_name=f"c{i}") for i in range(2)]
        for c in consumers:
            c.subscribe(topic)
            await c.start()
        sent = await send_all(real_cluster.registry, topic, 30)
        try:
            for c in consumers:
                await async_wait_until(lambda c=c: len(c.assignment()) == 2, 10, 0.05, "both queues")
                got = await poll_until(c, 30)
                assert sorted(m.properties["UNIQ_KEY"] for m in got) == sorted(sent)
        finally:
            for c in consumers:
                await c.close()
        per_queue = Counter(m.queue_id for m in got)
        for i in range(2):                    # each consumer's own file: where its polls got to
            stored = json.loads((tmp_path / f"c{i}" / group / "offsets.json").read_text())
            assert {e["queueId"]: e["offset"] for e in stored["offsetTable"] if e["offset"]} == per_queue
    arun(main())


def test_reset_offset_by_an_operator_and_running_info(real_cluster):
    topic, group = name("LITER"), name("LG")

    async def main():
        sent, consumer = await backlog(real_cluster.registry, topic, group, 12, pull_batch_size=32)
        async with consumer, AsyncAdmin(real_cluster.registry) as admin:
            assert len(await poll_until(consumer, 12)) == 12
            info = await admin.consumer_running_info(group, consumer.client_id)
            assert info.properties["PROP_CONSUME_TYPE"] == "CONSUME_ACTIVELY"
            assert info.properties["autoCommit"] == "true"
            assert [s["topic"] for s in info.subscriptions] == [topic]
            assert [mq.topic for mq in info.queues] == [topic]
            await consumer.commit()                # 4.x resets only queues the group has committed in
            table = await admin.reset_offset_by_time(group, topic, 0)
            assert list(table.values()) == [0]
            again = await poll_until(consumer, 12)
            assert sorted(m.properties["UNIQ_KEY"] for m in again) == sorted(sent)
            assert await progress(real_cluster.registry, group, topic) == {0: 0}
    arun(main())


def test_misuse_is_refused_clearly(tmp_path: Path):
    consumer = AsyncLitePullConsumer("LG", "127.0.0.1:1")

    async def main():
        with pytest.raises(ClientStateError, match="subscribe to a topic or assign"):
            await consumer.start()
        with pytest.raises(ClientStateError, match="not running"):
            await consumer.poll(0)
        consumer.subscribe("T")
        with pytest.raises(ClientStateError, match="mutually exclusive"):
            await consumer.assign([MessageQueue("T", "b", 0)])
    arun(main())
    with pytest.raises(ValueError, match="group"):
        AsyncLitePullConsumer("", "127.0.0.1:1")
    blocking = LitePullConsumer("LG", "127.0.0.1:1")
    with pytest.raises(SubscriptionError):
        blocking.subscribe("T", MessageSelector.by_sql("a >"))
    blocking.close()


def test_cli_consume_lite_commits_only_what_it_printed(real_cluster, capsys):
    topic, group = name("LITECLI"), name("LG")
    arun(create_topic(real_cluster.registry, topic, 1))
    sent = arun(send_all(real_cluster.registry, topic, 5))
    args = ["consume", "--topic", topic, "--lite", "--group", group, "--from", "first", "--json",
            "-n", real_cluster.registry]
    assert main([*args, "--count", "3"]) == 0
    first = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [m["queue_offset"] for m in first] == [0, 1, 2]        # one batch of 5 pulled, 3 printed
    assert arun(progress(real_cluster.registry, group, topic)) == {0: 3}
    assert main([*args, "--count", "2"]) == 0
    second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [m["queue_offset"] for m in second] == [3, 4]
    assert sorted(m["msg_id"] for m in first + second) == sorted(sent)
    assert main([*args, "--orderly"]) != 0
    assert "--orderly applies to the push consumer, not --lite" in capsys.readouterr().err


def test_an_assigning_consumer_hears_of_new_queues_and_takes_them(real_cluster):
    topic, group = name("LITEQ"), name("LG")
    arun(create_topic(real_cluster.registry, topic, 2))
    heard: list[set] = []
    consumer = LitePullConsumer(group, real_cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                                poll_registry_interval=0.2)
    with Producer("PG", real_cluster.registry) as p:
        queues = p.fetch_publish_queues(topic)
        consumer.assign(queues)
        with consumer:
            def changed(t: str, now: set) -> None:
                heard.append(now)
                consumer.assign(sorted(now))          # a blocking call: the callback runs on a worker thread
            consumer.on_queues_changed(topic, changed)
            arun(create_topic(real_cluster.registry, topic, 4))
            wait_until(lambda: consumer.assignment() == heard[-1] if heard else False, 15, 0.05,
                       "the new queues assigned")
            assert heard == [{MessageQueue(topic, queues[0].broker_name, q) for q in range(4)}]
            p.send_to_queue(Message(topic, b"in a new queue"), MessageQueue(topic, queues[0].broker_name, 3))
            got = []
            deadline = time.monotonic() + 15
            while not got and time.monotonic() < deadline:
                got = consumer.poll(1.0)
            assert [(m.body, m.queue_id) for m in got] == [(b"in a new queue", 3)]
