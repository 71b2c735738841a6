"""The RocketMQ C++ client (rocketmq-client-cpp 1.2 through PyPI `rocketmq` 0.4.4) against SmartGo.

Its wire habits differ from Java's and ali-ons': it sends with code 10 and V1 header names, marks
a batch with the header field batch="1" on code 10 (not code 320), writes the heartbeat's enums
as ordinals, compresses bodies over 4 KiB, and retries by CONSUMER_SEND_MSG_BACK. Each test runs
tests/compat/cpp_client.py in a process of its own (see conftest.cpp).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

import pytest

from tests.support.broker import committed_total, restart_broker, start_broker
from smartgo.client import AsyncAdmin, AsyncPullConsumer, MessageQueue
from smartgo.client.message import Prop
from tests.support.waits import wait_until

from .conftest import arun, cpp, create_topic, python_read, python_send, topic_name

pytestmark = pytest.mark.timeout(120)


def by_idx(messages: list) -> dict[int, object]:
    return {int(m.properties["idx"]): m for m in messages}


def push_with_admin_job(cluster, cpp_home, topic: str, group: str, committed: int,
                        job: Callable[[AsyncAdmin], Awaitable[None]], **push: object) -> list:
    """What the C++ push consumer takes (a push op with `push`'s settings), while a thread runs job
    with an admin once the group has committed `committed` messages of the topic's 2 queues."""
    def run() -> None:
        wait_until(lambda: committed_total(cluster.broker, topic, group, 2) == committed, timeout=60,
                   message=f"the C++ consumer's offsets committed ({committed})")

        async def main() -> None:
            async with AsyncAdmin(cluster.registry) as admin:
                await job(admin)
        arun(main())
    thread = threading.Thread(target=run)
    thread.start()
    try:
        (got,) = cpp(cpp_home, cluster.registry, [{"op": "push", "topic": topic, "group": group, **push}],
                     timeout=float(push["timeoutS"]) + 30)                  # type: ignore[arg-type]
    finally:
        thread.join(70)
    return got


def test_every_send_mode_is_stored_as_sent(cluster, cpp_home):
    """sync (auto-created topic), a compressed 10 kB body, oneway, orderly, a batch, and async
    sends with a non-ASCII tag (filtered by its Java hash, over UTF-16)."""
    topic = topic_name("CppSend")
    sync, big, _oneway, orderly, batch, later = cpp(cpp_home, cluster.registry, [
        {"op": "send", "topic": topic, "n": 6, "tags": ["TagA", "TagB"]},
        {"op": "send", "topic": topic, "n": 2, "bodySize": 10_000, "tags": ["Big"]},
        {"op": "send", "topic": topic, "n": 3, "mode": "oneway", "tags": ["Oneway"]},
        {"op": "send", "topic": topic, "n": 4, "mode": "orderly", "arg": 2, "tags": ["Ordered"]},
        {"op": "send", "topic": topic, "n": 5, "mode": "batch", "tags": ["Batched"]},
        {"op": "send", "topic": topic, "n": 4, "mode": "async", "tags": ["Äsync"]}])
    assert all(r.get("status") == 0 for r in sync + big + orderly + batch + later), later
    got = wait_until(lambda: (m := python_read(cluster, topic)) and len(m) == 24 and m, timeout=20,
                     message="24 messages")
    tagged = {t: [m for m in got if m.tags == t]
              for t in ("TagA", "TagB", "Big", "Oneway", "Ordered", "Batched", "Äsync")}
    assert [len(v) for v in tagged.values()] == [3, 3, 2, 3, 4, 5, 4]
    assert sorted(m.uniq_key for m in python_read(cluster, topic, "Äsync")) == sorted(r["msgId"] for r in later)
    for m in got:
        idx = int(m.properties["idx"])
        assert m.keys == [f"cpp-key-{idx}"]
        if m.tags == "Big":
            assert m.body == (f"cpp-{idx}-" * 2000)[:10_000].encode()       # inflated by our consumer
        else:
            assert m.body == f"cpp-{idx}".encode()
    sent = by_idx(tagged["TagA"] + tagged["TagB"])
    for i, r in enumerate(sync):                                           # SendResult: the uniq id, queue offset
        assert (r["msgId"], r["offset"]) == (sent[i].properties[Prop.UNIQ_KEY], sent[i].queue_offset)
    ordered = tagged["Ordered"]
    assert {m.queue_id for m in ordered} == {2}                            # the selector's queue, in send order
    assert [int(m.properties["idx"]) for m in sorted(ordered, key=lambda m: m.queue_offset)] == [0, 1, 2, 3]
    batched = sorted(tagged["Batched"], key=lambda m: m.queue_offset)      # one message each, not one blob
    assert [int(m.properties["idx"]) for m in batched] == [0, 1, 2, 3, 4]
    assert len({m.queue_id for m in batched}) == 1
    assert [m.queue_offset for m in batched] == list(range(batched[0].queue_offset, batched[0].queue_offset + 5))


def test_delayed_send_arrives_after_its_level_and_a_timer_at_its_time(cluster, cpp_home):
    """Two sends at delay level 1, and two timer messages (5.x's TIMER_DELAY_MS, set as a property:
    the 1.2 wrapper predates 5.x's setter)."""
    topic = topic_name("CppDelay")
    levels, timers = cpp(cpp_home, cluster.registry, [
        {"op": "send", "topic": topic, "n": 2, "delayLevel": 1, "tags": ["Level"]},
        {"op": "send", "topic": topic, "n": 2, "properties": {"TIMER_DELAY_MS": "1500"}, "tags": ["Timer"]}])
    assert [r["status"] for r in levels + timers] == [0, 0, 0, 0]
    got = wait_until(lambda: (m := python_read(cluster, topic)) and len(m) == 4 and m, timeout=20,
                     message="the delayed messages")
    for m in got:                                                          # level 1 = 1 s, stored again when due
        assert m.properties["REAL_TOPIC"] == topic and "DELAY" not in m.properties     # as Java's messageTimeup
        if m.tags == "Level":
            assert m.store_timestamp - m.born_timestamp >= 1000, (m.store_timestamp, m.born_timestamp)
        else:
            assert m.store_timestamp >= int(m.properties["TIMER_OUT_MS"]) >= m.born_timestamp + 1500
    assert sorted(m.tags for m in got) == ["Level", "Level", "Timer", "Timer"]


def test_push_consumer_filters_by_tag_and_commits_offsets(cluster, cpp_home):
    topic, group = topic_name("CppPush"), topic_name("CG_CPP_PUSH")
    python_send(cluster, topic, 9)                                         # tags A, B, C in turn
    (got,) = cpp(cpp_home, cluster.registry, [
        {"op": "push", "topic": topic, "group": group, "expression": "A || B", "expect": 6, "settleS": 1.0}])
    assert sorted(int(m["idx"]) for m in got) == [0, 1, 3, 4, 6, 7]       # no C, nothing twice
    assert all(m["body"] == f"py-{m['idx']}" and m["tags"] in "AB" for m in got)

    async def offsets():
        async with AsyncPullConsumer(group, cluster.registry) as pc:
            qs = await pc.fetch_queues(topic)
            return ({q.queue_id: await pc.fetch_consume_offset(MessageQueue(topic, q.broker_name, q.queue_id))
                     for q in qs}, {q.queue_id: await pc.max_offset(q) for q in qs})
    # committed: past the last message it consumed in each queue (a C at a queue's end is
    # stepped over only when a pull there says NO_NEW_MSG, as with Java's client)
    last = {}
    for m in got:
        last[m["queueId"]] = max(last.get(m["queueId"], -1), m["queueOffset"])
    wait_until(lambda: all((o := arun(offsets()))[0][q] in (last[q] + 1, o[1][q]) for q in last), timeout=20,
               message="the consumer's committed offsets past what it consumed")


def test_orderly_push_consumer_locks_and_reads_in_order(cluster, cpp_home):
    topic, group = topic_name("CppOrderly"), topic_name("CG_CPP_ORDERLY")
    _, got = cpp(cpp_home, cluster.registry, [
        {"op": "send", "topic": topic, "n": 8, "mode": "orderly", "arg": 1},
        {"op": "push", "topic": topic, "group": group, "orderly": True, "expect": 8}])
    assert [int(m["idx"]) for m in got] == list(range(8))                 # LOCK_BATCH_MQ, then in queue order
    assert {m["queueId"] for m in got} == {1}


def test_failed_consumption_comes_back_through_the_retry_topic(cluster, cpp_home):
    topic, group = topic_name("CppRetry"), topic_name("CG_CPP_RETRY")
    python_send(cluster, topic, 4)
    (got,) = cpp(cpp_home, cluster.registry, [
        {"op": "push", "topic": topic, "group": group, "expect": 4, "failFirst": 1, "timeoutS": 60}])
    assert sorted(int(m["idx"]) for m in got) == [0, 1, 2, 3]
    again = [m for m in got if m["reconsumeTimes"] > 0]
    assert again and all(m["reconsumeTimes"] == 1 for m in again)      # sent back (level 3: 3 s here), then retried
    assert all(m["topic"] == topic for m in got)                        # the real topic, restored from RETRY_TOPIC


def test_broadcasting_consumer_gets_what_is_sent_after_it_starts(cluster, cpp_home):
    topic, group = topic_name("CppBroadcast"), topic_name("CG_CPP_BROADCAST")
    (got,) = cpp(cpp_home, cluster.registry, [
        {"op": "push", "topic": topic, "group": group, "model": "BROADCASTING", "expect": 5,
         "sendAfterStart": {"topic": topic, "n": 5, "tags": ["After"]}}])
    assert sorted(int(m["idx"]) for m in got) == [0, 1, 2, 3, 4]
    assert all(m["tags"] == "After" for m in got)


def test_pull_consumer_reads_python_messages_and_compressed_bodies(cluster, cpp_home):
    topic = topic_name("CppPull")
    sent = python_send(cluster, topic, 8, big_every=4)                    # 0 and 4: ~6 kB, compressed on the wire
    wait_until(lambda: len(python_read(cluster, topic)) == 8, timeout=20, message="8 messages dispatched")
    (got,) = cpp(cpp_home, cluster.registry, [{"op": "pull", "topic": topic, "group": topic_name("CG_CPP_PULL")}])
    bodies = {int(m["idx"]): m["body"].encode("latin-1") for m in got}
    assert bodies == {i: msg.body for i, (msg, _) in enumerate(sent)}
    assert {m["msgId"] for m in got} == {r.msg_id for _, r in sent}


@pytest.mark.timeout(180)
def test_producer_and_push_consumer_ride_through_a_kill_of_the_whole_node(cpp_home, tmp_path):
    """kill -9 of the node between two rounds of sync sends: every acknowledged message reaches the
    C++ push consumer, which reconnects by itself, and none twice."""
    node = start_broker(tmp_path / "node", {"topics": "CppSurvivor:4"})
    try:
        registry = f"127.0.0.1:{node.registry_port}"
        consumed: list = []
        consumer = threading.Thread(target=lambda: consumed.extend(cpp(cpp_home, registry, [
            {"op": "push", "topic": "CppSurvivor", "group": "CG_CPP_SURVIVOR", "expect": 600, "timeoutS": 120,
             "settleS": 1}], timeout=170)[0]))
        consumer.start()
        sent = cpp(cpp_home, registry, [{"op": "send", "topic": "CppSurvivor", "n": 300}])[0]
        node.kill()
        node.reap()
        node = restart_broker(node)
        sent += cpp(cpp_home, registry, [{"op": "send", "topic": "CppSurvivor", "n": 300}])[0]
        consumer.join(175)
        assert all(r["status"] == 0 for r in sent) and len(sent) == 600
        assert sorted(m["msgId"] for m in consumed) == sorted(r["msgId"] for r in sent)   # all, once each (uniq ids)
    finally:
        node.reap()


def test_push_consumer_reads_on_from_the_slave_after_the_master_is_killed(cpp_home, tmp_path):
    """A standalone registry, a master and its slave. The C++ consumer group reads the first
    round from the master; after a second round the master is killed (-9), and the group reads
    exactly the second round from the slave (its offsets came with SlaveSynchronize)."""
    from tests.support.nodes import launch_node
    from tests.support.broker import start_slave
    registry_node = launch_node(tmp_path / "registry", {}, role="registry")
    nodes = [registry_node]
    try:
        registry = f"127.0.0.1:{registry_node.port}"
        master = start_broker(tmp_path / "master", {"topics": "CppFailover:4", "registry": registry})
        nodes.append(master)
        slave = start_slave(tmp_path / "slave", master, {"registry": registry})
        nodes.append(slave)
        push = {"op": "push", "topic": "CppFailover", "group": "CG_CPP_FAILOVER", "expect": 100, "timeoutS": 60,
                "settleS": 1}
        first_sent = cpp(cpp_home, registry, [{"op": "send", "topic": "CppFailover", "n": 100}])[0]
        first = cpp(cpp_home, registry, [push])[0]
        second_sent = cpp(cpp_home, registry, [{"op": "send", "topic": "CppFailover", "n": 100}])[0]
        wait_until(lambda: slave.health()["fields"]["commitlog.written"] == master.health()["fields"][
            "commitlog.written"], timeout=20, message="the slave to catch up")
        wait_until(lambda: committed_total(f"127.0.0.1:{slave.port}", "CppFailover", "CG_CPP_FAILOVER", 4) == 100,
                   timeout=20, message="the group's offsets on the slave")
        master.kill()
        second = cpp(cpp_home, registry, [push], timeout=120)[0]
        assert sorted(m["msgId"] for m in first) == sorted(r["msgId"] for r in first_sent)
        assert sorted(m["msgId"] for m in second) == sorted(r["msgId"] for r in second_sent)
    finally:
        for node in nodes:
            node.reap()


def test_push_consumer_consumes_again_after_an_offset_reset(cluster, cpp_home):
    """An admin reset to time 0 while the C++ consumer runs: the broker sends it
    RESET_CONSUMER_CLIENT_OFFSET in the list form the C++ client reads (4.x would send the map form
    to a Java mqadmin's reset), and the consumer delivers every message a second time."""
    topic, group = topic_name("CppReset"), topic_name("CG_CPP_RESET")
    create_topic(cluster, topic, queues=2)
    sent = python_send(cluster, topic, 20)
    moved: dict = {}

    async def reset(admin) -> None:
        moved.update(await admin.reset_offset_by_time(group, topic, 0))
    got = push_with_admin_job(cluster, cpp_home, topic, group, 20, reset, expect=40, timeoutS=80, settleS=1.0)
    assert sorted(moved.values()) == [0, 0]
    ids = [m["msgId"] for m in got]
    assert sorted(ids) == sorted([r.msg_id for _, r in sent] * 2)       # every message exactly twice


def test_running_info_of_a_cpp_push_consumer_comes_back_through_the_broker(cluster, cpp_home):
    """GET_CONSUMER_RUNNING_INFO relayed to the C++ consumer (as the dashboard's client view asks):
    its own ConsumerRunningInfo, which the SDK's admin reads (queue-keyed mqTable and all)."""
    topic, group = topic_name("CppStatus"), topic_name("CG_CPP_STATUS")
    create_topic(cluster, topic, queues=2)
    python_send(cluster, topic, 10)
    asked: dict = {}

    async def ask(admin) -> None:
        (conn,) = (await admin.consumer_connections(group))["connectionSet"]
        asked["conn"] = conn
        asked["info"] = await admin.consumer_running_info(group, conn["clientId"])
    got = push_with_admin_job(cluster, cpp_home, topic, group, 10, ask, expect=10, timeoutS=60, settleS=8.0)
    assert len(got) == 10 and asked["conn"]["language"] == "CPP"
    info = asked["info"]
    assert info.properties["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY", info.properties
    assert topic in {s["topic"] for s in info.subscriptions}
    held = {mq.queue_id: q for mq, q in info.queues.items() if mq.topic == topic}
    assert sorted(held) == [0, 1] and sum(q["commitOffset"] for q in held.values()) == 10, held
    assert all(q["lastPullTimestamp"] > 0 for q in held.values())          # its string longs read as numbers
