"""benchmarks/bench_mqtt.py --quick runs SmartGo and Mosquitto side by side (amqtt is left out: its
venv comes from PyPI), and every scenario's counts add up."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(200)
def test_bench_mqtt_quick(tmp_path: Path) -> None:
    r = run_benchmark("bench_mqtt.py", "--brokers", "smartgo,mosquitto", timeout=180, tmpdir=tmp_path)
    for broker in ("smartgo", "mosquitto"):
        assert r[broker]["available"] is True, r[broker]
        figures = r[broker]
        for scenario in ("qos0_publish", "qos1_publish", "fanout", "latency"):
            f = figures[scenario]
            assert f["errors"] == 0 and f["failed_runs"] == 0, f
            assert f["accepted_total"] == f["sent"] > 0, f
            assert f["delivered_total"] == f["expected_deliveries"] == f["sent"] * f["subscribers"], f
            assert f["cpu_us_per_msg"] > 0 and f["host_probe_ms"] > 0, f
        assert figures["qos0_publish"]["msgs_s"] > 0 and figures["qos1_publish"]["msgs_s"] > 0
        assert figures["fanout"]["subscribers"] == 100 and figures["fanout"]["deliveries_s"] > 0
        assert 0 < figures["latency"]["p50_ms"] <= figures["latency"]["p99_ms"]
    rows = {row["row"]: row for row in r["table"]}
    qos1 = rows["qos1 publish msgs/s"]
    assert qos1["smartgo_vs_mosquitto"] == round(qos1["smartgo"] / qos1["mosquitto"], 2)
    assert qos1["amqtt"] is None and qos1["smartgo_vs_amqtt"] is None
    assert "amqtt" not in r and "qos1 publish msgs/s vs mosquitto" in r["pass"]
    assert list(tmp_path.iterdir()) == [], "the benchmark left files behind"
