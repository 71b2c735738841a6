"""Scale-out, as 4.x's multi-master cluster: two broker groups (broker-a, broker-b, each a node of
its own) registered with one registry serve one topic. Producers spread their sends over both,
a consumer group's members share the queues of both, the admin calls see the whole cluster, and
when one group dies (kill -9 of its node) sends go on to the other and consumers read on; when
it comes back, sends and reads reach it again. A rolling restart fails no send, and a group an
operator takes out of writes is read empty and takes sends again."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter

import pytest

from tests.support.nodes import launch_node
from tests.support.broker import restart_broker, start_broker
from smartgo.client import AsyncAdmin, AsyncProducer, AsyncPushConsumer, Message, MessageQueue, NoRouteError
from tests.support.waits import async_wait_until

from .conftest import arun

pytestmark = pytest.mark.timeout(120)

TOPIC, GROUP, BROKERS = "Wide", "WideGroup", ("broker-a", "broker-b")
POLL = 2.0              # s between the clients' route polls (30 s by default, as Java's)


@pytest.fixture
def cluster(tmp_path):
    """A registry and the two groups' nodes: (registry address, {broker name: node}); the test
    may replace a node by its restart, which is reaped too."""
    registry_node = launch_node(tmp_path / "registry", {}, role="registry")
    nodes = {}
    try:
        for name in BROKERS:
            nodes[name] = start_broker(tmp_path / name, {"registry": f"127.0.0.1:{registry_node.port}",
                                                         "broker_name": name, "topics": f"{TOPIC}:4"})
        yield f"127.0.0.1:{registry_node.port}", nodes
    finally:
        for node in [*nodes.values(), registry_node]:
            node.reap()


def test_two_broker_groups_share_a_topic_and_outlive_one_of_them(cluster):
    arun(scale_out(*cluster))


async def scale_out(registry: str, nodes: dict) -> None:
    every_queue = {MessageQueue(TOPIC, b, q) for b in BROKERS for q in range(4)}
    async with AsyncAdmin(registry) as admin:
        async def routed() -> bool:
            route = await admin.topic_route(TOPIC)
            return set(route.subscribe_queues(TOPIC)) == every_queue
        await async_wait_until(routed, 30, 0.1, "both groups' queues in the topic's route")
        cluster = await admin.cluster_info()
        assert sorted(name for name, _ in cluster.masters()) == list(BROKERS)

    got: dict[str, str] = {}                       # UNIQ_KEY -> the broker it was read from
    listener = lambda m: got.__setitem__(m.uniq_key, m.broker_name)             # noqa: E731
    consumers = [AsyncPushConsumer(GROUP, registry, consume_from="CONSUME_FROM_FIRST_OFFSET", listener=listener,
                                   poll_registry_interval=POLL) for _ in range(2)]
    for c in consumers:
        c.subscribe(TOPIC, "*")
    async with consumers[0], consumers[1], AsyncProducer("WidePG", registry, poll_registry_interval=POLL) as producer:
        def shared() -> bool:
            held = [{mq for mq in c.process_queues if mq.topic == TOPIC} for c in consumers]   # not the retry topic
            return not held[0] & held[1] and held[0] | held[1] == every_queue and all(len(h) == 4 for h in held)
        await async_wait_until(shared, 60, 0.1, "the group's two members holding four queues each")

        before = [await producer.send(Message(TOPIC, b"%d" % i)) for i in range(200)]
        spread = Counter(r.queue.broker_name for r in before)
        assert set(spread) == set(BROKERS) and min(spread.values()) >= 60, spread
        await async_wait_until(lambda: {r.msg_id for r in before} <= got.keys(), 30, 0.05, "the first 200")
        assert Counter(got[r.msg_id] for r in before) == spread        # read from where they were stored
        async with AsyncAdmin(registry) as admin:
            progress = await admin.consumer_progress(GROUP, TOPIC)
            assert {q.queue for q in progress.queues} == every_queue
            await async_wait_until(lambda: _lag(admin), 30, 0.2, "the group's committed offsets on both groups")

        nodes["broker-b"].kill()                                   # kill -9: every process of the node
        after = [await producer.send(Message(TOPIC, b"after %d" % i)) for i in range(100)]
        assert {r.queue.broker_name for r in after} == {"broker-a"}
        await async_wait_until(lambda: {r.msg_id for r in after} <= got.keys(), 30, 0.05, "the 100 sent after the kill")

        nodes["broker-b"] = await asyncio.to_thread(restart_broker, nodes["broker-b"])    # on its store
        back: list = []

        async def reaches_b() -> bool:
            back.append(await producer.send(Message(TOPIC, b"back %d" % len(back))))
            return back[-1].queue.broker_name == "broker-b"
        await async_wait_until(reaches_b, 60, 0.05, "sends reaching the restarted broker-b")
        await async_wait_until(lambda: {r.msg_id for r in back} <= got.keys(), 60, 0.05, "those read too")
        assert got[back[-1].msg_id] == "broker-b"


async def _lag(admin: AsyncAdmin) -> bool:
    return (await admin.consumer_progress(GROUP, TOPIC)).total_lag == 0


def test_a_rolling_restart_fails_no_send_and_loses_no_message(cluster):
    """Each group in turn stopped (SIGTERM) and started again while a producer sends without a
    pause and a consumer reads: no send fails (a send to the stopping group is retried on the
    other one), every acknowledged message is read, those stored just before a stop too, and a
    restarted group's messages are read again within seconds."""
    registry, nodes = cluster
    arun(rolling_restart(registry, nodes))


def reader(registry: str, got: set[str]) -> AsyncPushConsumer:
    """A member of GROUP reading TOPIC from the start, noting each UNIQ_KEY in got."""
    consumer = AsyncPushConsumer(GROUP, registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                                 listener=lambda m: got.add(m.uniq_key), poll_registry_interval=POLL)
    consumer.subscribe(TOPIC, "*")
    return consumer


async def rolling_restart(registry: str, nodes: dict) -> None:
    got: set[str] = set()
    consumer = reader(registry, got)
    sent: list = []
    failed: list[str] = []
    stop = asyncio.Event()

    async def keep_sending(producer: AsyncProducer) -> None:
        while not stop.is_set():
            try:
                sent.append(await producer.send(Message(TOPIC, b"%d" % len(sent))))
            except Exception as exc:
                failed.append(repr(exc))

    async with consumer, AsyncProducer("RollingPG", registry, poll_registry_interval=POLL) as producer:
        sending = asyncio.get_running_loop().create_task(keep_sending(producer))
        try:
            for name in BROKERS:
                assert await asyncio.to_thread(nodes[name].stop) == 0                  # SIGTERM: a clean stop
                mark = len(sent)
                await async_wait_until(lambda: len(sent) > mark + 200, 30, 0.05, f"sends while {name} is down")
                nodes[name] = await asyncio.to_thread(restart_broker, nodes[name])
                # as an operator does: the next one only once this one takes sends again
                await async_wait_until(lambda: Counter(r.queue.broker_name for r in sent[-50:])[name] > 0, 30, 0.05,
                                       f"sends reaching {name} again")
                # and read from it again well within the 30 s between heartbeats: the consumer
                # heartbeats a broker that (re)appears in a route, or that says it does not know it
                stored = {r.msg_id for r in sent if r.queue.broker_name == name}
                await async_wait_until(lambda: stored <= got, 10, 0.05, f"what {name} stored, read")
        finally:
            stop.set()
            await sending
        assert failed == []
        await async_wait_until(lambda: {r.msg_id for r in sent} <= got, 15, 0.05, "every acknowledged message read")
    assert len(sent) > 600


def test_a_group_taken_out_of_writes_is_read_empty_and_takes_sends_again(cluster):
    """Maintenance as with mqadmin: `wipe-write-perm` at the registries, and producers send to the
    other group once they have re-read their routes while consumers read the wiped group's backlog;
    a topic it gets meanwhile is not written either; `add-write-perm` gives sends back. The
    broker's own side, `broker-config-update` of brokerPermission, does the same."""
    arun(maintenance(*cluster))


def admin_cli(registry: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "smartgo.cli", "admin", *args, "-n", registry, "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


async def maintenance(registry: str, nodes: dict) -> None:
    got: set[str] = set()
    sent: list = []
    addr_b = f"127.0.0.1:{nodes['broker-b'].port}"
    async with reader(registry, got), AsyncProducer("KeepPG", registry, poll_registry_interval=POLL) as producer, \
            AsyncAdmin(registry) as admin:
        async def landing_on(*names: str) -> bool:
            """Whether the next 40 sends land on exactly these groups."""
            batch = [await producer.send(Message(TOPIC, b"%d" % len(sent))) for _ in range(40)]
            sent.extend(batch)
            return {r.queue.broker_name for r in batch} == set(names)

        async def perm_of_a(topic: str) -> int | None:
            try:
                route = await admin.topic_route(topic)
            except NoRouteError:                        # not registered yet
                return None
            return next((q.perm for q in route.queue_datas if q.broker_name == "broker-a"), None)

        await async_wait_until(lambda: landing_on(*BROKERS), 30, 0, "sends reaching both groups")
        wiped = admin_cli(registry, "wipe-write-perm", "--broker-name", "broker-a")
        assert set(wiped["registries"]) == {registry} and wiped["registries"][registry] >= 1
        await async_wait_until(lambda: landing_on("broker-b"), 15, 0, "sends to broker-b alone")
        await async_wait_until(lambda: {r.msg_id for r in sent} <= got, 15, 0.05, "broker-a's backlog read too")
        await admin.create_topic("WideToo", 2, broker_addr=f"127.0.0.1:{nodes['broker-a'].port}")
        assert await async_wait_until(lambda: perm_of_a("WideToo"), 10, 0.1, "the new topic routed") == 4

        added = admin_cli(registry, "add-write-perm", "--broker-name", "broker-a")
        assert added["registries"][registry] > wiped["registries"][registry]          # WideToo too
        assert await perm_of_a(TOPIC) == await perm_of_a("WideToo") == 6
        await async_wait_until(lambda: landing_on(*BROKERS), 15, 0, "sends reaching broker-a again")

        admin_cli(registry, "broker-config-update", "--broker", addr_b, "--key", "brokerPermission", "--value", "4")
        await async_wait_until(lambda: landing_on("broker-a"), 15, 0, "sends to broker-a alone")
        assert (await admin.broker_config(addr_b))["broker_permission"] == "4"
        admin_cli(registry, "broker-config-update", "--broker", addr_b, "--key", "brokerPermission", "--value", "6")
        await async_wait_until(lambda: landing_on(*BROKERS), 15, 0, "sends reaching broker-b again")
        await async_wait_until(lambda: {r.msg_id for r in sent} <= got, 15, 0.05, "every message read")


def test_an_ordered_topic_names_its_groups_in_the_registries_and_producers_follow(cluster):
    """`topic-create --order`, as mqadmin updateTopic -o true: the registries' ORDER_TOPIC_CONFIG
    names the topic's groups and write queues (replaced for a cluster, merged for one broker), the
    route carries it, and a producer picks from exactly the queues it names; `kv-delete` drops it."""
    registry, nodes = cluster
    admin_cli(registry, "topic-create", "--topic", "Lined", "--queues", "2", "--order")
    assert admin_cli(registry, "kv-get", "--namespace", "ORDER_TOPIC_CONFIG", "--key", "Lined")["value"] == \
        "broker-a:2;broker-b:2"
    admin_cli(registry, "topic-update", "--topic", "Lined", "--queues", "3", "--order",
              "--broker", f"127.0.0.1:{nodes['broker-a'].port}")
    route = admin_cli(registry, "topic-route", "--topic", "Lined")
    assert route["orderTopicConf"] == "broker-a:3;broker-b:2"
    # the producer follows the config, not the queue data (kv-update: the operator's own hand)
    admin_cli(registry, "kv-update", "--namespace", "ORDER_TOPIC_CONFIG", "--key", "Lined", "--value",
              "broker-b:1;broker-a:1")
    arun(sends_follow(registry, {("broker-a", 0), ("broker-b", 0)}))
    assert admin_cli(registry, "kv-delete", "--namespace", "ORDER_TOPIC_CONFIG", "--key", "Lined")["registries"] == \
        [registry]
    assert "orderTopicConf" not in admin_cli(registry, "topic-route", "--topic", "Lined")


async def sends_follow(registry: str, queues: set[tuple[str, int]]) -> None:
    async with AsyncProducer("LinedPG", registry) as producer:
        picked = {(r.queue.broker_name, r.queue.queue_id) for r in
                  [await producer.send(Message("Lined", b"%d" % i)) for i in range(100)]}
    assert picked == queues
