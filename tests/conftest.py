"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest

from smartgo.cpus import usable_cpus
from smartgo.testing import free_port

MAX_WORKERS = 8


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): a worker per usable CPU, counted as for the broker's own
    defaults (xdist alone counts the host's physical cores, blind to the affinity mask and the
    cgroup's quota), at most MAX_WORKERS: each worker's tests start whole nodes, and past that the
    longest file bounds the run."""
    return min(MAX_WORKERS, usable_cpus())


@pytest.fixture
def port() -> int:
    return free_port()

