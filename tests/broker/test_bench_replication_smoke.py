"""The replication benchmark's --quick run works end to end and reports every figure it promises."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(90)
def test_bench_replication_quick(tmp_path):
    r = run_benchmark("bench_replication.py", timeout=80, tmpdir=tmp_path)
    assert list(tmp_path.iterdir()) == []                  # every node's store is gone
    assert r["quick"] is True and r["runs"] == 1 and r["host_probe_ms"] > 0
    assert len(r["load_avg"]["before"]) == len(r["load_avg"]["after"]) == 3

    up = r["catch_up"]
    assert up["backlog_mb"] >= 64 and up["behind_bytes"] == 0           # the slave has the whole backlog
    assert up["mb_s"] > 0 and up["seconds"] > 0
    assert up["master_ha_cpu_ms_per_mb"] > 0 and up["slave_ha_cpu_ms_per_mb"] > 0
    assert 0 < up["master_ha_rss_mb"] and 0 < up["slave_ha_rss_mb"]

    batched = r["async_batched"]
    assert batched["errors"] == 0 and batched["msgs_s"] > 0 and batched["behind_bytes"] == 0
    assert batched["lag_samples"] > 0
    assert 0 <= batched["lag_p50_kib"] <= batched["lag_p99_kib"] <= batched["lag_max_kib"]
    assert batched["caught_up_ms"] >= 0 and batched["master_ha_cpu_us_per_msg"] > 0

    sync = r["sync_master"]
    assert sync["errors"] == 0, sync
    for mode in ("async", "sync"):
        figures = sync[mode]
        assert figures["errors"] == 0 and figures["error_codes"] == {}, figures
        assert figures["msgs_s"] > 0 and 0 < figures["p50_ms"] <= figures["p99_ms"]
    assert sync["msgs_s_ratio"] > 0 and sync["p50_ratio"] > 0 and sync["p99_ratio"] > 0
    assert all(r[s]["host_probe_ms"] > 0 for s in ("catch_up", "async_batched", "sync_master"))
