"""The SmartGo-and-Redis benchmark's --quick run measures every workload on both sides and compares them."""

from __future__ import annotations

import pytest

from tests.support.debian import need
from tests.support.waits import run_benchmark

#: Workload -> messages in flight, the same on both sides.
IN_FLIGHT = {"sync": 16, "durable": 16, "pipe32": 32, "pipe1024": 1024, "consume": 8}


@pytest.mark.timeout(300)
def test_bench_vs_redis_quick(tmp_path):
    need("redis-server", "redis-server")          # the peer: installed from Debian on a fresh machine
    need("redis-benchmark", "redis-tools")
    r = run_benchmark("bench_vs_redis.py", timeout=240, tmpdir=tmp_path)
    assert list(tmp_path.iterdir()) == []          # every node's and every redis-server's store is gone
    assert r["redis"].startswith("7."), r["redis"]
    assert set(r["workloads"]) == set(IN_FLIGHT), r["workloads"].keys()
    for name, w in r["workloads"].items():
        for side in ("smartgo", "redis"):
            f = w[side]
            assert f["errors"] == 0 and f["in_flight"] == IN_FLIGHT[name], (name, side, f)
            assert f["msgs_s"] > 0 and f["cpu_us_per_msg"] > 0 and f["loadgen_cpu_us_per_msg"] > 0, (name, side, f)
        assert w["ratio"]["msgs_s"] > 0 and w["ratio"]["cpu_us_per_msg"] > 0, (name, w)
    for side in ("smartgo", "redis"):                # the whole backlog drained, the group's offsets committed
        consume = r["workloads"]["consume"][side]
        assert consume["msgs"] == r["backlog"] == 20_000, consume
        assert r["backlog"] - 32 * 8 <= consume["committed"] <= r["backlog"], consume
    assert set(r["pass"]) == set(r["targets"]) and all(isinstance(v, bool) for v in r["pass"].values()), r["pass"]


@pytest.mark.timeout(180)
def test_bench_vs_redis_alternates_runs(tmp_path):
    """Two runs a side: each on a fresh redis-server whose stream starts empty, the second sized by the first."""
    need("redis-server", "redis-server")
    need("redis-benchmark", "redis-tools")
    r = run_benchmark("bench_vs_redis.py", "--runs", "2", "--only", "sync,pipe32", timeout=150, tmpdir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert r["runs"] == 2 and set(r["workloads"]) == {"sync", "pipe32"}, r
    for w in r["workloads"].values():
        assert w["smartgo"]["runs"] == w["redis"]["runs"] == 2, w
        assert w["redis"]["errors"] == 0 and w["redis"]["msgs"] > 0 and w["ratio"]["msgs_s"] > 0, w
