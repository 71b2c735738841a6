"""A net actor busy with many queues' pulls is not hung (issue 42, item 9).

RocketMQ's Java benchmark Consumer draining a backlog of 1,024 queues keeps a pull in flight per
queue; the net actor ran every pull of a read in one loop turn, so its heartbeat went stale and
the supervisor killed it as hung. Here 24 new groups drain 1,024 queues at once over 24
connections, then wait parked until a second backlog reaches every queue, with 32 more groups
that only wait for it. The 24,576 pulls in flight kept the old net actor's loop still for 1.4 s
on a quiet host and 4.6 s on a busy one (docs/BENCHMARKS.md, "Pull lag"); the wake of 57,344
parked pulls, answered in one go per dispatch round, for up to a second. The net actor's
heartbeat deadline is short (NET_DEADLINE; the other actors keep theirs) so that those turns trip
it within seconds; it must neither be killed nor even be late (no busy warning): its loop turns
all along.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.broker import batch_command, offset_command, pull_command
from smartgo.net.client import RemotingClient
from smartgo.net.codes import RequestCode, ResponseCode, SerializeType
from smartgo.net.errors import RemotingError

TOPIC = "BenchmarkTest"
QUEUES = 1024
BACKLOG = 64            # messages per queue: two pulls of 32 per group
SECOND = 32             # the second backlog: one pull's worth, so dispatch rounds wake many queues each
GROUPS = 24             # new groups draining at once: 24,576 pulls in flight
WAITERS = 32            # groups that only wait, parked at the backlog's end, for the second one
CONNECTIONS = 24
NET_DEADLINE = 0.8
# group -> (first offset, offset to reach) in every queue
PLAN = {**{f"busy_g{g}": (0, BACKLOG + SECOND) for g in range(GROUPS)},
        **{f"wait_g{g}": (BACKLOG, BACKLOG + SECOND) for g in range(WAITERS)}}


async def consume(addr: str, connections: list[RemotingClient]) -> dict[str, int]:
    """Pull every queue for every group of PLAN, as a push consumer does (suspend, commit offset,
    a pull in flight per queue); messages received per group."""
    got = dict.fromkeys(PLAN, 0)

    async def queue(q: int, i: int, group: str) -> None:
        client = connections[(q * len(PLAN) + i) % len(connections)]
        offset, target = PLAN[group]
        while offset < target:
            r = await client.invoke(addr, pull_command(TOPIC, q, offset, suspend_ms=30_000, group=group,
                                                       commit_offset=offset), 60.0)
            assert r.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), (r.code, r.remark)
            if r.code == ResponseCode.SUCCESS:
                got[group] += r.ext_int("nextBeginOffset") - offset
                offset = r.ext_int("nextBeginOffset")

    await asyncio.gather(*(queue(q, i, group) for q in range(QUEUES) for i, group in enumerate(PLAN)))
    return got


async def fill(addr: str, client: RemotingClient, count: int, at_once: int) -> None:
    """count messages to every queue, a batch per queue, at_once batches in flight."""
    async def one(q: int) -> None:
        r = await client.invoke(addr, batch_command(TOPIC, [(b"b" * 128, "")] * count, queue_id=q), 30.0)
        assert r.code == ResponseCode.SUCCESS, r.remark
    for first in range(0, QUEUES, at_once):
        await asyncio.gather(*(one(q) for q in range(first, first + at_once)))


async def scenario(addr: str) -> dict[str, int]:
    # Java-like clients: JSON headers, no SmartGo negotiation.
    connections = [RemotingClient(announce=False, serialize_type=SerializeType.JSON) for _ in range(CONNECTIONS)]
    sender = RemotingClient()
    try:
        await fill(addr, sender, BACKLOG, 128)
        # connected before the 57,344 pulls are made: this process's own loop, busy making them,
        # let a connect time out (3 s) on a slow host
        await asyncio.gather(*(c.connection(addr) for c in connections))
        pulls = asyncio.ensure_future(consume(addr, connections))
        return await pulls_then_wake(addr, sender, pulls)
    finally:
        for c in [*connections, sender]:
            await c.close()


async def pulls_then_wake(addr: str, sender: RemotingClient, pulls: asyncio.Future) -> dict[str, int]:
    """Once every queue's backlog is drained (each group then has a pull parked per queue), a
    second backlog sent to every queue at once wakes them all in a few dispatch rounds."""
    drain = asyncio.ensure_future(drained(addr, sender))
    await asyncio.wait({drain, pulls}, timeout=240, return_when=asyncio.FIRST_COMPLETED)
    if pulls.done():                # failed while draining: its error, not a 240 s wait
        drain.cancel()
        pulls.result()
    await asyncio.wait_for(drain, 1)
    await fill(addr, sender, SECOND, QUEUES)
    return await asyncio.wait_for(pulls, 240)


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
    assert got == {group: QUEUES * (target - first) for group, (first, target) in PLAN.items()}
    report = b.node.health()
    log = b.node.log_text()
    assert not kills(log), kills(log)
    late = [line for line in log.splitlines() if "net-0" in line and "but busy" in line]
    assert not late, late                   # its loop turned within the deadline all along
    assert {a["name"]: a["restarts"] for a in report["actors"]} == {a["name"]: 0 for a in report["actors"]}
    net = b.node.actor("net-0")
    assert net["heartbeat_deadline_s"] == NET_DEADLINE
    assert net["progress"] >= len(PLAN) * QUEUES * 2    # the requests and woken pulls it counted
