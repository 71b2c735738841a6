"""The transactions benchmark's --quick run works end to end: every committed message is delivered,
and every figure it promises is there."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(120)
def test_bench_transactions_quick():
    r = run_benchmark("bench_transactions.py", timeout=110)
    assert r["quick"] is True and r["concurrency"] == 16 and r["host_probe_ms"] > 0
    for mode in ("plain", "tx"):
        f = r[mode]
        assert f["msgs_s"] > 0 and 0 < f["p50_ms"] <= f["p99_ms"] and f["broker_cpu_us_per_msg"] > 0, (mode, f)
    assert r["tx"]["all_delivered"] is True and 0 < r["tx_to_plain"]
