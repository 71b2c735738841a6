"""The request-reply benchmark's --quick run works end to end and reports every figure it promises."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(120)
def test_bench_reply_quick():
    r = run_benchmark("bench_reply.py", timeout=110)
    assert r["quick"] is True and r["requesters"] == 1 and r["net_actors"] == 1 and r["host_probe_ms"] > 0
    rep = r["reply"]
    assert rep["errors"] == 0 and rep["round_trips"] > 0 and rep["replied"] >= rep["round_trips"]
    assert rep["round_trips_s"] > 0 and 0 < rep["p50_ms"] <= rep["p99_ms"]
    assert rep["broker_cpu_us_per_round_trip"] > 0 and rep["cpu_s"]["broker"] >= 0
