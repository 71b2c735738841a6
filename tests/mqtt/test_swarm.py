"""The many-connections load generator (smartgo/mqtt/swarm.py) against a real node with one and with two
MQTT actors: every device connected and subscribed, from more than one source address and spread over
the actors; every ping answered; a command to a random device arrives at exactly that device; a
connection nobody accepts is reported as refused, not silently left out; devices spread over two nodes
of a cluster get commands published on the other node; and persistent-session devices reconnect after a
node restart and find their sessions."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from smartgo.mqtt.admin import ask_blocking, socket_path
from smartgo.mqtt.swarm import Commander, Swarm, SwarmConfig
from tests.support.broker import restart_broker, start_broker
from tests.support.nodes import Node, launch_node
from tests.support.waits import LOOPBACK, free_port, free_ports, wait_for_port, wait_until

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


def _commands_arrive(swarm: Swarm, port: int, targets: list[int], timeout: float = 60) -> list:
    """Commands published through the node on `port` to each of targets: what arrived (once all did)."""
    commander = Commander(LOOPBACK, port, client_id=f"test-commander-{port}")
    got: list = []

    def collected() -> list:
        got.extend(swarm.arrivals())
        return got
    try:
        stamps = {}
        for i, device in enumerate(targets, 1):
            stamps[commander.send(device)] = device
            if i % 500 == 0 or i == len(targets):   # under the node's Receive Maximum (1024 unacknowledged)
                assert commander.drain() == 0
        wait_until(lambda: {a.device for a in collected()} >= set(targets), timeout=timeout,
                   message="the commands at their devices")
    finally:
        commander.close()
    assert all(stamps.get(a.sent_ns) == a.device and a.own_topic for a in got), got
    return got


@pytest.mark.timeout(240)
def test_swarm_spreads_devices_over_two_nodes_and_commands_cross(tmp_path: Path) -> None:
    """Two broker groups behind one registry: device i on node i mod 2; each node holds its half, the
    halves add up, and a command published on node A reaches devices connected to node B."""
    registry = launch_node(tmp_path / "registry", role="registry")
    nodes: list[Node] = []
    try:
        ports = free_ports(2)
        for name, port in zip("ab", ports):
            nodes.append(start_broker(tmp_path / name, {"mqtt_port": port, "mqtt_ws_port": 0, "log_level": "WARNING",
                                                        "registry": f"{LOOPBACK}:{registry.port}",
                                                        "broker_name": f"broker-{name}"}))
            wait_for_port(port, timeout=30)
        cfg = SwarmConfig(LOOPBACK, ports[0], ports=tuple(ports), per_worker=PER_WORKER, per_source=PER_SOURCE)
        with Swarm(cfg) as swarm:
            grown = swarm.grow(1200)
            assert grown.failures == {} and grown.subscribed == 1200, grown
            held = [sum(_actor_connections(node, 1).values()) for node in nodes]
            assert held == [600, 600] and sum(held) == swarm.counts()["open"], held
            on_b = random.sample(range(1, 1200, 2), 20)
            got = _commands_arrive(swarm, ports[0], on_b)
            assert sorted(a.device for a in got) == sorted(on_b)
            assert swarm.counts()["lost"] == 0 and swarm.failures() == {}
    finally:
        for node in nodes:
            node.reap()
        registry.reap()


@pytest.mark.timeout(240)
def test_devices_resume_their_sessions_after_a_node_restart(tmp_path: Path) -> None:
    """Persistent-session devices reconnect at once when their node restarts (retrying while it is down,
    or while the MQTT actor holding their session is still restoring: "server unavailable"): every
    CONNACK says session present, no actor of the new node crashes, and a command reaches every device
    although none subscribed again. Two MQTT actors: with more than one, sessions were lost."""
    devices = 1500
    port = free_port()
    node = start_broker(tmp_path / "node", {"mqtt_port": port, "mqtt_ws_port": 0, "log_level": "WARNING",
                                            "mqtt_actors": 2})
    try:
        wait_for_port(port, timeout=30)
        cfg = SwarmConfig(LOOPBACK, port, clean=False, reconnect=True, per_worker=PER_WORKER,
                          per_source=PER_SOURCE, reconnect_window=500)
        with Swarm(cfg) as swarm:
            grown = swarm.grow(devices)
            assert grown.failures == {} and grown.subscribed == devices, grown
            assert node.stop(timeout=60) == 0                  # SIGTERM to the supervisor
            node = restart_broker(node)
            actors = {a["name"]: a["pid"] for a in node.health()["actors"]}  # type: ignore[index]  # healthy
            wait_until(lambda: swarm.counts()["dropped"] >= devices and swarm.counts()["open"] == devices,
                       timeout=120, message="every device back")
            counts = swarm.counts()
            assert counts["reconnected"] >= devices and counts["resumed"] == counts["reconnected"], counts
            assert counts["subscribed"] == devices, "a device subscribed again"
            reasons = swarm.reconnects()
            assert reasons.get("dropped: closed by the broker", 0) >= devices and "session lost" not in reasons
            got = _commands_arrive(swarm, port, list(range(devices)))
            assert len(got) == devices
            report = node.health()
            assert report is not None and report["node"]["restarts"] == 0
            assert {a["name"]: a["pid"] for a in report["actors"]} == actors, "an actor restarted in the storm"
            assert all(a["restarts"] == 0 for a in report["actors"]), report["actors"]
            assert swarm.counts()["open"] == devices and swarm.failures() == {}
    finally:
        node.reap()
