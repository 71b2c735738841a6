"""The control-plane benchmark's --quick run works end to end and reports every figure it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_bench_control_quick():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_control.py"), "--quick", "--json"],
                         capture_output=True, text=True, timeout=170, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["quick"] is True
    for scenario in ("heartbeat", "heartbeat_max", "offsets", "offsets_sync", "route"):
        assert r[scenario].get("errors", 0) == 0, r[scenario]
    assert r["heartbeat"]["joined"] == r["heartbeat"]["clients"] and r["heartbeat"]["heartbeats"] > 0
    assert r["heartbeat"]["cpu_pct"] > 0 and r["heartbeat_max"]["cpu_us_per_heartbeat"] > 0
    assert r["offsets"]["updates_s"] > 0 and r["offsets_sync"]["updates_s"] > 0
    assert 0 < r["route"]["median_ms"] <= r["route"]["p99_ms"]
    assert set(r["pass"]) == {"heartbeat_cpu_pct", "offsets_updates_s"}
