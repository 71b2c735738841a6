"""A second node on a port a broker's net actors share (SO_REUSEPORT) is refused at start, rather
than silently taking half the connections."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.nodes import ROOT, SUPERVISOR
from tests.support.broker import send_command
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import ResponseCode
from tests.support.waits import free_ports

pytestmark = pytest.mark.timeout(60)


def test_a_second_broker_on_the_same_port_is_refused_and_the_first_serves_on(start_node, tmp_path):
    first = start_node({"topics": "T:1"})
    registry_port, ha_port = free_ports(2)
    second = subprocess.run(
        [sys.executable, str(SUPERVISOR), "--role", "master", "--store-dir", str(tmp_path / "second"),
         "--listen-host", "127.0.0.1", "--listen-port", str(first.node.port),
         "--embedded-registry-port", str(registry_port), "--ha-port", str(ha_port), "--mqtt-port", "0",
         "--mqtt-ws-port", "0"],
        capture_output=True, text=True, timeout=45, cwd=ROOT)
    assert second.returncode == 1
    assert (f"port {first.node.port}: address already in use by another SmartGo node (supervisor pid "
            f"{first.node.proc.pid})") in second.stderr
    for i in range(20):                                  # every new connection still reaches the first node
        client = BlockingRemotingClient()
        try:
            assert client.invoke(first.addr, send_command("T", b"m%d" % i)).code == ResponseCode.SUCCESS
        finally:
            client.close()
    assert first.node.health()["healthy"]
