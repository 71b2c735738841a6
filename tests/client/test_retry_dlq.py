"""Retry and dead letters end to end: a push consumer whose listener keeps failing gets the message
again with growing delays (CONSUMER_SEND_MSG_BACK -> schedule -> %RETRY%<group>), then it lands in
the group's DLQ; `smartgo admin dlq-list` shows it and `dlq-resend` brings it back."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

import pytest

from smartgo.client import AsyncAdmin, AsyncProducer, AsyncPushConsumer, ConsumeResult, Message
from tests.support.waits import async_wait_until

from .conftest import ROOT, RealCluster, arun

MAX_RECONSUME = 2          # deliveries: 1 + 2 retries, then the DLQ


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    # the delay levels a send-back with level 0 uses: 3 + reconsume times -> 1 s, 2 s (then the DLQ)
    with RealCluster(tmp_path_factory.mktemp("retry"), extra_args=("--message-delay-level", "1s 1s 1s 2s 3s")) as c:
        yield c


def smartgo(cluster: RealCluster, *argv: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "smartgo.cli", *argv, "-n", cluster.registry, "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(90)
def test_failing_listener_gets_retries_with_growing_delays_then_the_dlq_and_a_resend(cluster):
    topic, group = f"RT_{uuid.uuid4().hex[:8]}", f"G_{uuid.uuid4().hex[:8]}"
    deliveries: list[tuple[float, int, bytes]] = []        # (time, reconsume times, body)
    healed = {"on": False}

    def listener(m):
        deliveries.append((time.monotonic(), m.reconsume_times, m.body))
        return ConsumeResult.SUCCESS if healed["on"] else ConsumeResult.RECONSUME_LATER

    async def fail_until_dead() -> tuple[list, list]:
        async with AsyncAdmin(cluster.registry) as admin:
            await admin.create_topic(topic, 1)
            c = AsyncPushConsumer(group, cluster.registry, listener=listener, max_reconsume_times=MAX_RECONSUME,
                                  consume_from="CONSUME_FROM_FIRST_OFFSET")
            c.subscribe(topic)
            async with c:
                async with AsyncProducer("PG_RETRY", cluster.registry) as p:
                    await p.send(Message(topic, b"poison", tags="T1", keys="order-1"))
                await async_wait_until(lambda: len(deliveries) >= MAX_RECONSUME + 1, 30, 0.05, "every retry")
                dead = await async_wait_until(lambda: admin.dlq_messages(group), 15, 0.2, "the DLQ copy")
                return list(deliveries), dead
    seen, dead = arun(fail_until_dead())

    assert [(rt, body) for _, rt, body in seen] == [(0, b"poison"), (1, b"poison"), (2, b"poison")]
    gaps = [b[0] - a[0] for a, b in zip(seen, seen[1:])]
    assert 0.9 <= gaps[0] < gaps[1] and gaps[1] >= 1.9, gaps   # levels 3 and 4: 1 s then 2 s
    (m,) = dead
    assert (m.topic, m.body, m.tags, m.keys) == (f"%DLQ%{group}", b"poison", "T1", ["order-1"])
    assert m.properties["RETRY_TOPIC"] == topic and m.reconsume_times == MAX_RECONSUME + 1

    listed = smartgo(cluster, "admin", "dlq-list", "--group", group)
    assert [x["body"] for x in listed["messages"]] == ["poison"]
    healed["on"] = True
    deliveries.clear()

    async def consume_resent() -> None:
        c = AsyncPushConsumer(group, cluster.registry, listener=listener, max_reconsume_times=MAX_RECONSUME)
        c.subscribe(topic)
        async with c:
            resent = smartgo(cluster, "admin", "dlq-resend", "--group", group, "--id", m.msg_id)
            assert [(r["dlq_msg_id"], r["topic"]) for r in resent["resent"]] == [(m.msg_id, topic)]
            await async_wait_until(lambda: deliveries, 30, 0.05, "the resent message")
    arun(consume_resent())
    assert [(rt, body) for _, rt, body in deliveries] == [(0, b"poison")]    # a fresh message: counted from 0


@pytest.mark.timeout(90)
@pytest.mark.parametrize("model", ["CLUSTERING", "BROADCASTING"])
def test_a_listener_stuck_past_consume_timeout_no_longer_holds_its_queue_back(cluster, tmp_path, model):
    """Java's consumeTimeout: the stuck message is sent back (delay level 3: 1 s here) and comes
    again on another thread (broadcasting: dropped), the queue's commit moves past it, and the
    stuck call's late verdict is ignored."""
    topic, group = f"ST_{uuid.uuid4().hex[:8]}", f"G_{uuid.uuid4().hex[:8]}"
    deliveries: list[tuple[bytes, int]] = []
    release = threading.Event()

    def listener(m):
        deliveries.append((m.body, m.reconsume_times))
        if m.body == b"stuck" and m.reconsume_times == 0:
            release.wait(60)
            return ConsumeResult.RECONSUME_LATER       # a late verdict that would send it back again
        return ConsumeResult.SUCCESS

    async def main():
        async with AsyncAdmin(cluster.registry) as admin:
            await admin.create_topic(topic, 1)
        c = AsyncPushConsumer(group, cluster.registry, listener=listener, consume_threads=2, consume_timeout=1.0,
                              model=model, offset_store_dir=tmp_path, consume_from="CONSUME_FROM_FIRST_OFFSET",
                              persist_offset_interval=0.5)
        c.subscribe(topic)
        async with c:
            async with AsyncProducer("PG_STUCK", cluster.registry) as p:
                for body in (b"stuck", b"a", b"b"):
                    await p.send(Message(topic, body))
            mq = await async_wait_until(lambda: next((q for q in c.process_queues if q.topic == topic), None),
                                        20, 0.05, "the queue held")
            await async_wait_until(lambda: c.offsets.memory_offset(mq) == 3, 20, 0.05, "the commit past the stuck one")
            if model == "CLUSTERING":
                await async_wait_until(lambda: (b"stuck", 1) in deliveries, 20, 0.05, "the stuck message again")
            info = c.running_info()
            release.set()
            await async_wait_until(lambda: not c._expired and not c._runner.active, 20, 0.05, "the late verdict")
            late_send_backs = len(c._background)
        return info, late_send_backs
    info, late_send_backs = arun(main())
    again = [(b"stuck", 1)] if model == "CLUSTERING" else []
    assert sorted(deliveries) == sorted([(b"stuck", 0), (b"a", 0), (b"b", 0), *again])
    assert late_send_backs == 0 and info.properties["consumeTimeout"] == 0      # 1 s: 0 minutes, as Java counts
