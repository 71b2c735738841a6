"""benchmarks/bench_connections.py --quick: SmartGo and Mosquitto through two small steps; every figure
the docs table needs is there and adds up, and the run leaves no files behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(150)
def test_bench_connections_quick(tmp_path: Path) -> None:
    r = run_benchmark("bench_connections.py", timeout=140, tmpdir=tmp_path)
    assert r["quick"] is True and r["steps"] == [300, 1000]
    for broker in ("smartgo", "mosquitto"):
        b = r[broker]
        assert b["available"] is True and b["stopped"] is None and b["failures"] == {}, b
        assert b["baseline"]["pss_mib"] > 0 and b["baseline"]["cpu_rest_pct"] >= 0
        assert [s["step"] for s in b["steps"]] == [300, 1000]
        for s in b["steps"]:
            assert s["connections"] == s["step"] and s["failures"] == {} and s["lost"] == 0, s
            assert s["connect_rate"] > 0 and s["accept_rate"] > 0 and s["connect_seconds"] > 0
            assert 1.0 <= s["settle_seconds"] <= 21.5 and s["cpu_rest_busiest"], s
            assert s["pss_mib"] > 0 and s["swarm_kib_per_conn"] > 0 and s["cpu_rest_pct"] >= 0
            assert s["pss_kib_per_conn"] == pytest.approx(s["pss_anon_kib_per_conn"] + s["pss_file_kib_per_conn"]
                                                          + s["pss_shmem_kib_per_conn"], abs=0.05)
            assert s["ping"]["sent"] == s["ping"]["answered"] == s["step"], s["ping"]
            assert 0 < s["ping"]["p50_ms"] <= s["ping"]["p99_ms"]
            assert s["command"]["sent"] == s["command"]["arrived"] == 40 and s["command"]["wrong"] == 0
            assert s["command"]["unacked"] == 0 and 0 < s["command"]["p50_ms"] <= s["command"]["p99_ms"]
            assert set(s["processes"]) >= ({"supervisor", "net-0", "mqtt-0"} if broker == "smartgo" else {"mosquitto"})
            if broker == "smartgo":
                rq = s["rocketmq_command"]
                assert rq["sent"] == rq["arrived"] == 20 and rq["wrong"] == 0, rq
    assert r["smartgo"]["mqtt_actors"] == 1
    assert "rocketmq_command" not in r["mosquitto"]["steps"][0]
    assert list(tmp_path.iterdir()) == [], "the benchmark left files behind"


@pytest.mark.timeout(150)
def test_bench_connections_two_nodes_and_the_storm(tmp_path: Path) -> None:
    """--nodes 2: the devices are spread over two nodes behind one registry, the nodes' counts add up and
    commands published on node 0 arrive on node 1 too; --storm: node 0 restarts and every persistent-
    session device is back with its session, no actor restarted, its commands arrive."""
    r = run_benchmark("bench_connections.py", "--brokers", "smartgo", "--nodes", "2", "--storm", timeout=140,
                      tmpdir=tmp_path)
    b = r["smartgo"]
    assert b["nodes"] == 2 and b["stopped"] is None and b["failures"] == {}, b
    for s in b["steps"]:
        assert [n["connections"] for n in s["nodes"]] == [s["step"] // 2] * 2 and s["held_total"] == s["step"], s
        assert all(n["pss_mib"] > 0 for n in s["nodes"])
        for kind in ("command", "rocketmq_command"):
            away = s[kind]["other_nodes"]
            assert s[kind]["sent"] == s[kind]["arrived"] and s[kind]["wrong"] == 0, s[kind]
            assert away["sent"] == away["arrived"] > s[kind]["sent"] // 2 and away["p99_ms"] > 0, s[kind]
    storm = b["storm"]
    assert storm["devices"] == storm["back"] == 500 and storm["failures"] == {}, storm
    assert storm["reconnected"] >= 500 and storm["resumed"] == storm["reconnected"] and storm["sessions_lost"] == 0
    assert storm["reconnects"]["dropped: closed by the broker"] >= 500 and "session lost" not in storm["reconnects"]
    assert storm["stop_exit_code"] == 0 and 0 < storm["healthy_seconds"] <= storm["back_seconds"], storm
    assert storm["reconnect_rate"] > 0 and storm["pss_mib_before"] > 0 and storm["pss_mib_peak"] > 0
    assert storm["actors_restarted"] == [] and storm["actor_restarts"] == {} and storm["supervisor_restarts"] == 0
    assert storm["lost"] == 0
    assert storm["command"]["sent"] == storm["command"]["arrived"] == 40 and storm["command"]["wrong"] == 0
    assert storm["rocketmq_command"]["sent"] == storm["rocketmq_command"]["arrived"] == 20
    assert list(tmp_path.iterdir()) == [], "the benchmark left files behind"
