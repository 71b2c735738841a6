"""How many MQTT connections a node takes: --mqtt-connections starts as many MQTT actors as their
descriptors need, and an actor holding all it may answers CONNECT with "server busy" (a log line
and a metric say so) while it keeps serving the devices it has."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from smartgo.config import NodeConfig
from smartgo.mqtt import codec as c
from smartgo.mqtt.listeners import mqtt_names
from smartgo.net.limits import connections_per_actor, open_files_limit
from tests.support.broker import FREE_PORT, start_broker
from tests.support.nodes import Node
from tests.support.waits import free_port, wait_for_port, wait_until
from tests.support.few_files_supervisor import FILES
from tests.support.wire import connect_sent

PER_ACTOR = connections_per_actor(FILES)
PINGREQ = b"\xc0\x00"


def test_mqtt_connections_starts_the_actors_it_needs() -> None:
    per = connections_per_actor(open_files_limit())
    assert len(mqtt_names(NodeConfig(mqtt_connections=2 * per + 1))) == 3
    assert len(mqtt_names(NodeConfig(mqtt_connections=per))) == 1
    assert len(mqtt_names(NodeConfig(mqtt_actors=4, mqtt_connections=per))) == 4
    assert PER_ACTOR == FILES - 256


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Node, int]]:
    port = free_port()
    launcher = Path(__file__).resolve().parents[1] / "support" / "few_files_supervisor.py"
    node = start_broker(tmp_path / "node", {"mqtt_port": port, "mqtt_ws_port": 0, "metrics_port": FREE_PORT,
                                            "mqtt_connections": PER_ACTOR + 1}, launcher=launcher)
    try:
        wait_for_port(port, timeout=30)
        yield node, port
    finally:
        node.reap()


def _connect(port: int, client_id: str, version: int = 4) -> tuple[socket.socket, bytes]:
    sock = connect_sent(port, client_id, version=version, keep_alive=300)
    decoder = c.Decoder(server=False)
    decoder.version = version
    packets: list = []
    while not packets:
        data = sock.recv(4096)
        if not data:
            return sock, b""
        packets = decoder.feed(data)
    return sock, bytes([packets[0].reason])


def _busy_events(node: Node) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith("smartgo_mqtt_events_total{") and 'event="busy"' in line:
                return float(line.rsplit(" ", 1)[1])
    return -1.0


@pytest.mark.timeout(180)
def test_full_actors_answer_server_busy_and_keep_serving(node: tuple[Node, int]) -> None:
    broker, port = node
    actors = [a["name"] for a in broker.health()["actors"] if a["name"].startswith("mqtt-")]
    assert actors == ["mqtt-0", "mqtt-1"]           # one actor cannot hold PER_ACTOR + 1
    accepted: list[socket.socket] = []
    busy = 0
    try:
        for i in range(2 * PER_ACTOR + 300):         # the kernel spreads them: both actors fill up
            sock, code = _connect(port, f"d{i}")
            if code == b"\x00":
                accepted.append(sock)
            else:
                assert code == bytes([c.REFUSED_SERVER_UNAVAILABLE])   # 3.1.1's "server unavailable"
                busy += 1
                sock.close()
        assert len(accepted) == 2 * PER_ACTOR and busy == 300
        sock, code = _connect(port, "v5-device", version=5)
        sock.close()
        assert code == bytes([c.SERVER_BUSY])       # 5.0's "server busy"
        for sock in accepted[:5]:                   # the devices it holds are served
            sock.sendall(PINGREQ)
            assert sock.recv(2) == b"\xd0\x00"
        wait_until(lambda: _busy_events(broker) >= busy + 1, timeout=30, message="busy counted in the metrics")
        log = (broker.store / "logs" / "node.log").read_text()
        assert "CONNECT refused with server busy" in log
        for sock in accepted[:40]:                  # room again: taken at once
            sock.close()
        accepted = accepted[40:]
        def back() -> bool:
            sock, code = _connect(port, "back")
            sock.close()
            return code == b"\x00"
        wait_until(back, timeout=30, message="a CONNECT accepted once connections closed")
    finally:
        for sock in accepted:
            sock.close()


@pytest.mark.timeout(120)
def test_a_node_of_more_actors_than_board_max_actors_gets_a_slot_for_each(tmp_path: Path) -> None:
    """A million devices need 56 MQTT actors: with the broker's ten that is past the board's 64
    slots, so board_max_actors is a floor, not a ceiling."""
    node = start_broker(tmp_path / "node", {"board_max_actors": 4, "mqtt_actors": 2, "mqtt_port": free_port(),
                                            "mqtt_ws_port": 0})
    try:
        actors = [a["name"] for a in node.health()["actors"]]
        assert len(actors) > 4 and {"mqtt-0", "mqtt-1", "net-0", "broker"} <= set(actors)
    finally:
        node.reap()
