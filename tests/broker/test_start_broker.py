"""The test-node helper survives the free-port race and says why a node did not start."""

from __future__ import annotations

import socket

import pytest

import tests.support.nodes as actors_testing
from tests.support.nodes import NodeStartError
from tests.support.broker import start_broker
from tests.support.waits import free_port


@pytest.fixture
def taken_port():
    """A loopback port some other process holds."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.mark.timeout(120)
def test_a_taken_port_is_retried_with_fresh_ports(tmp_path, monkeypatch, taken_port):
    picks = iter([taken_port])
    monkeypatch.setattr(actors_testing, "free_port", lambda: next(picks, None) or free_port())
    node = start_broker(tmp_path / "node")
    try:
        assert node.port != taken_port and node.health()["healthy"]
    finally:
        node.reap()


@pytest.mark.timeout(120)
def test_a_node_that_cannot_start_reports_its_log(tmp_path, monkeypatch, taken_port):
    monkeypatch.setattr(actors_testing, "free_port", lambda: taken_port)
    with pytest.raises(NodeStartError, match="(?s)gave up starting.*address already in use") as err:
        start_broker(tmp_path / "node")
    assert err.value.port_taken
