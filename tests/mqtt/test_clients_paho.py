"""paho-mqtt (PyPI), unchanged, in MQTT 3.1.1 and 5.0 modes against the broker: what a device can rely on.

Every wait is on a client callback with a deadline. Where a test shows that something did NOT happen
(no will after a clean DISCONNECT, no message after a retained delete, no duplicate in a shared group),
it waits for a marker published after the moment it would have happened, on the same topic: the broker
keeps one topic's messages in order, so a message that was due arrives before the marker.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support.mqtt import WAIT, Client, Will, unique
from tests.support.waits import wait_until

VERSIONS = [pytest.param(4, id="v311"), pytest.param(5, id="v5")]
SESSION_TAKEN_OVER = 0x8E


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_wildcards(mqtt_client, version):
    """'+' matches exactly one level, '#' the parent and every level below it."""
    root = unique("wild")
    plus, hash_ = mqtt_client(version=version), mqtt_client(version=version)
    assert plus.subscribe(f"{root}/+/temp", qos=1) == [1]
    assert hash_.subscribe(f"{root}/#", qos=1) == [1]
    pub = mqtt_client(version=version)
    topics = [f"{root}/1/temp", f"{root}/1/x/temp", f"{root}/2/hum", root, f"{root}/end/temp"]
    for t in topics:
        pub.publish(t, t.encode(), qos=1)
    got = hash_.messages.wait_for(lambda ms: {m.topic for m in ms} >= set(topics), what="every topic under #")
    assert sorted(m.topic for m in got) == sorted(topics)
    want = [f"{root}/1/temp", f"{root}/end/temp"]
    got = plus.messages.wait_for(lambda ms: {m.topic for m in ms} >= set(want), what="the '+' matches")
    assert sorted(m.topic for m in got) == sorted(want)
    assert all(m.payload == m.topic.encode() for m in got)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_qos_levels(mqtt_client, version):
    """QoS 0, 1 and 2 publishes reach subscribers at the lower of the publish's and the subscription's QoS."""
    topic = unique("qos")
    subs = {qos: mqtt_client(version=version) for qos in (0, 1, 2)}
    for qos, sub in subs.items():
        assert sub.subscribe(topic, qos=qos) == [qos]
    pub = mqtt_client(version=version)
    for qos in (0, 1, 2):
        assert pub.publish(topic, f"q{qos}".encode(), qos=qos) == 0
    for granted, sub in subs.items():
        got = sub.messages.take(3)
        assert {m.payload: m.qos for m in got} == {f"q{q}".encode(): min(q, granted) for q in (0, 1, 2)}
        assert not any(m.retain for m in got)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_empty_payload(mqtt_client, version):
    """A zero-length payload is a message like any other (MQTT 3.3.3): acknowledged and delivered empty."""
    topic = unique("empty")
    sub = mqtt_client(version=version)
    sub.subscribe(topic, qos=1)
    pub = mqtt_client(version=version)
    assert pub.publish(topic, b"", qos=1) == 0
    pub.publish(topic, b"marker", qos=1)
    assert [(m.payload, m.qos) for m in sub.messages.until(b"marker")] == [(b"", 1), (b"marker", 1)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_retained_message_and_its_deletion(mqtt_client, version):
    """A retained message goes to a later subscriber (retain flag set); an empty retained publish deletes it."""
    root = unique("ret")
    pub = mqtt_client(version=version)
    pub.publish(f"{root}/a", b"kept", qos=1, retain=True)
    pub.publish(f"{root}/b", b"marker", qos=1, retain=True)
    late = mqtt_client(version=version)
    late.subscribe(f"{root}/+", qos=1)
    got = late.messages.wait_for(lambda ms: len(ms) >= 2, what="both retained messages")
    assert sorted((m.topic, m.payload, m.retain) for m in got) == [
        (f"{root}/a", b"kept", True), (f"{root}/b", b"marker", True)]

    pub.publish(f"{root}/a", b"", qos=1, retain=True)          # deletes the retained message of root/a
    later = mqtt_client(version=version)
    later.subscribe(f"{root}/+", qos=1)
    later.messages.wait_for(lambda ms: any(m.topic == f"{root}/b" for m in ms), what="the retained marker")
    pub.publish(f"{root}/a", b"live", qos=1)
    got = later.messages.until(b"live")
    assert [(m.topic, m.payload) for m in got if m.topic == f"{root}/a"] == [(f"{root}/a", b"live")]
    assert not got[-1].retain


def watched_device(mqtt_client, version: int) -> tuple[str, Client, Client]:
    """(will topic, a subscriber of it, a connected client with a QoS 1 will "device lost" on it)."""
    topic = unique("will")
    watcher = mqtt_client(version=version)
    watcher.subscribe(topic, qos=1)
    return topic, watcher, mqtt_client(version=version, will=Will(topic, b"device lost", qos=1))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_will_on_unclean_disconnect(mqtt_client, version):
    """A client whose connection drops without DISCONNECT has its will published."""
    topic, watcher, device = watched_device(mqtt_client, version)
    device.kill()
    got = watcher.messages.take(1)
    assert (got[0].topic, got[0].payload, got[0].qos) == (topic, b"device lost", 1)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_no_will_on_clean_disconnect(mqtt_client, version):
    """A clean DISCONNECT discards the will."""
    topic, watcher, device = watched_device(mqtt_client, version)
    device.disconnect()
    mqtt_client(version=version).publish(topic, b"marker", qos=1)
    got = watcher.messages.until(b"marker")
    assert [m.payload for m in got] == [b"marker"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_session_takeover(mqtt_broker, mqtt_client, version):
    """A second CONNECT with the same client id closes the first connection; 5.0 says with a DISCONNECT
    0x8E (section 3.1.4), which Mosquitto 2.0.11 leaves out: it only closes the connection."""
    client_id = unique("takeover")
    first = mqtt_client(client_id, version=version)
    second = mqtt_client(client_id, version=version)
    assert first.disconnected.wait(WAIT), "the first connection was not closed"
    if version == 5 and mqtt_broker.kind != "mosquitto":
        assert first.disconnect_reason == SESSION_TAKEN_OVER
    topic = unique("takeover")
    second.subscribe(topic, qos=1)
    second.publish(topic, b"still here", qos=1)
    assert [m.payload for m in second.messages.take(1)] == [b"still here"]
    assert not second.disconnected.is_set()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_persistent_session_gets_messages_sent_while_away(mqtt_client, version):
    """clean_session=0 (3.1.1) / clean start 0 with a session expiry (5.0): the subscription outlives the
    connection and the QoS 1 messages published meanwhile arrive at the reconnect, in order."""
    client_id, topic = unique("persist"), unique("persist")
    options = {"version": version, "clean": version == 5, "session_expiry": 300 if version == 5 else None}
    device = mqtt_client(client_id, **options)
    assert not device.connack.session_present
    device.subscribe(topic, qos=1)
    device.disconnect()
    pub = mqtt_client(version=version)
    sent = [f"away-{i}".encode() for i in range(5)]
    for body in sent:
        pub.publish(topic, body, qos=1)
    back = mqtt_client(client_id, **{**options, "clean": False})
    assert back.connack.session_present
    got = back.messages.take(len(sent))
    assert [(m.topic, m.payload, m.qos) for m in got] == [(topic, body, 1) for body in sent]


@pytest.mark.timeout(90)
def test_v5_properties_arrive_intact(mqtt_client):
    """User properties (order and repeats kept), response topic, correlation data, content type, payload
    format and message expiry reach a 5.0 subscriber; the responder answers on the response topic with the
    correlation data, and the requester gets it (request/response). A 3.1.1 subscriber gets the payload."""
    root = unique("props")
    responder, old = mqtt_client(version=5), mqtt_client(version=4)
    responder.subscribe(f"{root}/request", qos=1)
    old.subscribe(f"{root}/request", qos=1)
    requester = mqtt_client(version=5)
    requester.subscribe(f"{root}/reply", qos=1)
    user = [("region", "eu"), ("k", "v1"), ("k", "v2"), ("émoji", "☃")]
    requester.publish(f"{root}/request", b'{"on": true}', qos=1, properties={
        "user_property": user, "response_topic": f"{root}/reply", "correlation_data": b"\x00\x01\xfe\xff",
        "content_type": "application/json", "payload_format_indicator": 1, "message_expiry_interval": 3600})
    [request] = responder.messages.take(1)
    props = request.properties
    assert request.payload == b'{"on": true}'
    assert props["user_property"] == user
    assert props["response_topic"] == f"{root}/reply"
    assert props["correlation_data"] == b"\x00\x01\xfe\xff"
    assert props["content_type"] == "application/json"
    assert props["payload_format_indicator"] == 1
    assert 3000 < props["message_expiry_interval"] <= 3600
    assert [m.payload for m in old.messages.take(1)] == [b'{"on": true}']

    responder.publish(props["response_topic"], b"done", qos=1,
                      properties={"correlation_data": props["correlation_data"]})
    [reply] = requester.messages.take(1)
    assert (reply.topic, reply.payload, reply.properties["correlation_data"]) == \
        (f"{root}/reply", b"done", b"\x00\x01\xfe\xff")


@pytest.mark.timeout(90)
def test_v5_topic_alias_from_the_client(mqtt_client):
    """A 5.0 client maps a topic alias once, then publishes with an empty topic name and the alias; the
    alias can be remapped. Subscribers see the full topic names."""
    root = unique("alias")
    sub = mqtt_client(version=5)
    sub.subscribe(f"{root}/#", qos=1)
    pub = mqtt_client(version=5)
    assert pub.connack.properties.get("topic_alias_maximum", 0) >= 1
    assert pub.publish(f"{root}/x", b"1", qos=1, properties={"topic_alias": 1}) == 0
    assert pub.publish("", b"2", qos=1, properties={"topic_alias": 1}) == 0
    assert pub.publish(f"{root}/y", b"3", qos=1, properties={"topic_alias": 1}) == 0
    assert pub.publish("", b"4", qos=1, properties={"topic_alias": 1}) == 0
    got = sub.messages.take(4)
    assert sorted((m.payload, m.topic) for m in got) == [
        (b"1", f"{root}/x"), (b"2", f"{root}/x"), (b"3", f"{root}/y"), (b"4", f"{root}/y")]
    assert not pub.disconnected.is_set()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("version", VERSIONS)
def test_shared_subscription_delivers_each_message_to_one_member(mqtt_client, version):
    """$share/<group>/<filter>: every message goes to exactly one of the group's two members."""
    topic, group = unique("shared"), unique("g")
    members = [mqtt_client(version=version) for _ in range(2)]
    for member in members:
        member.subscribe(f"$share/{group}/{topic}", qos=1)
    pub = mqtt_client(version=version)
    sent = [f"m{i}".encode() for i in range(20)]
    for body in sent:
        pub.publish(topic, body, qos=1)

    def got() -> list[bytes]:
        return [m.payload for member in members for m in member.messages.all()]
    wait_until(lambda: len(got()) >= len(sent), timeout=WAIT, message=f"{len(sent)} shared deliveries")
    pub.publish(topic, b"marker", qos=1)           # a duplicate of an earlier message would come before it
    wait_until(lambda: b"marker" in got(), timeout=WAIT, message="the marker")
    counts = Counter(got())
    assert counts == Counter([*sent, b"marker"]), f"duplicates or losses: {counts}"
    assert all(m.topic == topic for member in members for m in member.messages.all())
