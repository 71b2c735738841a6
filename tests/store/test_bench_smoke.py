"""The store benchmark's --quick run works and reports every figure as JSON."""

from __future__ import annotations

import os

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(120)
def test_bench_store_quick_json(tmp_path):
    figures = run_benchmark("bench_store.py", "--dir", str(tmp_path), timeout=110)
    for key in ("append_batch32_128B_msgs_per_s", "append_single_4KiB_mb_per_s", "encode_us_per_record_128B",
                "read_msgs_per_s", "dispatch_msgs_per_s", "dispatch_keys_msgs_per_s", "recovery_normal_s",
                "recovery_abnormal_s", "recovery_rebuild_s", "scrub_records_per_s", "background_scrub_cpu_mb_per_s",
                "rss_peak_mb"):
        assert figures[key] > 0, key
    assert figures["rss_grown_gb"] >= 0.05 and "read_msgs_per_s_pass" in figures and figures["host_probe_ms"] > 0
    assert os.listdir(tmp_path) == []  # the temporary store is gone
