"""The failover benchmark's --quick run works end to end and reports every figure it promises."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(150)
def test_bench_failover_quick():
    r = run_benchmark("bench_failover.py", timeout=140)
    assert r["quick"] is True and r["runs"] == 1 and r["failover_delay_s"] == 1.0 and r["host_probe_ms"] > 0
    assert r["lost"] == 0 and r["pass"] is True and r["acked"] > 200
    assert 1.0 <= r["promoted_s"] < 30 and 1.0 <= r["resumed_s"] < 30      # never before failover_delay
    assert isinstance(r["failed_sends"], (int, float))


@pytest.mark.timeout(150)
def test_bench_failover_switchover_quick():
    r = run_benchmark("bench_failover.py", "--switchover", timeout=140)
    assert r["switchover"] is True and r["lost"] == 0 and r["pass"] is True and r["acked"] > 200
    assert 0 < r["switch_s"] <= r["promoted_s"] < 30 and r["switch_s"] < r["resumed_s"] < 30   # no failover_delay
