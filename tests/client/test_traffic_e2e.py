"""The SDK's view of traffic, lag and clients through a real node (AsyncAdmin.traffic,
broker_stats, broker_consume_stats, consume_time_span, producer_connections, client_offsets,
query_consume_queue, clone_group_offset, system_topics) and the `smartgo admin` commands on top;
the SDK's consumers answer GET_CONSUMER_STATUS_FROM_CLIENT with the offsets they hold."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from tests.support.nodes import ROOT
from smartgo.client import AsyncAdmin, AsyncProducer, AsyncPullConsumer, AsyncPushConsumer, BrokerError, Message
from smartgo.client.message import MessageQueue
from smartgo.net.codes import ResponseCode
from tests.support.waits import async_wait_until

from .conftest import arun
from .test_consumer_status_e2e import committed
from .test_push_e2e import create_topic, name

pytestmark = pytest.mark.timeout(90)


def smartgo(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "smartgo.cli", "admin", *args, "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_traffic_lag_and_clients_of_a_topic(real_cluster):
    topic, group, producer_group, copy = name("TRAFFIC"), name("G"), name("PG"), name("COPY")
    got: list[bytes] = []

    async def main():
        await create_topic(real_cluster.registry, topic, 2)
        consumer = AsyncPushConsumer(group, real_cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                                     listener=lambda m: got.append(m.body))
        consumer.subscribe(topic)
        async with AsyncAdmin(real_cluster.registry) as admin, \
                AsyncProducer(producer_group, real_cluster.registry) as producer, consumer:
            for i in range(20):
                await producer.send(Message(topic, b"%d" % i))
            await async_wait_until(lambda: len(got) == 20, 30, 0.05, "20 messages consumed")
            addr = (await admin._topic_masters(topic))[0]

            async def counted():
                rows = await admin.traffic([topic])
                return len(rows) == 2 and all(r.day_sum == 20 for r in rows) and rows
            traffic = await async_wait_until(counted, 30, 0.5, "20 in and 20 out in the broker's stats")
            put = await admin.broker_stats(addr, "TOPIC_PUT_NUMS", topic)
            missing = await admin.broker_stats(addr, "TOPIC_PUT_NUMS", name("NOPE"))

            async def caught_up():
                return sum((await admin.client_offsets(group, topic)).get(consumer.client_id, {}).values()) == 20
            await async_wait_until(caught_up, 20, 0.2, "the consumer holds offsets up to 20")
            held = await admin.client_offsets(group, topic)
            await async_wait_until(lambda: committed(admin, group, topic, 20), 20, 0.2, "offsets committed")
            lag = await admin.broker_consume_stats(addr)
            ordered_only = await admin.broker_consume_stats(addr, order_only=True)
            spans = await admin.consume_time_span(topic, group)
            producers = await admin.producer_connections(producer_group, topic)
            cq = await admin.query_consume_queue(topic, 0, 0, 3, group)
            await admin.clone_group_offset(group, copy, topic)
            cloned = await admin.consumer_progress(copy, topic)
            system = await admin.system_topics(addr)
            reg = ("--registry", real_cluster.registry)        # in a thread: the consumer must answer meanwhile
            cli = {"stats": await asyncio.to_thread(smartgo, "stats-all", *reg, "--topic", topic),
                   "producers": await asyncio.to_thread(smartgo, "producer-connections", *reg,
                                                        "--group", producer_group, "--topic", topic),
                   "offsets": await asyncio.to_thread(smartgo, "client-offsets", *reg, "--group", group, "--topic", topic),
                   "lag": await asyncio.to_thread(smartgo, "broker-consume-stats", *reg, "--broker", addr)}
            return (consumer.client_id, producer.client_id, traffic, put, missing, held, lag, ordered_only, spans,
                    producers, cq, cloned, system, cli)
    (consumer_id, producer_id, traffic, put, missing, held, lag, ordered_only, spans, producers, cq, cloned, system,
     cli) = arun(main())
    (topic_in, group_out) = traffic
    assert (topic_in.topic, topic_in.group, group_out.group) == (topic, None, group)
    assert topic_in.tps > 0 and group_out.tps > 0
    assert put.minute.sum == 20 and put.minute.avgpt == 1.0 and missing is None
    mine = held[consumer_id]
    assert set(mine) == {MessageQueue(topic, "broker-a", 0), MessageQueue(topic, "broker-a", 1)}
    (stats,) = [s for s in lag.groups[group] if s.queues[0].queue.topic == topic]
    assert sum(q.consumer_offset for q in stats.queues) == 20 and stats.total_lag == 0
    assert all(s.queues[0].queue.topic != topic for s in ordered_only.groups.get(group, []))
    assert [s.queue.queue_id for s in spans] == [0, 1]
    assert all(0 < s.min_timestamp <= s.consume_timestamp == s.max_timestamp and s.delay_ms == 0 for s in spans)
    assert [(p["clientId"], p["language"]) for p in producers] == [(producer_id, "PYTHON")]
    assert cq["maxQueueIndex"] == mine[MessageQueue(topic, "broker-a", 0)] and len(cq["queueData"]) == 3
    assert cq["subscriptionData"]["topic"] == topic and cq["filterData"] == "null"
    assert sum(q.consumer_offset for q in cloned.queues) == 20
    assert {"TBW102", "SCHEDULE_TOPIC_XXXX", "DefaultCluster"} <= set(system)
    assert {r["group"]: r["day_sum"] for r in cli["stats"]["traffic"]} == {None: 20, group: 20, copy: 0}
    assert [c["clientId"] for c in cli["producers"]["connections"]] == [producer_id]
    assert sum(q["offset"] for q in cli["offsets"]["clients"][consumer_id]) == 20
    assert any(q["group"] == group and q["topic"] == topic for q in cli["lag"]["queues"])


def test_a_pull_consumer_reports_the_offsets_it_stored(real_cluster):
    topic, group = name("HELD"), name("PULLG")

    async def main():
        await create_topic(real_cluster.registry, topic, 1)
        async with AsyncAdmin(real_cluster.registry) as admin, AsyncPullConsumer(group, real_cluster.registry) as c:
            mq = MessageQueue(topic, "broker-a", 0)
            await c.update_consume_offset(mq, 3)
            await c.fetch_queues(topic)                     # the heartbeat that registers the group comes with it
            await async_wait_until(lambda: _online(admin, group), 20, 0.2, "the pull consumer registered")
            return c.client_id, await admin.client_offsets(group, topic, c.client_id)
    client_id, held = arun(main())
    assert held == {client_id: {MessageQueue(topic, "broker-a", 0): 3}}


async def _online(admin: AsyncAdmin, group: str) -> bool:
    try:
        return bool((await admin.consumer_connections(group)).get("connectionSet"))
    except Exception:
        return False


def test_an_idle_producer_is_known_to_the_brokers_from_its_start(real_cluster):
    """As Java's producers are (through TBW102's route): listed by producer-connections before it
    sends anything, and gone from the list once closed."""
    topic, group = name("IDLE"), name("PG_IDLE")

    async def main():
        await create_topic(real_cluster.registry, topic, 1)
        async with AsyncAdmin(real_cluster.registry) as admin:
            async def listed() -> list[str]:
                try:
                    return [c["clientId"] for c in await admin.producer_connections(group, topic)]
                except BrokerError as exc:      # "the producer group[...] not exist"
                    assert exc.code == ResponseCode.SYSTEM_ERROR, exc
                    return []

            async def gone() -> bool:
                return not await listed()
            async with AsyncProducer(group, real_cluster.registry) as producer:
                ids = await async_wait_until(listed, 10, 0.05, "the idle producer listed")
            await async_wait_until(gone, 10, 0.05, "the closed producer gone")
            return producer.client_id, ids
    client_id, ids = arun(main())
    assert ids == [client_id]


def test_admin_commands_print_tables(real_cluster):
    """The commands' text output: each one's header or verdict (their --json forms are above)."""
    topic, group = name("TEXT"), name("G")

    async def main():
        await create_topic(real_cluster.registry, topic, 1)
        async with AsyncAdmin(real_cluster.registry) as admin, AsyncProducer(name("PG"), real_cluster.registry) as p:
            await p.send(Message(topic, b"x"))
            return (await admin._topic_masters(topic))[0]
    addr = arun(main())
    reg = ("--registry", real_cluster.registry)

    def text(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "smartgo.cli", "admin", *args, *reg], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout
    assert "has not counted TOPIC_PUT_NUMS NoSuchTopic" in text("broker-stats", "--broker", addr, "--name",
                                                                "TOPIC_PUT_NUMS", "--key", "NoSuchTopic")
    assert "DELAY MS" in text("consume-time-span", "--group", group, "--topic", topic)
    assert "COMMITLOG OFFSET" in text("query-cq", "--topic", topic, "--queue", "0", "--index", "0")
    assert f"Index 5 of 0@{topic} is not exist!" in text("query-cq", "--topic", topic, "--queue", "0", "--index", "5")
    dest = name("D")
    assert f"offsets of {group} cloned to {dest} on {addr}" in text("clone-offset", "--src", group, "--dest", dest,
                                                                     "--topic", topic)
    assert "SCHEDULE_TOPIC_XXXX" in text("system-topics", "--broker", addr).split()
