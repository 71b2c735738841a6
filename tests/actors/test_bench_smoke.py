"""The actor-runtime benchmarks still run (--quick) and report every figure (--json)."""

from __future__ import annotations

import pytest

from smartgo.testing import run_benchmark


@pytest.mark.timeout(120)
def test_bench_ring_quick():
    r = run_benchmark("bench_ring.py", timeout=100)
    assert r["records_per_s"] > 0 and r["mb_per_s"] > 0 and r["host_probe_ms"] > 0
    assert set(r["scaling_records_per_s"]) == {"1", "2", "4"}
    for tag in ("pinned", "unpinned"):
        assert 0 < r["wake_us"][tag]["p50"] <= r["wake_us"][tag]["p99"]


@pytest.mark.timeout(120)
def test_bench_restart_quick():
    r = run_benchmark("bench_restart.py", timeout=100)
    fs = r["restart"]["forkserver"]
    assert 0 < fs["min_s"] <= fs["median_s"] <= fs["max_s"] and fs["kills"] == 2 and r["host_probe_ms"] > 0
