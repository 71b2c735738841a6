"""MQTT beyond one actor: sessions that move between the MQTT actors of a node and between nodes (and
resume from a dead node's slave), delivery between broker groups through the store, and a slave's
MQTT front door."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import start_broker, start_slave
from tests.support.mqtt import Broker, Client, unique
from tests.support.nodes import Node, launch_node
from tests.support.waits import free_ports, wait_for_port, wait_until
from tests.support.wire import closed_by_peer, connect_sent

TAKEN = re.compile(r"(mqtt-\d): session of (\S+) taken over from (\S+)")


def mqtt_node(base: Path, settings: dict | None = None, slave_of: Node | None = None) -> tuple[Node, Broker]:
    port, = free_ports(1)
    wanted = {"mqtt_port": port, "mqtt_ws_port": 0, **(settings or {})}
    node = start_slave(base, slave_of, wanted) if slave_of is not None else start_broker(base, wanted)
    wait_for_port(port, timeout=30)
    return node, Broker("smartgo", port, 0, node.reap, node=node)


@pytest.fixture
def cluster(tmp_path) -> Iterator[tuple[str, list[Node]]]:
    """A registry of its own (its address) and the list where a test puts its nodes: all reaped after."""
    registry = launch_node(tmp_path / "registry", role="registry")
    nodes: list[Node] = []
    try:
        yield f"127.0.0.1:{registry.port}", nodes
    finally:
        for node in nodes:
            node.reap()
        registry.reap()


def group(tmp_path: Path, cluster: tuple[str, list[Node]], name: str, **settings: object) -> tuple[Node, Broker]:
    """Broker group `broker-<name>` behind the cluster's registry, reaped with the cluster."""
    addr, nodes = cluster
    node, broker = mqtt_node(tmp_path / name, {"registry": addr, "broker_name": f"broker-{name}", **settings})
    nodes.append(node)
    return node, broker


def wait_across(publisher: Client, listener: Client, topic: str) -> None:
    """Until the listener's node delivers what the publisher's stores (its feed has found the other
    broker's queues in its routes)."""
    def across() -> bool:
        publisher.publish(f"{topic}/probe", b"probe", qos=1)
        return any(m.payload == b"probe" for m in listener.messages.all())
    wait_until(across, 60, 0.5, "a publish on one node delivered to a subscriber on the other")


def written(node: Node) -> int:
    report = node.health()
    return report["fields"]["commitlog.written"] if report else -1


def holders(node: Node, client_id: str) -> set[str]:
    """The MQTT actors that took the client's session from another one (their log lines)."""
    return {m.group(1) for m in TAKEN.finditer(node.log_text()) if m.group(2) == client_id}


@pytest.mark.timeout(240)
def test_a_session_follows_its_device_from_one_mqtt_actor_to_the_other(tmp_path):
    node, broker = mqtt_node(tmp_path / "node", {"mqtt_actors": 2})
    try:
        device, topic = unique("roamer"), unique("t")
        first = Client(broker, device, version=4, clean=False)
        first.connect()
        first.subscribe(f"{topic}/#", qos=1)
        first.disconnect()
        publisher = Client(broker)
        publisher.connect()
        sent: list[bytes] = []
        rounds = 0
        # the kernel picks the actor of each connection: go on until both took the session over
        while holders(node, device) != {"mqtt-0", "mqtt-1"} or rounds < 4:
            assert rounds < 40, f"after {rounds} reconnects only {holders(node, device)} took the session"
            batch = [f"r{rounds}-{i}".encode() for i in range(3)]
            for payload in batch:
                assert publisher.publish(f"{topic}/{rounds}", payload, qos=1) == 0
            sent += batch
            device_again = Client(broker, device, version=4, clean=False)
            assert device_again.connect().session_present
            got = [m.payload for m in device_again.messages.until(batch[-1])]
            assert set(batch) <= set(got), (rounds, got)          # QoS 1: each at least once
            assert set(got) <= set(sent), (rounds, got)           # and nothing from another round's future
            device_again.disconnect()
            rounds += 1
        publisher.disconnect()
    finally:
        broker.stop()


@pytest.mark.timeout(300)
def test_two_broker_groups_deliver_across_and_a_session_moves_between_nodes(tmp_path, cluster):
    a, broker_a = group(tmp_path, cluster, "a")
    b, broker_b = group(tmp_path, cluster, "b")
    topic = unique("fleet")
    listener = Client(broker_a)
    listener.connect()
    listener.subscribe(f"{topic}/#", qos=1)
    publisher = Client(broker_b)
    publisher.connect()
    wait_across(publisher, listener, topic)
    assert publisher.publish(f"{topic}/1", b"from-b", qos=1) == 0
    assert listener.messages.until(b"from-b")[-1].topic == f"{topic}/1"

    device = unique("traveller")
    on_a = Client(broker_a, device, version=5, clean=False, session_expiry=600)
    on_a.connect()
    on_a.subscribe(f"{topic}/cmd", qos=1)
    on_a.disconnect()
    for i in range(3):
        assert publisher.publish(f"{topic}/cmd", f"away-{i}".encode(), qos=1) == 0
    on_b = Client(broker_b, device, version=5, clean=False, session_expiry=600)
    assert on_b.connect().session_present                  # the session came from node A's store
    got = [m.payload for m in on_b.messages.until(b"away-2")]
    assert {b"away-0", b"away-1", b"away-2"} <= set(got), got
    # the actors' log lines reach the node's log through the supervisor: wait for the line
    wait_until(lambda: holders(b, device) == {"mqtt-0"}, timeout=10, message="node B's mqtt-0 took the session")
    for c in (on_b, listener, publisher):
        c.disconnect()


@pytest.mark.timeout(300)
def test_a_session_resumes_on_another_node_from_the_dead_nodes_slave(tmp_path, cluster):
    addr, nodes = cluster
    a, on_a = group(tmp_path, cluster, "a")
    a.registry_port = int(addr.rsplit(":", 1)[1])  # type: ignore[attr-defined]  # its slave registers there
    slave = start_slave(tmp_path / "a-slave", a, {"broker_name": "broker-a", "mqtt_port": 0, "mqtt_ws_port": 0})
    nodes.append(slave)
    b, on_b = group(tmp_path, cluster, "b")
    topic, device = unique("orders"), unique("survivor")
    publisher = Client(on_b)
    publisher.connect()
    probe = Client(on_a)
    probe.connect()
    probe.subscribe(f"{topic}/#", qos=1)
    wait_across(publisher, probe, topic)
    probe.disconnect()

    first = Client(on_a, device, version=5, clean=False, session_expiry=600)
    first.connect()
    first.subscribe(f"{topic}/mine", qos=1)
    first.disconnect()
    for i in range(3):
        assert publisher.publish(f"{topic}/mine", f"while-away-{i}".encode(), qos=1) == 0
    wait_until(lambda: written(slave) == written(a) > 0, 30, 0.1, "the slave caught up with node A")
    a.kill()                                       # kill -9 of the whole node A

    resumed = Client(on_b, device, version=5, clean=False, session_expiry=600)
    assert resumed.connect(timeout=30).session_present
    got = [m.payload for m in resumed.messages.until(b"while-away-2", timeout=30)]
    assert {b"while-away-0", b"while-away-1", b"while-away-2"} <= set(got), got
    assert "taken over from broker-a/0/mqtt-0" in b.logged("taken over from broker-a/0/mqtt-0")
    resumed.disconnect()
    publisher.disconnect()


@pytest.mark.timeout(240)
def test_a_slave_serves_devices_and_forwards_their_publishes_to_its_master(tmp_path):
    master, on_master = mqtt_node(tmp_path / "master")
    try:
        slave, on_slave = mqtt_node(tmp_path / "slave", slave_of=master)
        try:
            topic = unique("via")
            subscriber = Client(on_master)
            subscriber.connect()
            subscriber.subscribe(f"{topic}/#", qos=1)
            device = Client(on_slave)
            device.connect()
            assert device.publish(f"{topic}/1", b"through-the-slave", qos=1) == 0
            assert subscriber.messages.until(b"through-the-slave")[-1].topic == f"{topic}/1"
            listener = Client(on_slave)
            listener.connect()
            listener.subscribe(f"{topic}/#", qos=1)
            assert subscriber.publish(f"{topic}/2", b"to-the-slave", qos=1) == 0
            assert listener.messages.until(b"to-the-slave")[-1].topic == f"{topic}/2"
            for c in (subscriber, device, listener):
                c.disconnect()
        finally:
            slave.reap()
    finally:
        master.reap()


def _raw_connect(port: int, client_id: str) -> socket.socket:
    sock = connect_sent(port, client_id)
    assert sock.recv(4) == b"\x20\x02\x00\x00"
    sock.setblocking(False)
    return sock


@pytest.mark.timeout(240)
def test_a_device_moving_to_another_node_is_let_go_by_whichever_actor_held_it(tmp_path, cluster):
    """A device that connects to another node (clean session: its new node's record is the only
    news) is closed on the first node by whichever of its actors held it - not only mqtt-0."""
    a, broker_a = group(tmp_path, cluster, "a", mqtt_actors=2)
    b, broker_b = group(tmp_path, cluster, "b")
    devices = [unique("roamer") for _ in range(12)]        # the kernel spreads them over a's two actors
    on_a = {d: _raw_connect(broker_a.port, d) for d in devices}
    on_b = []
    try:
        for d in devices:
            on_b.append(_raw_connect(broker_b.port, d))
        wait_until(lambda: all(closed_by_peer(s) for s in on_a.values()), 60, 0.2, "every device closed on node a")
        log = a.log_text()
        assert re.search(r"mqtt-1\[\d+\] \S+: mqtt \S+: session taken over by another actor or node", log), \
            "no device was on mqtt-1"
    finally:
        for s in [*on_a.values(), *on_b]:
            s.close()
