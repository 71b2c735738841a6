"""The actor-runtime benchmarks still run (--quick) and report every figure (--json)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from smartgo.actors.testing import ROOT


def run_bench(name: str) -> dict:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), "--quick", "--json"], capture_output=True,
                         text=True, timeout=100, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(120)
def test_bench_ring_quick():
    r = run_bench("bench_ring.py")
    assert r["records_per_s"] > 0 and r["mb_per_s"] > 0
    assert set(r["scaling_records_per_s"]) == {"1", "2", "4"}
    for tag in ("pinned", "unpinned"):
        assert 0 < r["wake_us"][tag]["p50"] <= r["wake_us"][tag]["p99"]


@pytest.mark.timeout(120)
def test_bench_restart_quick():
    r = run_bench("bench_restart.py")
    fs = r["restart"]["forkserver"]
    assert 0 < fs["min_s"] <= fs["median_s"] <= fs["max_s"] and fs["kills"] == 2
