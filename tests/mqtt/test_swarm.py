"""The many-connections load generator (smartgo/mqtt/swarm.py) against a real node with one and with two
MQTT actors: every device connected and subscribed, from more than one source address and spread over
the actors; every ping answered; a command to a random device arrives at exactly that device; and a
connection nobody accepts is reported as refused, not silently left out."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from smartgo.mqtt.admin import ask_blocking, socket_path
from smartgo.mqtt.swarm import Commander, Swarm, SwarmConfig
from tests.support.broker import start_broker
from tests.support.nodes import Node
from tests.support.waits import LOOPBACK, free_port, wait_for_port, wait_until

DEVICES = 3000
PER_SOURCE = 1000               # devices per source address: 3 addresses
PER_WORKER = 1600               # 2 load generator processes


@pytest.fixture(params=[1, 2], ids=["1-actor", "2-actors"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Node, int, int]]:
    """(node, its MQTT port, its MQTT actors)"""
    actors = request.param
    port = free_port()
    node = start_broker(tmp_path / "node", {"mqtt_port": port, "mqtt_ws_port": 0, "mqtt_actors": actors,
                                            "log_level": "WARNING"})
    try:
        wait_for_port(port, timeout=30)
        node.wait_healthy(timeout=60)
        yield node, port, actors
    finally:
        node.reap()


def _actor_connections(node: Node, actors: int) -> dict[str, int]:
    """The MQTT connections each MQTT actor of the node says it holds (its admin channel)."""
    return {f"mqtt-{i}": ask_blocking(socket_path(node.store / "run", f"mqtt-{i}"), {"op": "stats"})["stats"]
            ["connections"] for i in range(actors)}


@pytest.mark.timeout(90)
def test_swarm_holds_pings_and_commands_devices(node: tuple[Node, int, int]) -> None:
    broker, port, actors = node
    cfg = SwarmConfig(LOOPBACK, port, per_worker=PER_WORKER, per_source=PER_SOURCE)
    with Swarm(cfg) as swarm:
        grown = swarm.grow(DEVICES)
        assert grown.failures == {} and grown.subscribed == DEVICES, grown
        assert grown.rate > 0 and grown.accept_rate > 0 and len(swarm.pids()) == 2
        counts = swarm.counts()
        assert counts["open"] == counts["subscribed"] == counts["connacked"] == counts["tcp"] == DEVICES, counts

        sources = swarm.sources()
        assert sources == {"127.0.0.2": PER_SOURCE, "127.0.0.3": PER_SOURCE, "127.0.0.4": PER_SOURCE}, sources
        held = _actor_connections(broker, actors)
        assert len(held) == actors and sum(held.values()) == DEVICES and min(held.values()) > 0, held

        pinged = swarm.ping(spread=1.0, timeout=20)
        assert pinged.sent == pinged.answered == DEVICES and len(pinged.rtts_ms) == DEVICES
        p50, p99 = pinged.percentile(50), pinged.percentile(99)
        assert p50 is not None and p99 is not None and 0 < p50 <= p99

        *targets, last = random.sample(range(DEVICES), 26)
        commander = Commander(LOOPBACK, port, client_id="test-commander")
        got: list = []

        def collected() -> list:
            got.extend(swarm.arrivals())
            return got
        try:
            stamps = {commander.send(device): device for device in targets}
            assert commander.drain() == 0
            wait_until(lambda: len(collected()) >= len(targets), timeout=20, message="the commands at their devices")
            # one more after them: once it is in, a duplicate or stray of the first ones would be too
            stamps[commander.send(last)] = last
            assert commander.drain() == 0
            wait_until(lambda: any(a.device == last for a in collected()), timeout=20,
                       message="the last command at its device")
        finally:
            commander.close()
        targets.append(last)
        assert sorted((stamps.get(a.sent_ns), a.device) for a in got) == sorted((d, d) for d in targets)
        assert all(a.own_topic and a.latency_ms > 0 for a in got)
        assert swarm.counts()["lost"] == 0 and swarm.failures() == {}


@pytest.mark.timeout(60)
def test_swarm_reports_refused_connections() -> None:
    port = free_port()                      # nobody listens there
    with Swarm(SwarmConfig(LOOPBACK, port, per_source=20)) as swarm:
        grown = swarm.grow(50)
        assert grown.subscribed == 0 and grown.failures == {"refused": 50}, grown
        assert swarm.counts()["failed"] == 50 and swarm.counts()["open"] == 0
        assert swarm.failures() == {"refused": 50}
