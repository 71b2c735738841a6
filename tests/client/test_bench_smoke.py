"""The client benchmark runs end to end (--quick, stub broker) and reports every figure."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(120)
def test_bench_client_quick(tmp_path) -> None:
    figures = run_benchmark("bench_client.py", timeout=110, tmpdir=tmp_path)
    assert list(tmp_path.iterdir()) == []          # the registry's temp store is gone
    for mode in ("sync", "async", "batch", "consume", "blocking_sync", "sync_traced", "consume_traced", "lite",
                 "lite_blocking"):
        assert figures[f"{mode}_cpu_us_per_msg"] > 0 and figures[f"{mode}_msgs_per_s"] > 0
    assert figures["batch_cpu_us_per_msg"] < figures["sync_cpu_us_per_msg"] and figures["host_probe_ms"] > 0
