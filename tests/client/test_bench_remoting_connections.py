"""benchmarks/bench_remoting_connections.py --quick: a real node through two small steps of heartbeating
RocketMQ clients; every figure the docs table needs is there and adds up, the node lists the clients
in their groups, and the run leaves no files behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(150)
def test_bench_remoting_connections_quick(tmp_path: Path) -> None:
    r = run_benchmark("bench_remoting_connections.py", timeout=140, tmpdir=tmp_path)
    assert r["quick"] is True and r["steps"] == [300, 1000] and r["heartbeat_interval"] == 5.0
    s = r["smartgo"]
    assert s["stopped"] is None and s["failures"] == {} and s["net_actors"] == 1, s
    assert s["baseline"]["pss_mib"] > 0 and s["baseline"]["cpu_pct"] >= 0
    assert [step["step"] for step in s["steps"]] == [300, 1000]
    for step in s["steps"]:
        assert step["connections"] == step["step"] and step["failures"] == {} and step["lost"] == 0, step
        assert step["connect_rate"] > 0 and step["accept_rate"] > 0 and step["pss_mib"] > 0
        assert step["pss_kib_per_conn"] == pytest.approx(step["pss_anon_kib_per_conn"] + step["pss_file_kib_per_conn"]
                                                         + step["pss_shmem_kib_per_conn"], abs=0.05)
        assert {"supervisor", "broker", "net-0"} <= set(step["processes"]) and step["cpu_busiest"]
        beats = step["heartbeats"]
        # a window of 1.1 intervals: every client heartbeats once or twice in it, each answered SUCCESS
        assert step["step"] <= beats["sent"] <= 2 * step["step"] and beats["refused"] == 0, beats
        assert 0 < beats["p50_ms"] <= beats["p99_ms"], beats
        assert step["registered"] == {"groups": 2, "expected": step["step"] // 5, "listed": step["step"] // 5,
                                      "missing": 0, "unexpected": 0}, step["registered"]
        assert step["pushed"] == {}, "the groups were created without consumer-ids notices"
    assert r["target"]["connections"] == 1000 and r["target"]["at_target_scale"] is False
    assert list(tmp_path.iterdir()) == [], "the benchmark left files behind"
