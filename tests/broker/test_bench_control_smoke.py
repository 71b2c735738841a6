"""The control-plane benchmark's --quick run works end to end and reports every figure it promises."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(180)
def test_bench_control_quick():
    r = run_benchmark("bench_control.py", timeout=170)
    assert r["quick"] is True and r["host_probe_ms"] > 0
    for scenario in ("heartbeat", "heartbeat_max", "offsets", "offsets_sync", "route", "metrics"):
        assert r[scenario].get("errors", 0) == 0, r[scenario]
    assert r["heartbeat"]["joined"] == r["heartbeat"]["clients"] and r["heartbeat"]["heartbeats"] > 0
    assert r["heartbeat"]["cpu_pct"] > 0 and r["heartbeat_max"]["cpu_us_per_heartbeat"] > 0
    assert r["offsets"]["updates_s"] > 0 and r["offsets_sync"]["updates_s"] > 0
    assert 0 < r["route"]["median_ms"] <= r["route"]["p99_ms"]
    m = r["metrics"]
    assert (m["counted_topics"], m["lag_pairs"], m["scrapes"]) == (50, 50, 3)
    assert 0 < m["median_ms"] <= m["p99_ms"] and m["page_bytes"] > 50 * 200 and m["broker_cpu_ms_per_scrape"] >= 0
    assert 0 < m["gzip_median_ms"] <= m["gzip_p99_ms"] and 0 < m["gzip_page_bytes"] < m["page_bytes"] // 4
    assert set(r["pass"]) == {"heartbeat_cpu_pct", "offsets_updates_s"}
