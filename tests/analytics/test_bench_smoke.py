"""The analytics benchmark's --quick run works and reports every scan figure as JSON."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(200)
def test_bench_analytics_quick_json(tmp_path):
    figures = run_benchmark("bench_analytics.py", "--dir", str(tmp_path), timeout=190)
    for key in ("scan_msgs_per_s", "scan_cold_msgs_per_s", "scan_cpu_us_per_msg", "scan_worker_cpu_us_per_msg",
                "scan_jvm_cpu_us_per_msg", "scan_narrow_msgs_per_s", "scan_groupby_msgs_per_s", "spark_start_s"):
        assert figures[key] > 0, key
    assert figures["store_messages"] == 20_000 and figures["scan_partitions"] == 1
    assert figures["report_pass"] is None and "report_1day_s" not in figures  # the report has its own tests
    assert isinstance(figures["scan_pass"], bool) and figures["host_probe_ms"] > 0
    assert list(tmp_path.iterdir()) == []  # the inputs are gone
