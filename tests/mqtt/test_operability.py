"""MQTT operability on a real node: `smartgo admin mqtt-*`, the metrics page, `smartgo health` and the
stats files, with a paho-mqtt client connected."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from analytics.stats_schema import SPARK_DDL
from smartgo.stats_schema import FILE_GLOB
from tests.support.broker import FREE_PORT
from tests.support.mqtt import Broker, Client, start_smartgo, unique
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = start_smartgo(tmp_path_factory.mktemp("ops") / "node", {"metrics_port": FREE_PORT, "stats_interval": 1})
    try:
        yield broker
    finally:
        broker.stop()


def smartgo(broker: Broker, *argv: str, ok: bool = True) -> subprocess.CompletedProcess:
    env = {"SMARTGO_REGISTRY": f"127.0.0.1:{broker.node.registry_port}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "smartgo.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    if ok:
        assert done.returncode == 0, f"{argv}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def admin_json(broker: Broker, *argv: str) -> dict:
    answers = json.loads(smartgo(broker, "admin", *argv, "--json").stdout)["brokers"]
    assert list(answers) == [f"127.0.0.1:{broker.node.port}"]
    return answers[f"127.0.0.1:{broker.node.port}"]


@pytest.mark.timeout(180)
def test_admin_lists_a_client_and_its_subscription_then_kicks_it(node: Broker) -> None:
    device = Client(node, unique("dev"), session_expiry=300)
    other = Client(node, unique("other"))
    try:
        device.connect()
        device.subscribe(f"devices/{device.client_id}/cmd", qos=1)
        other.connect()
        clients = admin_json(node, "mqtt-clients", "--client", device.client_id)
        assert clients["actors"] == ["mqtt-0"] and clients["errors"] == {} and clients["total"] == 1
        [row] = clients["items"]
        assert row["client_id"] == device.client_id and row["version"] == 5 and row["listener"] == "tcp"
        assert row["subscriptions"] == 1 and row["keep_alive"] == device.keepalive
        assert row["peer"].startswith("127.0.0.1:")
        subs = admin_json(node, "mqtt-subscriptions", "--filter", f"devices/{device.client_id}/")
        assert [(s["client_id"], s["filter"], s["qos"]) for s in subs["items"]] == [
            (device.client_id, f"devices/{device.client_id}/cmd", 1)]
        table = smartgo(node, "admin", "mqtt-clients").stdout
        assert device.client_id in table and other.client_id in table and "LISTENER" in table

        kicked = smartgo(node, "admin", "mqtt-kick", "--client", device.client_id).stdout
        assert f"disconnected {device.client_id}" in kicked
        assert device.disconnected.wait(20), "the kicked client saw no disconnect"
        assert device.disconnect_reason == 0x98                  # administrative action
        assert not other.disconnected.is_set()
        sessions = admin_json(node, "mqtt-sessions", "--client", device.client_id)["items"]
        assert [(s["connected"], s["expiry"], s["subscriptions"]) for s in sessions] == [(False, 300, 1)]
        again = smartgo(node, "admin", "mqtt-kick", "--client", device.client_id, ok=False)
        assert again.returncode == 1 and "no MQTT client" in again.stderr
    finally:
        device.close()
        other.close()


def metrics(broker: Broker) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.node.metrics_port}/metrics", timeout=10) as page:
        text = page.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("smartgo_mqtt_"):
            name, _, value = line.rpartition(" ")
            out[name.replace('cluster="DefaultCluster",node_type="broker",node_id="broker-a"', "")
                .replace("{}", "").replace("{,", "{")] = float(value)
    return out


@pytest.mark.timeout(180)
def test_metrics_health_and_stats_files_count_mqtt_traffic(node: Broker) -> None:
    before = wait_until(lambda: (m := metrics(node)).get("smartgo_mqtt_actors_answering") == 1 and m, timeout=20,
                        interval=0.2, message="the broker actor polled its MQTT actor")
    sub, pub = Client(node, unique("sub")), Client(node, unique("pub"))
    try:
        sub.connect()
        topic = f"ops/{sub.client_id}"
        sub.subscribe(topic, qos=1)
        pub.connect()
        for i in range(5):
            pub.publish(topic, f"m{i}", qos=1)
        sub.messages.take(5)
        grew = wait_until(lambda: (m := metrics(node))['smartgo_mqtt_messages_out_total{qos="1"}']
                          >= before.get('smartgo_mqtt_messages_out_total{qos="1"}', 0) + 5 and m,
                          timeout=20, interval=0.2, message="messages out counted")
        assert grew['smartgo_mqtt_messages_in_total{qos="1"}'] >= before['smartgo_mqtt_messages_in_total{qos="1"}'] + 5
        assert grew['smartgo_mqtt_events_total{event="connects"}'] >= before[
            'smartgo_mqtt_events_total{event="connects"}'] + 2
        assert grew["smartgo_mqtt_connections"] >= 2 and grew["smartgo_mqtt_subscriptions"] >= 1

        board = smartgo(node, "health", "--store-dir", str(node.node.store)).stdout
        assert "\nmqtt-0 " in board
        line = next(li for li in board.splitlines() if li.startswith("mqtt: "))
        assert "connections" in line and "(1 of 1 MQTT actors answering)" in line
        report = json.loads(smartgo(node, "health", "--broker", f"127.0.0.1:{node.node.port}", "--json").stdout)
        assert "mqtt-0" in [a["name"] for a in report["actors"]]
        assert report["mqtt"]["messages_in"][1] >= 5 and report["mqtt"]["answering"] == ["mqtt-0"]

        def counted() -> int:
            records = [json.loads(line) for f in (node.node.store / "stats").glob(FILE_GLOB)
                       for line in f.read_text().splitlines() if line.strip()]
            return sum(r["mqtt"]["messages_in"][1] for r in records if "mqtt" in r)
        assert wait_until(lambda: counted() >= 5, timeout=20, interval=0.2, message="MQTT counts in the stats files")
        record = json.loads(next(iter((node.node.store / "stats").glob(FILE_GLOB))).read_text().splitlines()[-1])
        assert {"connections", "sessions", "subscriptions", "retained", "messages_in", "messages_out", "dropped",
                "bad_packets", "auth_failures"} <= set(record["mqtt"])
        read = re.findall(r"(\w+): ", SPARK_DDL.split("mqtt struct<", 1)[1].split(">>,", 1)[0])
        assert len(read) >= 10 and set(read) <= set(record["mqtt"])         # the report reads what is written
    finally:
        sub.close()
        pub.close()
