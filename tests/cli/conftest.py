"""CLI test helpers: the client tests' scripted fake broker and registry, run on a background
loop thread so that `smartgo` (which runs its own loop) can be called in-process."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest


_spec = importlib.util.spec_from_file_location("client_conftest", Path(__file__).parents[1] / "client" / "conftest.py")
client_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client_conftest)  # type: ignore[union-attr]
FakeBroker = client_conftest.FakeBroker
fake_cluster = client_conftest.fake_cluster
pull_response = client_conftest.pull_response
response = client_conftest.response
Background = client_conftest.Background


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, FakeBroker]]:
    """(registry address, fake broker with topic T of 2 queues) alive for the test."""
    bg = Background()
    broker = FakeBroker(topics={"T": 2})
    ctx = fake_cluster(tmp_path, [broker])
    registry, _ = bg.run(ctx.__aenter__())
    try:
        yield registry, broker
    finally:
        bg.run(ctx.__aexit__(None, None, None))
        bg.stop()
