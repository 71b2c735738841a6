"""End to end against real processes, with the broker's control plane: push consumers need
HEART_BEAT (34), GET_CONSUMER_LIST_BY_GROUP (38), NOTIFY_CONSUMER_IDS_CHANGED (40),
QUERY/UPDATE_CONSUMER_OFFSET (14/15), LOCK/UNLOCK_BATCH_MQ (41/42), UNREGISTER_CLIENT (35) and
admin codes (17, 203, 208) - broker issue 7; redelivery through the retry topic needs
CONSUMER_SEND_MSG_BACK (36, issue 9), and falls back to local re-consumption without it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from smartgo.client import (Admin, AsyncAdmin, AsyncProducer, AsyncPullConsumer, AsyncPushConsumer, ConsumeResult,
                            Message, MessageModel, MessageSelector, Producer, PushConsumer)
from tests.support.waits import async_wait_until, wait_until

from .conftest import ROOT, arun

pytestmark = pytest.mark.timeout(120)


def name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


async def send_all(registry: str, topic: str, n: int, tags: str = "AB") -> dict[str, str]:
    """n messages in batches of 32, tags cycling; returns UNIQ_KEY -> tag."""
    sent = {}
    async with AsyncProducer("PG", registry) as p:
        for start in range(0, n, 32):
            msgs = [Message(topic, str(i).encode(), tags=tags[i % len(tags)]) for i in range(start, min(n, start + 32))]
            r = await p.send_batch(msgs)
            sent.update(zip(r.msg_id.split(","), (m.tags for m in msgs)))
    return sent


async def create_topic(registry: str, topic: str, queues: int) -> None:
    async with AsyncAdmin(registry) as admin:
        await admin.create_topic(topic, queues)
        await async_wait_until(lambda: _routed(admin, topic), 10, 0.1, "route of the new topic")


async def _routed(admin: AsyncAdmin, topic: str) -> bool:
    try:
        return len((await admin.topic_route(topic)).subscribe_queues(topic)) > 0
    except Exception:
        return False


def test_push_ten_thousand_with_tag_filtering(real_cluster):
    topic, group = name("PUSH"), name("G")

    async def main():
        await create_topic(real_cluster.registry, topic, 4)
        got: dict[str, str] = {}
        c = AsyncPushConsumer(group, real_cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                              listener=lambda m: got.__setitem__(m.uniq_key, m.tags))
        c.subscribe(topic, "A || B")
        async with c:
            sent = await send_all(real_cluster.registry, topic, 10_000, "ABC")
            wanted = {k for k, t in sent.items() if t in "AB"}
            await async_wait_until(lambda: wanted <= got.keys(), 60, 0.1, "every A and B message")
            # C messages are filtered by the broker: the offsets still have to pass them all
            await async_wait_until(lambda: sum(c.offsets.memory_offset(mq) for mq in c.process_queues) == 10_000,
                                   30, 0.05, "offsets past all 10,000 messages")
        async with AsyncAdmin(real_cluster.registry) as admin:
            progress = await admin.consumer_progress(group, topic)
        return wanted, got, progress
    wanted, got, progress = arun(main())
    assert set(got) == wanted and set(got.values()) == {"A", "B"}
    assert progress.total_lag == 0 and len(progress.queues) == 4


def test_three_consumers_share_and_rebalance(real_cluster, tmp_path):
    topic, group = name("SHARE"), name("G")

    async def main():
        await create_topic(real_cluster.registry, topic, 6)
        consumers = [AsyncPushConsumer(group, real_cluster.registry, listener=lambda m: None, instance_name=f"c{i}")
                     for i in range(3)]
        for c in consumers:
            c.subscribe(topic)
            await c.start()

        def shares(cs):
            return sorted(len([q for q in c.process_queues if q.topic == topic]) for c in cs)
        await async_wait_until(lambda: shares(consumers) == [2, 2, 2], 30, 0.1, "an even 2/2/2 split")
        await consumers.pop().close()  # one leaves
        await async_wait_until(lambda: shares(consumers) == [3, 3], 30, 0.1, "3/3 after one left")
        # a consumer in another process joins, then dies (kill -9)
        proc = subprocess.Popen([sys.executable, "-m", "smartgo.cli", "consume", "-n", real_cluster.registry,
                                 "--topic", topic, "--group", group], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            await async_wait_until(lambda: shares(consumers) == [2, 2], 30, 0.1, "2/2/2 with the other process")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            await async_wait_until(lambda: shares(consumers) == [3, 3], 30, 0.1, "3/3 after the other one died")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            for c in consumers:
                await c.close()
    arun(main())


def test_broadcasting_delivers_everything_to_everyone(real_cluster, tmp_path):
    topic, group = name("BCAST"), name("G")

    async def main():
        await create_topic(real_cluster.registry, topic, 4)
        got = [set(), set()]
        consumers = [AsyncPushConsumer(group, real_cluster.registry, model=MessageModel.BROADCASTING,
                                       consume_from="CONSUME_FROM_FIRST_OFFSET", offset_store_dir=tmp_path,
                                       instance_name=f"b{i}", listener=lambda m, i=i: got[i].add(m.uniq_key))
                     for i in range(2)]
        for c in consumers:
            c.subscribe(topic)
            await c.start()
        sent = await send_all(real_cluster.registry, topic, 500)
        await async_wait_until(lambda: all(set(sent) <= g for g in got), 30, 0.1, "every message at both")
        for c in consumers:
            await c.close()
        return sent, got
    sent, got = arun(main())
    assert got[0] == got[1] == set(sent)


def test_orderly_consumption_in_order_per_key(real_cluster):
    topic, group = name("ORDERLY"), name("G")

    async def main():
        await create_topic(real_cluster.registry, topic, 4)
        seen: dict[str, list[int]] = {}
        busy: dict[int, int] = {}
        overlap = []
        lock = threading.Lock()

        def listener(m):
            with lock:
                busy[m.queue_id] = busy.get(m.queue_id, 0) + 1
                overlap.append(busy[m.queue_id])
            key, n = m.body.decode().split(":")
            seen.setdefault(key, []).append(int(n))
            with lock:
                busy[m.queue_id] -= 1
            return ConsumeResult.SUCCESS
        c = AsyncPushConsumer(group, real_cluster.registry, orderly=True, consume_threads=8, listener=listener,
                              consume_from="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe(topic)
        async with c:
            async with AsyncProducer("PG", real_cluster.registry) as p:
                for i in range(400):
                    key = f"k{i % 5}"
                    await p.send_orderly(Message(topic, f"{key}:{i}".encode()), key)
            await async_wait_until(lambda: sum(map(len, seen.values())) >= 400, 30, 0.1, "all 400")
        return seen, overlap
    seen, overlap = arun(main())
    assert all(v == sorted(v) and len(v) == 80 for v in seen.values()) and max(overlap) == 1


def test_listener_failing_once_gets_the_message_again(real_cluster):
    topic, group = name("RETRY"), name("G")

    async def main():
        await create_topic(real_cluster.registry, topic, 2)
        deliveries: dict[bytes, list[int]] = {}

        def listener(m):
            deliveries.setdefault(m.body, []).append(m.reconsume_times)
            if m.body == b"flaky" and len(deliveries[m.body]) == 1:
                raise RuntimeError("first attempt fails")
            return ConsumeResult.SUCCESS
        c = AsyncPushConsumer(group, real_cluster.registry, listener=listener, retry_delay_level=1,
                              consume_from="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe(topic)
        async with c:
            async with AsyncProducer("PG", real_cluster.registry) as p:
                await p.send(Message(topic, b"steady"))
                await p.send(Message(topic, b"flaky"))
            await async_wait_until(lambda: len(deliveries.get(b"flaky", [])) >= 2, 40, 0.1, "the second delivery")
        return deliveries
    deliveries = arun(main())
    assert deliveries[b"steady"] == [0]
    assert deliveries[b"flaky"][:2] == [0, 1]


def test_consumer_connections_admin(real_cluster):
    topic, group = name("CONN"), name("G")

    async def main():
        await create_topic(real_cluster.registry, topic, 2)
        c = AsyncPushConsumer(group, real_cluster.registry, listener=lambda m: None)
        c.subscribe(topic, "X || Y")
        async with c:
            async with AsyncAdmin(real_cluster.registry) as admin:
                conn = await admin.consumer_connections(group)
            return conn, c.client_id
    conn, cid = arun(main())
    assert cid in [x["clientId"] for x in conn["connectionSet"]]
    assert conn["messageModel"] == "CLUSTERING" and conn["subscriptionTable"][topic]["subString"] == "X || Y"


def test_sql92_push_and_pull_consumers_get_what_the_expression_selects(real_cluster):
    """MessageSelector.by_sql end to end: the broker evaluates the expression on each message's
    properties (the push consumer's registered subscription, the pull consumer's in each request)."""
    topic, group = name("SQL"), name("G")

    async def main():
        await create_topic(real_cluster.registry, topic, 2)
        got: list[bytes] = []
        c = AsyncPushConsumer(group, real_cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                              listener=lambda m: got.append(m.body))
        c.subscribe(topic, MessageSelector.by_sql("price > 50 AND region IN ('eu', 'us') AND TAGS <> 'skip'"))
        async with AsyncProducer("PG", real_cluster.registry) as p:
            for i in range(200):
                await p.send(Message(topic, b"%d" % i, tags="skip" if i % 10 == 0 else "keep",
                                     properties={"price": str(i % 100), "region": ("eu", "us", "cn")[i % 3]}))
        async with c:
            wanted = {b"%d" % i for i in range(200)
                      if i % 100 > 50 and i % 3 != 2 and i % 10 != 0}
            await async_wait_until(lambda: len(got) >= len(wanted), 30, 0.05, "the selected messages")
            await async_wait_until(lambda: sum(c.offsets.memory_offset(mq) for mq in c.process_queues) == 200,
                                   30, 0.05, "offsets past all 200 messages")
        async with AsyncPullConsumer(name("PC"), real_cluster.registry) as pc:
            pulled = []
            for q in await pc.fetch_queues(topic):
                r = await pc.pull(q, MessageSelector.by_sql("price < 3"), 0, 64)
                pulled += [m.body for m in r.messages]
        return wanted, got, pulled
    wanted, got, pulled = arun(main())
    assert sorted(got) == sorted(wanted)                            # each once, nothing else
    assert sorted(pulled) == sorted(b"%d" % i for i in range(200) if i % 100 < 3)


def test_reset_offset_replays_for_online_consumers_and_moves_an_offline_group(real_cluster):
    """admin.reset_offset_by_time: online, the broker tells the consumer (RESET_CONSUMER_CLIENT_OFFSET)
    and it consumes again from the first message stored at the time; offline, the offsets are
    committed directly and the group's next consumer starts there."""
    topic, group = name("RESET"), name("G")

    async def main():
        await create_topic(real_cluster.registry, topic, 2)
        async with AsyncProducer("PG", real_cluster.registry) as p:
            for i in range(20):
                await p.send(Message(topic, b"early-%d" % i))
            t0 = time.time() * 1000
            await async_wait_until(lambda: time.time() * 1000 > t0 + 2, message="a later millisecond")
            middle = int(time.time() * 1000)
            for i in range(20):
                await p.send(Message(topic, b"late-%d" % i))
        got: list[bytes] = []
        c = AsyncPushConsumer(group, real_cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                              listener=lambda m: got.append(m.body))
        c.subscribe(topic)
        async with AsyncAdmin(real_cluster.registry) as admin:
            async with c:
                await async_wait_until(lambda: len(got) >= 40, 30, 0.05, "the first delivery")

                async def committed() -> bool:      # the broker holds offsets for both queues
                    progress = await admin.consumer_progress(group, topic)
                    return len(progress.queues) == 2 and sum(q.consumer_offset for q in progress.queues) == 40
                await async_wait_until(committed, 30, 0.2, "offsets committed")
                assert await admin.topic_consumers(topic) == [group]
                first = len(got)
                moved = await admin.reset_offset_by_time(group, topic, middle)
                await async_wait_until(lambda: len(got) >= first + 20, 30, 0.05, "the replay")
                replay = got[first:]
            offline = await admin.reset_offset_by_time(group, topic, 0)
        again: list[bytes] = []
        c2 = AsyncPushConsumer(group, real_cluster.registry, listener=lambda m: again.append(m.body))
        c2.subscribe(topic)
        async with c2:
            await async_wait_until(lambda: len(again) >= 40, 30, 0.05, "everything again")
        return moved, replay, offline, again
    moved, replay, offline, again = arun(main())
    assert sum(moved.values()) == 20 and len(moved) == 2            # each queue at its first late message
    assert sorted(replay) == sorted(b"late-%d" % i for i in range(20))
    assert set(offline.values()) == {0}
    assert sorted(again) == sorted([b"early-%d" % i for i in range(20)] + [b"late-%d" % i for i in range(20)])


def test_topic_wide_pull_thresholds_are_shared_among_the_queues_held(real_cluster):
    """Java's pullThresholdForTopic / pullThresholdSizeForTopic: each queue held (the retry
    topic's too, as Java counts) may cache its share, so a stuck listener leaves at most that
    share plus one pull per queue in memory."""
    topic, group = name("TOPICFLOW"), name("G")
    release = threading.Event()

    async def main():
        await create_topic(real_cluster.registry, topic, 4)
        c = AsyncPushConsumer(group, real_cluster.registry, listener=lambda m: release.wait(30), consume_threads=1,
                              pull_batch_size=5, pull_threshold_for_topic=40, pull_threshold_size_for_topic_mb=8,
                              consume_from="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe(topic)
        async with c:
            try:
                await async_wait_until(lambda: len(c.process_queues) == 5, 20, 0.05, "the queues held")
                await send_all(real_cluster.registry, topic, 320)
                share = 40 // len(c.process_queues)
                mine = [pq for q, pq in c.process_queues.items() if q.topic == topic]
                await async_wait_until(lambda: all(pq.count >= share for pq in mine), 20, 0.05,
                                       "every queue at its share")
                cached = [pq.count for pq in mine]
                info = c.running_info()
            finally:
                release.set()
        return share, cached, info
    share, cached, info = arun(main())
    assert share == 8 and all(share <= n <= share + 4 for n in cached), cached     # 4 queues + the retry queue
    assert (info.properties["pullThresholdForQueue"], info.properties["pullThresholdSizeForQueue"],
            info.properties["pullThresholdForTopic"]) == (8, 1, 40)


def test_pull_interval_spaces_the_pulls_of_a_queue(real_cluster):
    topic, group = name("PULLGAP"), name("G")
    seen: list[float] = []

    async def main():
        await create_topic(real_cluster.registry, topic, 1)
        await send_all(real_cluster.registry, topic, 5)
        c = AsyncPushConsumer(group, real_cluster.registry, listener=lambda m: seen.append(time.monotonic()),
                              pull_batch_size=1, pull_interval=0.3, consume_from="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe(topic)
        async with c:
            await async_wait_until(lambda: len(seen) == 5, 20, 0.05, "the five messages")
            return c.running_info().properties["pullInterval"]
    interval_ms = arun(main())
    assert interval_ms == 300 and seen[-1] - seen[0] >= 4 * 0.3 - 0.05      # a pull of one every 0.3 s


def test_suspend_holds_pulls_and_listener_calls_until_resume(real_cluster):
    """DefaultMQPushConsumer.suspend/resume on the blocking consumer: messages a held pull brings in
    after suspend wait in the cache (an operator sees them there) and reach the listener only after
    resume."""
    topic, group = name("SUSPEND"), name("G")
    seen: list[bytes] = []
    held_consumed = threading.Event()

    def listener(m):
        seen.append(m.body)
        if m.body != b"before":
            held_consumed.set()
    arun(create_topic(real_cluster.registry, topic, 1))
    consumer = PushConsumer(group, real_cluster.registry, listener=listener, consume_from="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(topic)
    with consumer, Producer("PG", real_cluster.registry) as p, Admin(real_cluster.registry) as admin:
        p.send(Message(topic, b"before"))
        wait_until(lambda: seen == [b"before"], 20, 0.05, "the first message")
        consumer.suspend()
        p.send_batch([Message(topic, f"held-{i}".encode()) for i in range(3)])   # one arrival wakes the held pull

        def cached() -> int:
            info = admin.consumer_running_info(group, consumer.client_id)
            return sum(q["cachedMsgCount"] for mq, q in info.queues.items() if mq.topic == topic)
        wait_until(lambda: cached() == 3, 20, 0.1, "the held pull's messages in the cache")
        assert not held_consumed.wait(0.5)                    # suspended: none reaches the listener
        assert seen == [b"before"]
        consumer.resume()
        wait_until(lambda: len(seen) == 4, 20, 0.05, "the held messages after resume")
    assert seen[0] == b"before" and sorted(seen[1:]) == [b"held-0", b"held-1", b"held-2"]
