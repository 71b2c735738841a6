"""The analytics benchmark's --quick run works and reports every scan figure as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(200)
def test_bench_analytics_quick_json(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_analytics.py"), "--quick", "--json",
                          "--dir", str(tmp_path)], capture_output=True, text=True, timeout=190)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("scan_msgs_per_s", "scan_cold_msgs_per_s", "scan_cpu_us_per_msg", "scan_worker_cpu_us_per_msg",
                "scan_jvm_cpu_us_per_msg", "scan_narrow_msgs_per_s", "scan_groupby_msgs_per_s", "spark_start_s"):
        assert figures[key] > 0, key
    assert figures["store_messages"] == 20_000 and figures["scan_partitions"] == 1
    assert figures["report_pass"] is None and "report_1day_s" not in figures  # the report has its own tests
    assert isinstance(figures["scan_pass"], bool)
    assert list(tmp_path.iterdir()) == []  # the inputs are gone
