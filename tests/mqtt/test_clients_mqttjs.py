"""MQTT.js (npm `mqtt`, pinned in node/package-lock.json), unchanged, over TCP and over WebSocket
(ws://host:<ws port>/mqtt, subprotocol mqtt), MQTT 3.1.1 and 5.0, against the broker and with paho-mqtt
on the other side: it publishes and subscribes."""

from __future__ import annotations

import pytest

from tests.support.mqtt import WAIT, unique

CASES = [pytest.param(transport, version, id=f"{transport}-{name}")
         for transport in ("tcp", "ws") for version, name in ((4, "v311"), (5, "v5"))]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport, version", CASES)
def test_mqttjs_publishes_and_subscribes(mqtt_broker, mqtt_client, node_script, transport, version):
    """MQTT.js subscribes to root/#, publishes QoS 0, 1 and 2 (5.0: with a user property) to itself and to a
    paho subscriber, then gets a paho client's publish."""
    root = unique("js")
    paho_sub = mqtt_client(version=version)
    paho_sub.subscribe(f"{root}/from-js", qos=2)
    user = [["via", transport]] if version == 5 else None
    sent = [{"topic": f"{root}/from-js", "payload": f"js {qos}", "qos": qos, "userProperties": user and dict(user)}
            for qos in (0, 1, 2)]
    js = node_script("pubsub", {
        "url": mqtt_broker.ws_url if transport == "ws" else mqtt_broker.url, "protocolVersion": version,
        "clientId": unique("mqttjs"), "subscribe": f"{root}/#", "qos": 2, "publish": sent,
        "expect": len(sent) + 1, "deadlineMs": int(WAIT * 4000)})
    assert js.json_event("subscribed")["granted"] == [2]
    assert js.json_event("published")["count"] == 3
    mqtt_client(version=version).publish(f"{root}/from-paho", b"paho", qos=1)
    assert js.json_event("done")["received"] == len(sent) + 1
    assert js.finish() == 0
    got = js.json_seen("message")

    assert sorted((m["topic"], m["payload"], m["qos"]) for m in got) == sorted(
        [(f"{root}/from-js", f"js {q}", q) for q in (0, 1, 2)] + [(f"{root}/from-paho", "paho", 1)])
    if version == 5:
        assert all(m["userProperties"] == {"via": transport} for m in got if m["topic"].endswith("from-js"))
    at_paho = paho_sub.messages.take(3)
    assert sorted((m.payload, m.qos) for m in at_paho) == [(f"js {q}".encode(), q) for q in (0, 1, 2)]
    if version == 5:
        assert all(m.properties["user_property"] == [("via", transport)] for m in at_paho)
