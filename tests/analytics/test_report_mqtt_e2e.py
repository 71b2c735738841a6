"""The report's MQTT table equals what devices published and received through a real node: the broker
actor writes its MQTT actors' counts into the stats records (1-second windows), run_report reads them."""

from __future__ import annotations

import json

import pytest

from analytics.report import run_report
from smartgo.stats_schema import FILE_GLOB
from tests.support.mqtt import Client, start_smartgo, unique
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(300)

QOS0, QOS1 = 6, 9


def test_report_counts_the_mqtt_messages_a_node_carried(spark, tmp_path):
    broker = start_smartgo(tmp_path / "node", {"stats_interval": 1})
    sub, pub = Client(broker, unique("sub")), Client(broker, unique("pub"))
    try:
        sub.connect()
        topic = f"report/{sub.client_id}"
        sub.subscribe(topic, qos=1)
        pub.connect()
        for i in range(QOS1):
            pub.publish(topic, f"one-{i}", qos=1)
        for i in range(QOS0):
            pub.publish(topic, f"zero-{i}", qos=0)
        sub.messages.take(QOS0 + QOS1)
        stats = broker.node.store / "stats"

        def written() -> list[dict]:
            records = [json.loads(line) for f in stats.glob(FILE_GLOB) for line in f.read_text().splitlines()]
            return [r for r in records if "mqtt" in r]
        wait_until(lambda: sum(r["mqtt"]["messages_out"][0] + r["mqtt"]["messages_out"][1] for r in written())
                   >= QOS0 + QOS1, timeout=30, interval=0.2, message="the deliveries in the stats files")
    finally:
        sub.close()
        pub.close()
        broker.stop()
    mqtt = run_report(spark, [str(stats)], tmp_path / "out").frames["mqtt"]
    assert (mqtt["in_qos1"].sum(), mqtt["in_qos0"].sum(), mqtt["in_qos2"].sum()) == (QOS1, QOS0, 0)
    assert (mqtt["out_qos1"].sum(), mqtt["out_qos0"].sum()) == (QOS1, QOS0)
    assert mqtt["msgs_in"].sum() == mqtt["msgs_out"].sum() == QOS0 + QOS1
    assert mqtt["connections"].max() == 2 and mqtt["subscriptions"].max() >= 1
    assert (tmp_path / "out" / "mqtt.png").exists() and (tmp_path / "out" / "tables" / "mqtt.csv").exists()
