"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest

from tests.support import nodes as node_testing
from smartgo.cpus import usable_cpus
from tests.support.waits import free_port

MAX_WORKERS = 8


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): three workers per two usable CPUs, counted as for the
    broker's own defaults (xdist alone counts the host's physical cores, blind to the affinity
    mask and the cgroup's quota), at most MAX_WORKERS: each worker's tests start whole nodes, and
    past that the longest file bounds the run. Not one per CPU: a third of a 2-worker run on two
    CPUs is idle, tests waiting on clients' timers and restarts (7:12 at -n 2, 5:37 at -n 3 on
    the same 2-vCPU host; docs/BENCHMARKS.md, "The test suite")."""
    return max(1, min(MAX_WORKERS, usable_cpus() * 3 // 2))


@pytest.fixture
def port() -> int:
    return free_port()



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Note which nodes the test starts (its fixtures' too)."""
    item.smartgo_first_node = len(node_testing.STARTED)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report ends with the warnings of each node it started: CI keeps no store."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for store in dict.fromkeys(node_testing.STARTED[getattr(item, "smartgo_first_node", 0):]):
            lines = node_testing.warnings_in(store)
            report.sections.append((f"warnings of the node on {store}", "\n".join(lines) or "(none)"))
