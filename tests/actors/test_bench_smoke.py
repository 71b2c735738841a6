"""The actor-runtime benchmarks still run (--quick) and report every figure (--json)."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(120)
def test_bench_ring_quick():
    r = run_benchmark("bench_ring.py", timeout=100)
    assert r["records_per_s"] > 0 and r["mb_per_s"] > 0 and r["host_probe_ms"] > 0
    assert set(r["scaling_records_per_s"]) == {"1", "2", "4"}
    for tag in ("pinned", "unpinned"):
        assert 0 < r["wake_us"][tag]["p50"] <= r["wake_us"][tag]["p99"]


@pytest.mark.timeout(120)
def test_bench_restart_quick(tmp_path):
    r = run_benchmark("bench_restart.py", timeout=100, tmpdir=tmp_path)
    assert list(tmp_path.iterdir()) == []                  # the node's store is gone
    assert set(r["restart"]) == {"dispatch", "net-0", "forkserver", "tracker", "forkserver+net-0"}
    for kind in r["restart"].values():
        assert 0 < kind["gap_median_s"] <= kind["gap_max_s"] and kind["healthy_median_s"] >= 0 and kind["kills"] == 1
    assert r["worst_gap_s"] == max(k["gap_max_s"] for k in r["restart"].values()) and r["quiet_gap_s"] > 0
    assert r["start_method"] == "forkserver" and r["host_probe_ms"] > 0 and r["quick"] is True
