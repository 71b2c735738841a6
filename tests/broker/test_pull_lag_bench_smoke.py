"""The pull-lag benchmark's --quick run works and reports the net actor's loop lag."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(180)
def test_bench_pull_lag_quick(tmp_path):
    r = run_benchmark("bench_pull_lag.py", timeout=170, tmpdir=tmp_path)
    assert (r["queues"], r["groups"], r["quick"]) == (256, 2, True)
    assert (r["missing"], r["watchdog_kills"], r["restarts"]) == (0, 0, 0)
    assert r["drain_msgs_s"] > 0 and r["wake_s"] > 0 and r["host_probe_ms"] > 0
    assert r["net_lag_max_ms"] == r["lag_max_ms_by_actor"]["net-0"] > 0
    assert not list(tmp_path.glob("bench_pull_lag_*"))      # its stores are gone
