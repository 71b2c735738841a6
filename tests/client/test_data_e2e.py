"""End to end against real processes, data path only (broker issue 6): producer sends of every
kind, pull consumption with tag filtering, ordered sends, auto-creation, queries, the CLI.
Nothing here needs the broker's control plane (heartbeats, groups, offsets)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from smartgo.client import AsyncAdmin, AsyncProducer, AsyncPullConsumer, Message, PullStatus, SendStatus
from tests.support.waits import async_wait_until

from .conftest import ROOT, arun

pytestmark = pytest.mark.timeout(90)


async def drain(pc: AsyncPullConsumer, topic: str, expression: str = "*") -> list:
    out = []
    for q in await pc.fetch_queues(topic):
        offset = await pc.min_offset(q)
        while True:
            r = await pc.pull(q, expression, offset, 32)
            if r.status is PullStatus.NO_NEW_MSG:
                break
            out += r.messages
            offset = r.next_begin_offset
    return out


async def drain_all(pc: AsyncPullConsumer, topic: str, expected: int, expression: str = "*") -> list:
    """drain() once at least `expected` messages are there: a pull sees a message once dispatch has
    indexed it, which may trail the send's answer on a loaded machine."""
    async def enough() -> list | None:
        got = await drain(pc, topic, expression)
        return got if len(got) >= expected else None
    return await async_wait_until(enough, 20, 0.05, f"{expected} messages of {topic} dispatched")


def test_ten_thousand_with_tag_filtering(real_cluster):
    topic = "E2E_" + uuid.uuid4().hex[:8]

    async def main():
        async with AsyncProducer("PG", real_cluster.registry) as p:
            first = await p.send(Message(topic, b"create", tags="C"))  # auto-created through TBW102
            assert first.status is SendStatus.SEND_OK
            sent = {}
            batch = []
            for i in range(10_000):
                tag = "ABC"[i % 3]
                msg = Message(topic, f"{i}".encode(), tags=tag, keys=f"key-{i}")
                if i % 4 == 0:
                    r = await p.send(msg)
                    sent[r.msg_id] = (i, tag)
                elif i % 4 == 1:
                    batch.append((i, tag, msg))
                    if len(batch) == 32:
                        r = await p.send_batch([m for _, _, m in batch])
                        sent.update(zip(r.msg_id.split(","), [(j, t) for j, t, _ in batch]))
                        batch = []
                else:
                    fut = p.send_async(msg)
                    sent[(await fut).msg_id] = (i, tag)
            if batch:
                r = await p.send_batch([m for _, _, m in batch])
                sent.update(zip(r.msg_id.split(","), [(j, t) for j, t, _ in batch]))
        async with AsyncPullConsumer("E2E_PULL", real_cluster.registry) as pc:
            got = await drain_all(pc, topic, sum(tag in "AB" for _, tag in sent.values()), "A || B")
        return sent, got
    sent, got = arun(main())
    wanted = {uid for uid, (_, tag) in sent.items() if tag in "AB"}
    ids = [m.uniq_key for m in got]
    assert len(ids) == len(set(ids)), "duplicates"
    assert set(ids) == wanted  # none lost, none foreign
    assert all(m.tags in ("A", "B") and int(m.body) == sent[m.uniq_key][0] for m in got)


def test_ordered_per_key_and_compression(real_cluster):
    topic = "E2E_ORDER_" + uuid.uuid4().hex[:8]

    async def main():
        async with AsyncProducer("PG", real_cluster.registry) as p:
            await p.send(Message(topic, b"create"))
            for i in range(300):
                key = f"order-{i % 7}"
                await p.send_orderly(Message(topic, f"{key}:{i}".encode(), tags="O"), key)
            big = await p.send(Message(topic, b"z" * 100_000, tags="BIG"))
        async with AsyncPullConsumer("E2E_PULL", real_cluster.registry) as pc:
            return big, await drain_all(pc, topic, 301, "O || BIG")
    big, got = arun(main())
    per_key: dict[str, list[int]] = {}
    queue_of: dict[str, set] = {}
    for m in sorted(got, key=lambda m: (m.queue_id, m.queue_offset)):
        if m.tags == "BIG":
            assert m.body == b"z" * 100_000 and m.uniq_key == big.msg_id
            continue
        key, n = m.body.decode().split(":")
        per_key.setdefault(key, []).append(int(n))
        queue_of.setdefault(key, set()).add(m.queue_id)
    assert all(v == sorted(v) for v in per_key.values()) and sum(map(len, per_key.values())) == 300
    assert all(len(q) == 1 for q in queue_of.values())


def test_a_batch_to_a_chosen_queue_lands_there_in_order(real_cluster):
    """send_batch(msgs, queue=mq), Java's send(Collection<Message>, MessageQueue): every batch to the
    queue asked for, consecutive offsets, in the order sent."""
    topic = "E2E_BATCHQ_" + uuid.uuid4().hex[:8]

    async def main():
        async with AsyncProducer("PG", real_cluster.registry) as p:
            await p.send(Message(topic, b"create"))
            queue = sorted(await p.fetch_publish_queues(topic))[-1]
            results = [await p.send_batch([Message(topic, f"{b}-{i}".encode()) for i in range(5)], queue=queue)
                       for b in range(3)]
        async with AsyncPullConsumer("E2E_PULL", real_cluster.registry) as pc:
            return queue, results, [m for m in await drain_all(pc, topic, 16) if m.body != b"create"]
    queue, results, got = arun(main())
    assert {r.queue for r in results} == {queue} and [r.queue_offset for r in results] == [
        results[0].queue_offset + 5 * b for b in range(3)]
    assert {m.queue_id for m in got} == {queue.queue_id}
    assert [m.body for m in sorted(got, key=lambda m: m.queue_offset)] == [
        f"{b}-{i}".encode() for b in range(3) for i in range(5)]


def test_queries(real_cluster):
    topic = "E2E_QUERY_" + uuid.uuid4().hex[:8]

    async def main():
        async with AsyncProducer("PG", real_cluster.registry) as p:
            r = await p.send(Message(topic, b"find me", tags="Q", keys=["order-42", "user-7"]))
        async with AsyncAdmin(real_cluster.registry) as admin:
            # the dispatch actor builds the index asynchronously: poll with a deadline
            by_key = await async_wait_until(lambda: admin.query_by_key(topic, "user-7"), timeout=10,
                                            message="the key to be indexed")
            by_uniq = await admin.query_by_id(r.msg_id, topic)
            by_offset_id = await admin.query_by_id(r.offset_msg_id)
            by_position = await admin.query_by_offset(topic, r.queue.queue_id, r.queue_offset)
            route = await admin.topic_route(topic)
        return r, by_key, by_uniq, by_offset_id, by_position, route
    r, by_key, by_uniq, by_offset_id, by_position, route = arun(main())
    for found in (by_key, by_uniq, by_offset_id, [by_position]):
        assert [m.body for m in found] == [b"find me"] and found[0].uniq_key == r.msg_id
    assert by_offset_id[0].msg_id == r.offset_msg_id
    assert route.broker_datas[0].master_addr == real_cluster.broker


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "smartgo.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_cli_json_against_a_real_broker(real_cluster):
    topic = "E2E_CLI_" + uuid.uuid4().hex[:8]
    reg = ["-n", real_cluster.registry, "--json"]
    sent = cli("send", *reg, "--topic", topic, "--body", "via cli", "--tags", "T", "--keys", "cli-1")
    assert sent.returncode == 0, sent.stderr
    result = json.loads(sent.stdout)
    assert result["status"] == "SEND_OK"
    got = cli("consume", *reg, "--topic", topic, "--pull", "--from", "first", "--count", "1")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout.splitlines()[0])["msg_id"] == result["msg_id"]
    route = cli("admin", "topic-route", *reg, "--topic", topic)
    assert route.returncode == 0 and json.loads(route.stdout)["brokerDatas"][0]["brokerName"]
    at = cli("admin", "query-offset", *reg, "--topic", topic, "--queue", str(result["queue_id"]), "--offset",
             str(result["queue_offset"]))
    assert at.returncode == 0 and json.loads(at.stdout)["messages"][0]["body"] == "via cli"
    missing = cli("admin", "topic-route", "-n", real_cluster.registry, "--topic", "NoSuchTopic_x")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr
    bench = cli("bench", "produce", *reg, "--topic", topic, "--duration", "1", "--batch", "32", "--concurrency", "1")
    assert bench.returncode == 0 and json.loads(bench.stdout.splitlines()[-1])["total"] > 0
