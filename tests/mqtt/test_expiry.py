"""MQTT 5.0 message expiry of retained messages: a later subscriber is told what remains of it,
and once it has run out nobody gets it (section 3.3.2.3.3)."""

from __future__ import annotations

import time

import pytest

from tests.support.mqtt import Client, start_smartgo, unique


@pytest.mark.timeout(120)
def test_a_retained_message_expires_and_says_what_remains(tmp_path):
    broker = start_smartgo(tmp_path / "node")
    try:
        short, long = unique("short"), unique("long")
        publisher = Client(broker)
        publisher.connect()
        assert publisher.publish(short, b"gone-soon", qos=1, retain=True,
                                 properties={"message_expiry_interval": 1}) == 0
        assert publisher.publish(long, b"stays", qos=1, retain=True,
                                 properties={"message_expiry_interval": 100}) == 0
        time.sleep(2.2)              # the expiry itself is the thing under test: its second has to pass
        late = Client(broker)
        late.connect()
        late.subscribe([short, long], qos=1)
        assert publisher.publish(short, b"marker", qos=1) == 0
        got = late.messages.until(b"marker")
        assert [m.payload for m in got if m.topic == short] == [b"marker"]      # the expired one is not sent
        kept = late.messages.wait_for(lambda items: any(m.topic == long for m in items))
        stays = next(m for m in kept if m.topic == long)
        assert stays.retain and 95 <= stays.properties["message_expiry_interval"] <= 98
        late.disconnect()
        publisher.disconnect()
    finally:
        broker.stop()
