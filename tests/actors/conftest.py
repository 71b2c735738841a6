"""Fixtures for the actor-runtime tests (the harness itself is tests/support/nodes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.nodes import Node, launch_node


@pytest.fixture
def start_node(tmp_path: Path):
    """start_node(settings, role=..., launcher=..., wait=True) -> a running Node; all its processes are reaped after."""
    nodes: list[Node] = []

    def start(settings: dict | None = None, **options) -> Node:
        node = launch_node(tmp_path / f"node{len(nodes)}", settings, **options)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.reap()
