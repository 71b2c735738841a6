"""The MQTT listeners of a node: TLS with the node's certificate, a port another program holds, the
settings a listener needs, a CONNECT of a protocol level the node does not speak, and packets that
come whole in the same read as a bad one."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mqtt import Broker, Client, unique
from tests.support.nodes import Node
from tests.support.broker import start_broker
from tests.support.waits import LOOPBACK, free_ports, self_signed_cert, wait_for_port

ROOT = Path(__file__).resolve().parents[2]


def connect_packet(client_id: bytes, level: int = 4) -> bytes:
    body = b"\x00\x04MQTT" + bytes([level, 0x02]) + b"\x00\x3c" + len(client_id).to_bytes(2, "big") + client_id
    return bytes([0x10, len(body)]) + body


def read_until_closed(sock: socket.socket) -> bytes:
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    return got


@pytest.mark.timeout(180)
def test_mqtt_over_tls_with_the_nodes_certificate(tmp_path):
    cert, key = self_signed_cert(tmp_path, "node")
    plain, tls_port = free_ports(2)
    node = start_broker(tmp_path / "node", {"mqtt_port": plain, "mqtt_ws_port": 0, "mqtt_tls_port": tls_port,
                                            "tls_cert_file": cert, "tls_key_file": key})
    try:
        wait_for_port(tls_port, timeout=30)
        secure = Client(Broker("smartgo", tls_port, 0, node.reap, node=node))
        secure.paho.tls_set(cert_reqs=ssl.CERT_NONE)
        secure.connect()
        topic = unique("tls")
        secure.subscribe(topic, qos=1)
        clear = Client(Broker("smartgo", plain, 0, node.reap, node=node))
        clear.connect()
        assert clear.publish(topic, b"over-tcp", qos=1) == 0
        assert secure.messages.until(b"over-tcp")[-1].topic == topic       # TCP in, TLS out
        assert secure.publish(topic, b"over-tls", qos=1) == 0
        assert secure.messages.until(b"over-tls")[-1].payload == b"over-tls"
        with socket.create_connection((LOOPBACK, tls_port), timeout=10) as raw:   # MQTT in the clear: no
            raw.sendall(connect_packet(b"clear"))
            assert b"\x20\x02" not in read_until_closed(raw)
        secure.disconnect()
        clear.disconnect()
    finally:
        node.reap()


def run_supervisor(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    registry, port = free_ports(2)
    return subprocess.run([sys.executable, str(ROOT / "supervisor.py"), "--role", "master", "--store-dir",
                           str(tmp_path / "node"), "--listen-host", LOOPBACK, "--listen-port", str(port),
                           "--embedded-registry-port", str(registry), "--mqtt-ws-port", "0", *flags],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.timeout(120)
def test_a_port_another_program_holds_is_a_settings_error_naming_the_flag(tmp_path):
    holder = socket.socket()
    holder.bind((LOOPBACK, 0))
    holder.listen()
    try:
        port = holder.getsockname()[1]
        out = run_supervisor(tmp_path, "--mqtt-port", str(port))
        assert out.returncode == 2, out.stderr
        assert (f"mqtt_port (--mqtt-port) {port}: address already in use by another program; choose another "
                "port, or 0 to turn it off") in out.stderr
    finally:
        holder.close()


@pytest.mark.timeout(120)
def test_a_tls_port_without_a_certificate_is_a_settings_error(tmp_path):
    tls_port, = free_ports(1)
    out = run_supervisor(tmp_path, "--mqtt-port", "0", "--mqtt-tls-port", str(tls_port))
    assert out.returncode == 2
    assert "mqtt_tls_port needs tls_cert_file and tls_key_file" in out.stderr


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Node:
    port, = free_ports(1)
    started = start_broker(tmp_path_factory.mktemp("listeners") / "node", {"mqtt_port": port, "mqtt_ws_port": 0})
    started.mqtt_port = port  # type: ignore[attr-defined]  # the test's MQTT port
    wait_for_port(port, timeout=30)
    yield started
    started.reap()


@pytest.mark.timeout(60)
def test_an_unsupported_protocol_level_gets_connack_1_then_the_close(node):
    with socket.create_connection((LOOPBACK, node.mqtt_port), timeout=10) as raw:
        raw.sendall(connect_packet(b"future", level=9))
        assert read_until_closed(raw) == b"\x20\x02\x00\x01"
    assert "protocol 'MQTT' level 9" in node.logged("level 9")


@pytest.mark.timeout(60)
def test_packets_whole_before_a_bad_one_in_the_same_read_are_served(node):
    topic = unique("before-bad").encode()
    watcher = Client(Broker("smartgo", node.mqtt_port, 0, node.reap, node=node))
    watcher.connect()
    watcher.subscribe(topic.decode(), qos=0)
    publish = bytes([0x30, 2 + len(topic) + 4]) + len(topic).to_bytes(2, "big") + topic + b"kept"
    with socket.create_connection((LOOPBACK, node.mqtt_port), timeout=10) as raw:
        raw.sendall(connect_packet(b"then-garbage"))
        assert raw.recv(4) == b"\x20\x02\x00\x00"
        raw.sendall(publish + b"\xf0\x00")              # a whole PUBLISH, then a reserved packet type
        read_until_closed(raw)
    assert watcher.messages.until(b"kept")[-1].topic == topic.decode()
    watcher.disconnect()


@pytest.mark.timeout(120)
def test_a_topic_no_rule_maps_is_refused_without_closing_the_client(tmp_path):
    port, = free_ports(1)
    node = start_broker(tmp_path / "node", {"mqtt_port": port, "mqtt_ws_port": 0,
                                            "mqtt_topic_map": "devices/#=DEVICES"})
    try:
        wait_for_port(port, timeout=30)
        broker = Broker("smartgo", port, 0, node.reap, node=node)
        v311, v5 = Client(broker, version=4), Client(broker, version=5)
        for c in (v311, v5):
            c.connect()
            c.subscribe("devices/#", qos=1)
        assert v5.publish("elsewhere/x", b"no", qos=1) == 0x90         # 5.0: topic name invalid
        assert v311.publish("elsewhere/x", b"no", qos=1) == 0          # 3.1.1: acknowledged, dropped
        assert not v311.disconnected.is_set()
        assert v311.publish("devices/7/up", b"mapped", qos=1) == 0     # and the connection serves on
        assert v5.messages.until(b"mapped")[-1].topic == "devices/7/up"
        assert "no mqtt_topic_map rule takes topic elsewhere/x" in node.logged("elsewhere/x")
        for c in (v311, v5):
            c.disconnect()
    finally:
        node.reap()
