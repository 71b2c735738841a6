"""The node's session directory (smartgo/mqtt/directory.py): which MQTT actors a CONNECT must ask
about a client, so a node of fifty actors does not ask fifty of them each time - nor waits for one
that hangs."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from smartgo.mqtt import codec as c
from smartgo.mqtt.directory import SessionDirectory, slot_of
from tests.mqtt.test_cluster import mqtt_node
from tests.support.waits import LOOPBACK, wait_until


def _same_slot(client_id: str) -> str:
    """Another client id in client_id's slot."""
    slot = slot_of(client_id)
    return next(other for n in range(10_000_000) if slot_of(other := f"x{n}") == slot)


def test_an_actor_is_asked_about_the_clients_of_its_slots_only(tmp_path: Path) -> None:
    zero, one, two = (SessionDirectory(tmp_path, 3, i) for i in range(3))
    try:
        assert zero.holders("dev-1") == []
        one.hold("dev-1")
        two.hold("dev-2")
        assert zero.holders("dev-1") == [1] and zero.holders("dev-2") == [2]
        assert one.holders("dev-1") == []                 # never itself
        twin = _same_slot("dev-1")
        one.hold(twin)                                    # two of its sessions in one slot
        one.release("dev-1")
        assert zero.holders(twin) == [1]                  # the other is still there
        one.release(twin)
        assert zero.holders("dev-1") == [] and zero.holders(twin) == []
        one.hold("dev-3")
        one.close()
        again = SessionDirectory(tmp_path, 3, 1)          # actor 1 restarted: holds nothing yet
        assert zero.holders("dev-3") == []
        again.close()
    finally:
        for d in (zero, two):
            d.close()


def _connect(port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection((LOOPBACK, port), timeout=10)
    sock.sendall(c.encode(c.Connect(protocol_level=4, clean_start=False, keep_alive=60, client_id=client_id), 4))
    sock.setblocking(False)
    return sock


@pytest.mark.timeout(180)
def test_a_hung_mqtt_actor_is_not_asked_about_clients_it_never_held(tmp_path: Path) -> None:
    node, broker = mqtt_node(tmp_path / "node", {"mqtt_actors": 2})
    socks: list[socket.socket] = []
    stopped = None
    try:
        stopped = next(a["pid"] for a in node.health()["actors"] if a["name"] == "mqtt-1")
        os.kill(stopped, signal.SIGSTOP)
        socks = [_connect(broker.port, f"new-{i}") for i in range(16)]      # the kernel spreads them

        def answered() -> list[socket.socket]:
            out = []
            for sock in socks:
                try:
                    if sock.recv(4) == b"\x20\x02\x00\x00":
                        out.append(sock)
                except BlockingIOError:
                    pass
            return out
        got = wait_until(answered, timeout=30, message="CONNACKs from the actor that runs")
        assert got
        assert "did not answer take" not in node.log_text()    # nobody waited on the hung one
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        for sock in socks:
            sock.close()
        node.reap()
