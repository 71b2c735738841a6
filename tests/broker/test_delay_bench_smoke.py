"""The delay benchmark's --quick run works end to end and reports every figure it promises."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(120)
@pytest.mark.parametrize("timer", [False, True], ids=["delay_level", "timer"])
def test_bench_delay_quick(timer):
    r = run_benchmark("bench_delay.py", *(["--timer"] if timer else []), timeout=110)
    assert r["quick"] is True and r["timer"] is timer and r["messages"] == 300 and r["host_probe_ms"] > 0
    assert r["hops"] == 1                                        # 1 s: one hop of a timer, one level's wait
    assert r["errors"] == 0 and r["missing"] == 0 and r["early"] == 0
    for kind in ("store", "e2e"):
        f = r["levels"]["1s"][kind]
        assert 0 <= f["min_ms"] <= f["p50_ms"] <= f["p99_ms"] <= f["max_ms"] < 1000, (kind, f)
    # CPU times tick every 10 ms: 300 quick messages may cost the schedule actor less than a tick
    assert 0 <= r["schedule_cpu_us_per_msg"] < 10_000 and isinstance(r["pass"], bool)
