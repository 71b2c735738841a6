"""Batch listeners (consume_batch_max_size, Java's consumeMessageBatchMaxSize) against a real
registry and broker: the batches' shape, partial acknowledgement (Java's ackIndex) in concurrent
and orderly consumption, broadcasting, the orderly DLQ, and direct consumption."""

from __future__ import annotations

import threading

import pytest

from smartgo.client import AsyncAdmin, AsyncLitePullConsumer, AsyncProducer, AsyncPushConsumer, ConsumeResult, Message
from smartgo.client.running_info import CMResult
from smartgo.store.record import MessageExt
from tests.support.waits import async_wait_until

from .conftest import arun
from .test_lite_pull_e2e import progress
from .test_push_e2e import create_topic, name, send_all

pytestmark = pytest.mark.timeout(120)


def test_batches_come_from_one_queue_in_offset_order_and_everything_once(real_cluster):
    topic, group = name("BATCH"), name("G")
    calls: list[list[tuple[int, int]]] = []           # per listener call: (queue id, queue offset) of each message
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            calls.append([(m.queue_id, m.queue_offset) for m in msgs])
        return ConsumeResult.SUCCESS

    async def main():
        await create_topic(real_cluster.registry, topic, 4)
        sent = await send_all(real_cluster.registry, topic, 200)
        c = AsyncPushConsumer(group, real_cluster.registry, listener=listener, consume_batch_max_size=8,
                              consume_from="CONSUME_FROM_FIRST_OFFSET", persist_offset_interval=0.5)
        c.subscribe(topic)
        async with c:
            await async_wait_until(lambda: sum(map(len, calls)) >= 200, 30, 0.05, "all 200 consumed")
            await async_wait_until(lambda: _committed_all(real_cluster.registry, group, topic, 200), 20, 0.2,
                                   "the offsets committed")
            info = c.running_info()
        return sent, info
    sent, info = arun(main())
    consumed = [item for call in calls for item in call]
    assert len(consumed) == len(set(consumed)) == len(sent) == 200
    assert all(1 <= len(call) <= 8 for call in calls) and max(map(len, calls)) == 8
    for call in calls:
        assert len({q for q, _ in call}) == 1                        # one queue a batch
        assert [o for _, o in call] == list(range(call[0][1], call[0][1] + len(call)))   # in offset order
    assert info.properties["consumeMessageBatchMaxSize"] == 8


async def _committed_all(registry: str, group: str, topic: str, n: int) -> bool:
    return sum((await progress(registry, group, topic)).values()) == n


def test_a_partly_acknowledged_batch_sends_the_rest_back_for_a_retry(real_cluster):
    """A coroutine batch listener acknowledges the first two of each first delivery; the rest
    come again through the retry topic, once, and everything ends committed."""
    topic, group = name("ACK"), name("G")
    deliveries: dict[bytes, list[int]] = {}
    first_calls: list[list[bytes]] = []

    async def listener(msgs):
        for m in msgs:
            deliveries.setdefault(m.body, []).append(m.reconsume_times)
        if msgs[0].reconsume_times == 0:
            first_calls.append([m.body for m in msgs])
            return 2
        return ConsumeResult.SUCCESS

    async def main():
        await create_topic(real_cluster.registry, topic, 1)
        await send_all(real_cluster.registry, topic, 20)
        c = AsyncPushConsumer(group, real_cluster.registry, listener=listener, consume_batch_max_size=5,
                              retry_delay_level=1, consume_from="CONSUME_FROM_FIRST_OFFSET",
                              persist_offset_interval=0.5)
        c.subscribe(topic)
        async with c:
            retried = lambda: sum(len(call[2:]) for call in first_calls)  # noqa: E731
            await async_wait_until(lambda: len(deliveries) == 20 and sum(map(len, deliveries.values())) ==
                                   20 + retried(), 30, 0.1, "the retried messages consumed again")
            await async_wait_until(lambda: _committed_all(real_cluster.registry, group, topic, 20), 20, 0.2,
                                   "the offsets committed")
    arun(main())
    assert sorted(b for call in first_calls for b in call) == sorted(deliveries)   # each delivered first in a batch
    assert any(len(call) > 2 for call in first_calls)
    for call in first_calls:
        assert all(deliveries[b] == [0] for b in call[:2])                  # acknowledged: once
        assert all(deliveries[b] == [0, 1] for b in call[2:])               # the rest: once more, as a retry


def test_broadcasting_drops_what_a_batch_did_not_acknowledge(real_cluster, tmp_path):
    topic, group = name("BCAST"), name("G")
    seen: list[bytes] = []

    def listener(msgs):
        seen.extend(m.body for m in msgs)
        return 0                                                  # none of them

    async def main():
        await create_topic(real_cluster.registry, topic, 2)
        sent = await send_all(real_cluster.registry, topic, 30)
        c = AsyncPushConsumer(group, real_cluster.registry, listener=listener, consume_batch_max_size=4,
                              model="BROADCASTING", offset_store_dir=tmp_path,
                              consume_from="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe(topic)
        async with c:
            await async_wait_until(lambda: len(seen) >= 30, 30, 0.05, "all 30 consumed")
            await async_wait_until(lambda: sum(max(c.offsets.memory_offset(mq), 0) for mq in c.process_queues) == 30,
                                   20, 0.05, "the local offsets past them all")
        return sent
    sent = arun(main())
    assert sorted(seen) == sorted(m.encode() for m in map(str, range(30))) and len(sent) == 30


def test_orderly_batches_keep_order_per_queue_and_retry_the_unacknowledged_rest_first(real_cluster):
    """One batch of each queue's first round is half acknowledged; its rest comes again, in order,
    before anything after it, so what was acknowledged is in order per key."""
    topic, group = name("OBATCH"), name("G")
    acked: dict[str, list[int]] = {}
    calls: list[list[tuple[int, int, int]]] = []          # (queue id, queue offset, reconsume times)
    failed_once: set[int] = set()
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            calls.append([(m.queue_id, m.queue_offset, m.reconsume_times) for m in msgs])
            keep = len(msgs)
            if len(msgs) >= 2 and msgs[0].queue_id not in failed_once:
                failed_once.add(msgs[0].queue_id)
                keep = len(msgs) // 2
            for m in msgs[:keep]:
                key, n = m.body.decode().split(":")
                acked.setdefault(key, []).append(int(n))
        return keep

    async def main():
        await create_topic(real_cluster.registry, topic, 2)
        async with AsyncProducer("PG", real_cluster.registry) as p:
            for i in range(120):
                key = f"k{i % 4}"
                await p.send_orderly(Message(topic, f"{key}:{i}".encode()), key)
        c = AsyncPushConsumer(group, real_cluster.registry, listener=listener, orderly=True, consume_threads=4,
                              consume_batch_max_size=6, suspend_current_queue_time=0.05,
                              consume_from="CONSUME_FROM_FIRST_OFFSET", persist_offset_interval=0.5)
        c.subscribe(topic)
        async with c:
            await async_wait_until(lambda: sum(map(len, acked.values())) >= 120, 30, 0.05, "all 120 acknowledged")
            await async_wait_until(lambda: _committed_all(real_cluster.registry, group, topic, 120), 20, 0.2,
                                   "the offsets committed")
    arun(main())
    assert all(v == sorted(v) and len(v) == 30 for v in acked.values())
    assert all(1 <= len(call) <= 6 and [o for _, o, _ in call] == sorted(o for _, o, _ in call) for call in calls)
    retries = [call for call in calls if call[0][2] == 1]
    assert len(retries) == len(failed_once) == 2                  # each queue's half batch, once
    for retry in retries:
        before = calls[:calls.index(retry)]
        failed = [c for c in before if c[0][0] == retry[0][0]][-1]   # the queue's previous call
        assert [o for _, o, _ in retry][:len(failed) - len(failed) // 2] == [o for _, o, _ in failed][len(failed) // 2:]


def test_orderly_messages_past_the_reconsume_limit_go_to_the_dlq_and_the_queue_moves_on(real_cluster):
    topic, group = name("ODLQ"), name("G")
    seen: list[tuple[bytes, int]] = []

    def listener(m):
        seen.append((m.body, m.reconsume_times))
        return m.body != b"poison"

    async def main():
        await create_topic(real_cluster.registry, topic, 1)
        async with AsyncProducer("PG", real_cluster.registry) as p:
            for body in (b"a", b"poison", b"b"):
                await p.send(Message(topic, body))
        c = AsyncPushConsumer(group, real_cluster.registry, listener=listener, orderly=True, max_reconsume_times=2,
                              suspend_current_queue_time=0.05, consume_from="CONSUME_FROM_FIRST_OFFSET",
                              persist_offset_interval=0.5)
        c.subscribe(topic)
        async with AsyncAdmin(real_cluster.registry) as admin, c:
            await async_wait_until(lambda: (b"b", 0) in seen, 30, 0.05, "the message after the poison")
            await async_wait_until(lambda: _committed_all(real_cluster.registry, group, topic, 3), 20, 0.2,
                                   "the offsets committed")
            dead = await async_wait_until(lambda: admin.dlq_messages(group), 15, 0.2, "the DLQ copy")
        return dead
    dead = arun(main())
    assert seen == [(b"a", 0), (b"poison", 0), (b"poison", 1), (b"poison", 2), (b"b", 0)]
    assert [m.body for m in dead] == [b"poison"]


def test_direct_consumption_hands_a_batch_listener_a_list_of_one():
    got: list[list[bytes]] = []

    def listener(msgs):
        got.append([m.body for m in msgs])
        return len(got) == 1                          # consumed the first time, not the second

    async def main():
        c = AsyncPushConsumer("G", "127.0.0.1:1", listener=listener, consume_batch_max_size=16)
        msg = MessageExt("T", 0, 0, 0, 0, 0, 0, ("127.0.0.1", 1), 0, ("127.0.0.1", 2), 0, 0, b"one", {}, msg_id="M1")
        return [await c.consume_message_directly(msg), await c.consume_message_directly(msg)]
    first, second = arun(main())
    assert got == [[b"one"], [b"one"]]
    assert (first[0], second[0]) == (CMResult.CR_SUCCESS, CMResult.CR_LATER)


@pytest.mark.parametrize("size", [0, 1025])
def test_a_batch_size_out_of_javas_bounds_is_refused(size):
    with pytest.raises(ValueError, match="between 1 and 1024"):
        AsyncPushConsumer("G", "127.0.0.1:1", listener=lambda msgs: None, consume_batch_max_size=size)
    with pytest.raises(ValueError, match="consume_timeout must be positive"):
        AsyncPushConsumer("G", "127.0.0.1:1", listener=lambda msgs: None, consume_timeout=0)


@pytest.mark.parametrize("option, value", [("pull_batch_size", 0), ("pull_batch_size", 1025), ("max_span", 0),
                                           ("pull_threshold_for_queue", 65536), ("pull_threshold_size_mb", 0),
                                           ("consume_threads", 1001), ("pull_interval", -1),
                                           ("pull_threshold_for_topic", 0), ("pull_threshold_size_for_topic_mb", 0)])
def test_settings_outside_javas_ranges_are_refused_with_the_range(option, value):
    """DefaultMQPushConsumerImpl.checkConfig's ranges: refused at construction, naming the range."""
    with pytest.raises(ValueError, match=rf"{option} out of range \["):
        AsyncPushConsumer("G", "127.0.0.1:1", listener=lambda m: None, **{option: value})
    with pytest.raises(ValueError, match="pull_batch_size out of range"):
        AsyncLitePullConsumer("G", "127.0.0.1:1", pull_batch_size=2000)
