"""The SDK's push consumer through a kill -9 of the whole node: the restarted node serves the
group's persisted members and subscriptions (smartgo.broker.managers.members), so the consumer's first
pulls are accepted at once - no SUBSCRIPTION_NOT_EXIST, no heartbeat needed first (the SDK would
heartbeat then and wait PULL_DELAY_ON_ERROR, 3 s, before pulling again) - and it reads every
message sent after the restart, the first well within the clients' 30 s between heartbeats."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from tests.support.nodes import Node
from smartgo.broker.managers.members import FILE
from tests.support.broker import restart_broker, start_broker
from smartgo.client import AsyncProducer, AsyncPushConsumer, Message
from tests.support.waits import async_wait_until

from .conftest import arun

TOPIC, GROUP = "Restarted", "RestartedGroup"
#: s from the restarted node answering to the consumer's first message: well below the 30 s between
#: heartbeats, generous for a loaded 2-CPU host (typically 1-3 s: a pull retried every 3 s after the
#: connection refusals of the outage).
RESUME_BOUND = 10.0


@pytest.mark.timeout(120)
def test_a_push_consumer_pulls_again_at_once_after_a_kill_of_the_whole_node(tmp_path, caplog):
    nodes = [start_broker(tmp_path / "node", {"topics": f"{TOPIC}:4"})]
    try:
        with caplog.at_level(logging.WARNING, "smartgo.client"):
            arun(ride_through(nodes, caplog))
    finally:
        for node in nodes:
            node.reap()


def members_file(node: Node) -> bytes:
    try:
        return (node.store / FILE).read_bytes()
    except FileNotFoundError:
        return b""


async def send(registry: str, n: int) -> list[str]:
    async with AsyncProducer("RestartedPG", registry) as producer:
        return [(await producer.send(Message(TOPIC, b"%d" % i))).msg_id for i in range(n)]


async def ride_through(nodes: list[Node], caplog: pytest.LogCaptureFixture) -> None:
    node = nodes[0]
    registry = f"127.0.0.1:{node.registry_port}"
    got: dict[str, float] = {}                      # UNIQ_KEY -> when the listener took it
    consumer = AsyncPushConsumer(GROUP, registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                                 listener=lambda m: got.setdefault(m.uniq_key, time.time()))
    consumer.subscribe(TOPIC, "*")
    async with consumer:
        before = await send(registry, 100)
        await async_wait_until(lambda: set(before) <= got.keys(), 30, 0.05, "the first 100 read")
        await async_wait_until(lambda: GROUP.encode() in members_file(node), 10, 0.05, "the members persisted")
        node.kill()
        node.reap()
        node = await asyncio.to_thread(restart_broker, node)
        nodes.append(node)
        answering = time.time()
        caplog.clear()
        after = await send(registry, 100)
        await async_wait_until(lambda: set(after) <= got.keys(), 60, 0.05, "the 100 sent after the restart read")
    refused = [r.getMessage() for r in caplog.records if "SUBSCRIPTION_NOT_EXIST" in r.getMessage()]
    assert refused == [], "the restarted node refused the consumer's pulls until it heartbeat again"
    first = min(got[m] for m in after) - answering
    assert first < RESUME_BOUND, f"the first message after the restart came {first:.1f}s after the node answered"
