"""A net actor busy with many queues' pulls is not hung (issue 42, item 9).

RocketMQ's Java benchmark Consumer draining a backlog of 1,024 queues keeps a pull in flight
per queue; the net actor ran every pull of a read, and every woken pull, in one loop turn, so
its heartbeat went stale and the supervisor killed it as hung. Here several new groups drain
1,024 queues at once over many connections, then wait parked until one more message reaches
every queue (the hold actor wakes every pull at once): 24,576 pulls in flight, which kept the
old net actor's loop still for 1.4 s on a quiet host and 4.6 s on a busy one (docs/BENCHMARKS.md,
"Pull lag"). The net actor's heartbeat deadline is short (NET_DEADLINE, the other actors keep
theirs) so that those turns trip it within seconds; it must neither be killed nor even be late
(no busy warning): its loop turns all along.
"""

from __future__ import annotations

import asyncio

import pytest

from smartgo.broker.testing import batch_command, offset_command, pull_command, send_command
from smartgo.net.client import RemotingClient
from smartgo.net.codes import RequestCode, ResponseCode, SerializeType
from smartgo.net.errors import RemotingError

TOPIC = "BenchmarkTest"
QUEUES = 1024
BACKLOG = 64            # messages per queue: two pulls of 32 per group
GROUPS = 24             # new groups draining at once: 24,576 pulls in flight
CONNECTIONS = 24
NET_DEADLINE = 0.8


async def drain(addr: str, group_count: int, target: int, connections: list[RemotingClient]) -> dict[str, int]:
    """Pull every queue for every group, as a push consumer does (suspend, commit offset, a pull
    in flight per queue), until each has `target` messages; messages received per group."""
    got = {f"busy_g{g}": 0 for g in range(group_count)}

    async def queue(q: int, g: int) -> None:
        group = f"busy_g{g}"
        client = connections[(q * group_count + g) % len(connections)]
        offset = 0
        while offset < target:
            r = await client.invoke(addr, pull_command(TOPIC, q, offset, suspend_ms=30_000, group=group,
                                                       commit_offset=offset), 60.0)
            assert r.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), (r.code, r.remark)
            if r.code == ResponseCode.SUCCESS:
                got[group] += r.ext_int("nextBeginOffset") - offset
                offset = r.ext_int("nextBeginOffset")

    await asyncio.gather(*(queue(q, g) for q in range(QUEUES) for g in range(group_count)))
    return got


async def fill(addr: str, client: RemotingClient, count: int) -> None:
    async def one(q: int) -> None:
        if count == 1:
            r = await client.invoke(addr, send_command(TOPIC, b"one more", queue_id=q), 30.0)
        else:
            r = await client.invoke(addr, batch_command(TOPIC, [(b"b" * 128, "")] * count, queue_id=q), 30.0)
        assert r.code == ResponseCode.SUCCESS, r.remark
    for first in range(0, QUEUES, 128):
        await asyncio.gather(*(one(q) for q in range(first, first + 128)))


async def scenario(addr: str) -> dict[str, int]:
    # Java-like clients: JSON headers, no SmartGo negotiation.
    connections = [RemotingClient(announce=False, serialize_type=SerializeType.JSON) for _ in range(CONNECTIONS)]
    sender = RemotingClient()
    try:
        await fill(addr, sender, BACKLOG)
        pulls = asyncio.ensure_future(drain(addr, GROUPS, BACKLOG + 1, connections))
        return await pulls_then_wake(addr, sender, pulls)
    finally:
        for c in [*connections, sender]:
            await c.close()


async def pulls_then_wake(addr: str, sender: RemotingClient, pulls: asyncio.Future) -> dict[str, int]:
    """Once every queue's backlog is drained (each group then has a pull parked per queue), one
    more message to every queue wakes them all at once."""
    await asyncio.wait_for(drained(addr, sender), 240)
    await fill(addr, sender, 1)
    return await asyncio.wait_for(pulls, 120)


async def drained(addr: str, client: RemotingClient) -> None:
    """Every group has committed the whole backlog of every queue (pulls carry their offsets)."""
    while True:
        behind = 0
        for g in range(GROUPS):
            for q in (0, QUEUES // 2, QUEUES - 1):
                r = await client.invoke(addr, offset_command(RequestCode.QUERY_CONSUMER_OFFSET, TOPIC, q,
                                                             consumerGroup=f"busy_g{g}"), 10.0)
                behind += r.code != ResponseCode.SUCCESS or r.ext_int("offset") < BACKLOG
        if not behind:
            return
        await asyncio.sleep(0.2)


def kills(log: str) -> list[str]:
    return [line for line in log.splitlines() if "killing it" in line]


@pytest.mark.timeout(400)
def test_many_queues_pulls_never_get_the_net_actor_killed(start_node):
    b = start_node({"topics": f"{TOPIC}:{QUEUES}", "net_actors": 1, "commitlog_file_size": 64 << 20,
                    "actor": [{"name": "net-0", "heartbeat_deadline": NET_DEADLINE}]})
    try:
        got = asyncio.run(scenario(b.addr))
    except RemotingError as exc:            # the connections dropped: killed?
        pytest.fail(f"{exc}; the node log says: {kills(b.node.log_text())}")
    assert got == {f"busy_g{g}": QUEUES * (BACKLOG + 1) for g in range(GROUPS)}
    report = b.node.health()
    log = b.node.log_text()
    assert not kills(log), kills(log)
    late = [line for line in log.splitlines() if "net-0" in line and "but busy" in line]
    assert not late, late                   # its loop turned within the deadline all along
    assert {a["name"]: a["restarts"] for a in report["actors"]} == {a["name"]: 0 for a in report["actors"]}
    net = b.node.actor("net-0")
    assert net["heartbeat_deadline_s"] == NET_DEADLINE
    assert net["progress"] >= GROUPS * QUEUES * 3        # requests and woken pulls it counted
