"""The MQTT load generator (smartgo/mqtt/loadgen.py) and `smartgo bench mqtt` against a real Mosquitto
on a free loopback port: every scenario runs briefly and its counts must add up (every publish
confirmed, every subscriber given every publish), whatever the rates."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from smartgo.mqtt import loadgen
from smartgo.mqtt.loadgen import Load, LoadError
from tests.support.mqtt import Broker, start_mosquitto
from tests.support.waits import LOOPBACK, free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = start_mosquitto(tmp_path_factory.mktemp("loadgen"))
    try:
        yield broker
    finally:
        broker.stop()


def consistent(r: loadgen.Result) -> None:
    """What holds for every run on a healthy broker."""
    print(r)                                            # what a failure shows
    assert r.errors == 0, r.error_lines
    assert r.sent > 0
    assert r.accepted_total == r.sent                   # every publish confirmed (PUBACK, PUBCOMP, PINGRESP)
    assert 0 < r.accepted <= r.accepted_total
    assert r.msgs_s == round(r.accepted / r.seconds, 1)
    assert r.ack_p50_ms is not None and 0 < r.ack_p50_ms <= r.ack_p99_ms
    assert r.expected_deliveries == r.sent * r.subscribers
    assert r.delivered_total == r.expected_deliveries   # every subscriber got every publish
    assert r.delivered <= r.delivered_total
    if r.subscribers:
        assert r.delivery_p50_ms is not None and 0 < r.delivery_p50_ms <= r.delivery_p99_ms
    else:
        assert r.delivery_p50_ms is None and r.p50_ms == r.ack_p50_ms


def test_qos0_publish(mosquitto: Broker) -> None:
    r = loadgen.qos0_publish(LOOPBACK, mosquitto.port, seconds=1.0, publishers=4)
    consistent(r)
    assert (r.scenario, r.publishers, r.subscribers, r.qos) == ("qos0_publish", 4, 0, 0)
    assert r.sent % loadgen.QOS0_CHUNK == 0             # whole chunks, each confirmed by its PINGRESP


def test_qos1_publish(mosquitto: Broker) -> None:
    r = loadgen.qos1_publish(LOOPBACK, mosquitto.port, seconds=1.0, publishers=4, inflight=32)
    consistent(r)
    assert (r.scenario, r.qos) == ("qos1_publish", 1)


def test_qos2_publish_and_subscribe(mosquitto: Broker) -> None:
    """PUBREC -> PUBREL -> PUBCOMP on both sides; a subscriber on the publishers' topic tree."""
    r = loadgen.run(Load(LOOPBACK, mosquitto.port, 1.0, publishers=2, subscribers=1, qos=2, sub_qos=2, inflight=16,
                         backlog=5000))
    consistent(r)
    assert r.delivered_total == r.sent


def test_fanout(mosquitto: Broker) -> None:
    r = loadgen.fanout(LOOPBACK, mosquitto.port, seconds=1.0, subscribers=40)
    consistent(r)
    assert (r.publishers, r.subscribers) == (1, 40)
    assert r.delivered_total == 40 * r.sent


def test_latency_at_a_fixed_rate(mosquitto: Broker) -> None:
    r = loadgen.latency(LOOPBACK, mosquitto.port, seconds=1.5, rate=400)
    consistent(r)
    assert 500 <= r.sent <= 601                         # 400 a second for 1.5 s, paced, not flat out
    assert r.delivery_p50_ms is not None and r.p50_ms == r.delivery_p50_ms


def test_split_deals_connections_and_windows() -> None:
    parts = loadgen.split(Load(LOOPBACK, 1, publishers=3, subscribers=5, qos=1, inflight=10, processes=2))
    assert [p.publishers for p in parts] == [(0, 2), (1,)]
    assert [p.windows for p in parts] == [(4, 3), (3,)]
    assert [p.subscribers for p in parts] == [2, 3]
    qos0 = loadgen.split(Load(LOOPBACK, 1, publishers=2, qos=0, inflight=300, chunk=64, processes=1))
    assert qos0[0].windows == (2, 2)                    # 150 publishes each: two whole chunks of 64
    with pytest.raises(ValueError):
        loadgen.split(Load(LOOPBACK, 1, publishers=4, qos=1, inflight=3))


def test_no_broker_is_a_load_error() -> None:
    with pytest.raises(LoadError, match="ConnectionRefused|Errno 111"):
        loadgen.qos0_publish(LOOPBACK, free_port(), seconds=0.5, publishers=2)


def bench(*args: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "smartgo.cli", "bench", "mqtt", *args, "--json"], capture_output=True,
                         text=True, timeout=90, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_cli_publish_json(mosquitto: Broker) -> None:
    lines = bench("publish", "--port", str(mosquitto.port), "--qos", "1", "--publishers", "2", "--seconds", "2",
                  "--interval", "0.5")
    intervals, summary = lines[:-1], lines[-1]
    assert [x["type"] for x in intervals] == ["interval"] * 4
    assert [x["elapsed_s"] for x in intervals] == [0.5, 1.0, 1.5, 2.0]
    assert all(x["msgs_s"] > 0 for x in intervals)
    assert summary["type"] == "summary" and summary["scenario"] == "publish" and summary["qos"] == 1
    assert summary["errors"] == 0 and summary["accepted_total"] == summary["sent"] > 0
    assert intervals[-1]["accepted"] <= summary["accepted"]


def test_cli_fanout_json(mosquitto: Broker) -> None:
    summary = bench("fanout", "--port", str(mosquitto.port), "--subscribers", "20", "--seconds", "1")[-1]
    assert summary["subscribers"] == 20 and summary["errors"] == 0
    assert summary["delivered_total"] == summary["expected_deliveries"] == 20 * summary["sent"] > 0


def test_cli_refused_is_one_line(mosquitto: Broker) -> None:
    out = subprocess.run([sys.executable, "-m", "smartgo.cli", "bench", "mqtt", "publish", "--port", str(free_port()),
                          "--seconds", "1"], capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert out.returncode == 1
    assert out.stderr.startswith("smartgo bench: ") and len(out.stderr.strip().splitlines()) == 1, out.stderr
