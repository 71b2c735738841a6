"""Retry and dead letters end to end: a push consumer whose listener keeps failing gets the message
again with growing delays (CONSUMER_SEND_MSG_BACK -> schedule -> %RETRY%<group>), then it lands in
the group's DLQ; `smartgo admin dlq-list` shows it and `dlq-resend` brings it back."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from smartgo.client import AsyncAdmin, AsyncProducer, AsyncPushConsumer, ConsumeResult, Message
from smartgo.testing import async_wait_until

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
