"""Broker test fixtures: real nodes (supervisor.py --role master) on free loopback ports."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.nodes import Node, launch_node
from tests.support.broker import start_broker, start_slave
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.command import RemotingCommand


@dataclass
class Broker:
    node: Node
    client: BlockingRemotingClient

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.node.port}"

    @property
    def registry(self) -> str:
        return f"127.0.0.1:{self.node.registry_port}"

    def call(self, cmd: RemotingCommand, timeout: float = 5.0) -> RemotingCommand:
        return self.client.invoke(self.addr, cmd, timeout)

    def board(self, name: str) -> int:
        report = self.node.health()
        assert report is not None
        return report["fields"][name]


@pytest.fixture
def start_node(tmp_path: Path):
    """start_node(settings) -> Broker; every process is reaped afterwards."""
    made: list[Broker] = []

    def start(settings: dict | None = None) -> Broker:
        node = start_broker(tmp_path / f"node{len(made)}", settings)
        broker = Broker(node, BlockingRemotingClient())
        made.append(broker)
        return broker

    yield start
    for b in made:
        b.client.close()
        b.node.reap()


@pytest.fixture(scope="module")
def broker(tmp_path_factory, request) -> Broker:
    """One node shared by a test module: small files, plus the module's NODE_SETTINGS."""
    node = start_broker(tmp_path_factory.mktemp("broker") / "node", getattr(request.module, "NODE_SETTINGS", None))
    b = Broker(node, BlockingRemotingClient())
    yield b
    b.client.close()
    node.reap()


@pytest.fixture
def slaves(tmp_path):
    """slaves(master_node, settings) -> a slave node of it; every one (and those put in
    slaves.made) is reaped afterwards."""
    made = []

    def start(master, settings=None, name="slave"):
        node = start_slave(tmp_path / f"{name}{len(made)}", master, settings)
        made.append(node)
        return node

    start.made = made            # restarted slaves are added here, to be reaped too
    yield start
    for node in made:
        node.reap()


@pytest.fixture
def registry(tmp_path):
    """A registry node that decides failover (after 1 s); `registry.addr` is its address."""
    node = launch_node(tmp_path / "registry", {"failover_enable": "true", "failover_delay": 1.0}, role="registry")
    node.addr = f"127.0.0.1:{node.port}"          # type: ignore[attr-defined]
    yield node
    node.reap()
