"""A node that dies: its persistent MQTT sessions resume on another node from its slave's replica."""

from __future__ import annotations

import pytest

from tests.support.broker import start_broker, start_slave
from tests.support.mqtt import Broker, Client, unique
from tests.support.nodes import Node, launch_node
from tests.support.waits import free_ports, wait_for_port, wait_until


def written(node: Node) -> int:
    report = node.health()
    return report["fields"]["commitlog.written"] if report else -1


@pytest.mark.timeout(300)
def test_a_session_resumes_on_another_node_from_the_dead_nodes_slave(tmp_path):
    registry = launch_node(tmp_path / "registry", role="registry")
    nodes: list[Node] = []
    try:
        addr = f"127.0.0.1:{registry.port}"
        port_a, port_b = free_ports(2)
        a = start_broker(tmp_path / "a", {"registry": addr, "broker_name": "broker-a", "mqtt_port": port_a,
                                          "mqtt_ws_port": 0})
        nodes.append(a)
        a.registry_port = registry.port  # type: ignore[attr-defined]  # its slave registers there
        slave = start_slave(tmp_path / "a-slave", a, {"broker_name": "broker-a", "mqtt_port": 0,
                                                      "mqtt_ws_port": 0})
        nodes.append(slave)
        b = start_broker(tmp_path / "b", {"registry": addr, "broker_name": "broker-b", "mqtt_port": port_b,
                                          "mqtt_ws_port": 0})
        nodes.append(b)
        for port in (port_a, port_b):
            wait_for_port(port, timeout=30)
        on_a, on_b = Broker("smartgo", port_a, 0, a.reap, node=a), Broker("smartgo", port_b, 0, b.reap, node=b)
        topic, device = unique("orders"), unique("survivor")
        publisher = Client(on_b)
        publisher.connect()
        probe = Client(on_a)
        probe.connect()
        probe.subscribe(f"{topic}/#", qos=1)

        def across() -> bool:                      # node A's feed reads broker-b's queues
            publisher.publish(f"{topic}/probe", b"probe", qos=1)
            return any(m.payload == b"probe" for m in probe.messages.all())
        wait_until(across, 60, 0.5, "node A delivering what node B stored")
        probe.disconnect()

        first = Client(on_a, device, version=5, clean=False, session_expiry=600)
        first.connect()
        first.subscribe(f"{topic}/mine", qos=1)
        first.disconnect()
        for i in range(3):
            assert publisher.publish(f"{topic}/mine", f"while-away-{i}".encode(), qos=1) == 0

        wait_until(lambda: written(slave) == written(a) > 0, 30, 0.1, "the slave caught up with node A")
        a.kill()                                   # kill -9 of the whole node A

        resumed = Client(on_b, device, version=5, clean=False, session_expiry=600)
        assert resumed.connect(timeout=30).session_present
        got = [m.payload for m in resumed.messages.until(b"while-away-2", timeout=30)]
        assert {b"while-away-0", b"while-away-1", b"while-away-2"} <= set(got), got
        assert "taken over from broker-a/0/mqtt-0" in b.logged("taken over from broker-a/0/mqtt-0")
        resumed.disconnect()
        publisher.disconnect()
    finally:
        for node in nodes:
            node.reap()
        registry.reap()
