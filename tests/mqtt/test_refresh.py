"""Records outlive the CommitLog's retention: a persistent session and a retained message whose
records pass a quarter of file_reserved_hours are stored again, though nothing changed."""

from __future__ import annotations

import pytest

from smartgo.client.blocking import Admin
from tests.support.broker import start_broker
from tests.support.mqtt import Broker, Client, unique
from tests.support.waits import free_ports, wait_for_port, wait_until


@pytest.mark.timeout(180)
def test_an_idle_session_and_a_retained_message_are_stored_again(tmp_path):
    port, = free_ports(1)
    # 0.002 h = 7.2 s of retention: records older than 1.8 s are written again
    node = start_broker(tmp_path / "node", {"mqtt_port": port, "mqtt_ws_port": 0, "file_reserved_hours": 0.002})
    try:
        wait_for_port(port, timeout=30)
        broker = Broker("smartgo", port, 0, node.reap, node=node)
        device, topic = unique("idle"), unique("kept")
        idle = Client(broker, device, version=4, clean=False)
        idle.connect()
        idle.subscribe(topic, qos=1)
        idle.disconnect()
        publisher = Client(broker)
        publisher.connect()
        assert publisher.publish(topic, b"last-known", qos=1, retain=True) == 0
        publisher.disconnect()
        with Admin(f"127.0.0.1:{node.registry_port}") as admin:
            def records(store_topic: str, key: str) -> int:
                return len(admin.query_by_key(store_topic, key, 64))
            sessions, retained = records("MQTT_SESSIONS", device), records("MQTT_RETAINED", topic)
            wait_until(lambda: records("MQTT_SESSIONS", device) >= sessions + 2
                       and records("MQTT_RETAINED", topic) >= retained + 2, 60, 0.5,
                       "the idle session's and the retained message's records stored again, twice")
        late = Client(broker)
        late.connect()
        late.subscribe(topic, qos=1)
        got = late.messages.until(b"last-known")
        assert len(got) == 1 and got[0].retain               # one retained message, however often it was kept
        late.disconnect()
    finally:
        node.reap()
