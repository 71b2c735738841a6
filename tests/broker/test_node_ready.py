"""The "node ready" line: once every actor is ready, one log line names the role, the store and
every port the node listens on; after an actor restart, "node ready again"."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

import pytest

from smartgo.node.roles import ROLES
from tests.support.nodes import launch_node
from tests.support.broker import FREE_PORT, start_broker
from smartgo.config import NodeConfig
from tests.support.waits import free_port

pytestmark = pytest.mark.timeout(90)

READY = re.compile(r"node ready: (.*) \(")
AGAIN = re.compile(r"node ready again: (.*) \(")


def fields(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line.split())


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return True
    except OSError:
        return False


def test_a_master_says_once_that_it_is_ready_naming_every_port_and_again_after_an_actor_restart(tmp_path):
    node = start_broker(tmp_path / "node", {"vip_port": free_port(), "metrics_port": FREE_PORT})
    try:
        ready = READY.findall(node.logged("node ready: "))
        assert len(ready) == 1, ready
        said = fields(ready[0])
        vip = int(said.get("vip", 0))
        assert said == {"role": "master", "store": str(node.store.resolve()), "clients": str(node.port),
                        "vip": str(vip), "ha": str(node.ha_port), "registry": str(node.registry_port),
                        "metrics": str(node.metrics_port)}
        assert vip and all(listening(int(port)) for what, port in said.items() if what not in ("role", "store"))
        log = node.log_text()           # each actor is ready once it listens: the ha actor too
        assert log.index(f"replication service on 127.0.0.1:{node.ha_port}") < log.index("ha ready (pid")

        os.kill(node.actor("dispatch")["pid"], signal.SIGKILL)
        again = AGAIN.findall(node.logged("node ready again: "))
        assert len(again) == 1 and fields(again[0]) == said
        assert len(READY.findall(node.log_text())) == 1
    finally:
        node.reap()


def test_a_registry_node_names_its_one_port(tmp_path):
    node = launch_node(tmp_path / "registry")
    try:
        ready = READY.findall(node.logged("node ready: "))
        assert [fields(line) for line in ready] == [
            {"role": "registry", "store": str(node.store.resolve()), "registry": str(node.port)}]
    finally:
        node.reap()


def test_the_readme_names_every_port_a_default_master_opens():
    """The paragraph after the README's first command: each port of `supervisor.py --role master`."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    paragraph = readme[readme.index("The first command"):].split("\n\n")[0]
    ports = dict(ROLES["master"].ports(NodeConfig().resolved(ROLES["master"].default_port)))
    assert ports == {"clients": 10911, "vip": 10909, "ha": 10912, "registry": 9876, "mqtt": 1883, "mqtt-ws": 8083}
    assert all(str(port) in paragraph for port in ports.values()), paragraph
