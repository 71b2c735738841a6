"""The MQTT bridge end to end, real clients on both sides of a live node: device publishes (paho-mqtt
3.1.1 and 5.0) consumed with the SmartGo SDK and the RocketMQ C++ client, filtered by tag and SQL92;
SDK sends to a bridged topic delivered to MQTT subscribers; a custom mqtt_topic_map.

Where a test shows a message did NOT arrive (filtered out), the messages that must not come are
published to a topic stored in the same queue as a marker published after them (queue =
crc32(MQTT topic) % queues, smartgo/mqtt/bridge.py): a consumer, reading a queue in order on one
thread, gets them before the marker if they pass its filter.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from smartgo.client import Admin, Message, MessageSelector, Producer
from smartgo.mqtt.bridge import MQTT_CONTENT_TYPE, MQTT_CORRELATION, MQTT_RESPONSE_TOPIC, USER_PREFIX
from tests.compat.conftest import cpp
from tests.mqtt.test_clients_mosquitto import messages, pub, sub
from tests.support.mqtt import Broker, Client, start_smartgo, unique
from tests.support.stored import Consumed, read_topic

pytestmark = pytest.mark.timeout(120)

QUEUES = 8                                   # mqtt_topic_queues, the default
VERSIONS = [pytest.param(4, id="v311"), pytest.param(5, id="v5")]


def registry(broker: Broker) -> str:
    return f"127.0.0.1:{broker.node.registry_port}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A node with the default mapping '#=MQTT'."""
    b = start_smartgo(tmp_path_factory.mktemp("bridge") / "node", {"mqtt_topic_queues": QUEUES})
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def clients(broker: Broker) -> Iterator[list]:
    """Clients and consumers a test made (anything with close()), closed after it."""
    made: list = []
    yield made
    for c in reversed(made):
        c.close()


def connect(made: list, broker: Broker, version: int = 5, **options) -> Client:
    client = Client(broker, version=version, **options)
    made.append(client)
    client.connect()
    return client


def consume(made: list, broker: Broker, topic: str, expression: str | MessageSelector) -> Consumed:
    c = Consumed(registry(broker), topic, expression)
    made.append(c)
    return c


def same_queue(topic: str, template: str) -> str:
    """The first topic template.format(n) stored in the same queue as topic."""
    want = zlib.crc32(topic.encode()) % QUEUES
    return next(t for t in (template.format(n) for n in range(1000))
                if t != topic and zlib.crc32(t.encode()) % QUEUES == want)


@pytest.mark.parametrize("version", VERSIONS)
def test_device_publish_reaches_sdk_push_consumer(broker, clients, version):
    """Each QoS, retain, and (5.0) user properties, content type, response topic and correlation data are
    message properties an SDK push consumer of the bridged topic sees; TAGS and KEYS are the MQTT topic."""
    topic = f"{unique('bridge')}/42/state"
    consumer = consume(clients, broker, "MQTT", topic)
    device = connect(clients, broker, version)
    props = {}
    if version == 5:
        props = {"user_property": [("site", "north"), ("KEYS", "reserved"), ("mqttX", "mine")],
                 "content_type": "application/json", "response_topic": f"{topic}/reply",
                 "correlation_data": b"\x00\x01corr"}
    for qos in (0, 1, 2):
        assert device.publish(topic, f"q{qos}".encode(), qos=qos, retain=qos == 1, properties=props) == 0
    got = consumer.wait_for(lambda ms: len(ms) >= 3, what="the three publishes")
    assert sorted(m.body for m in got) == [b"q0", b"q1", b"q2"]
    for m in got:
        qos = int(m.body[1:])
        assert (m.topic, m.tags, m.properties["KEYS"]) == ("MQTT", topic, topic)
        assert m.properties["mqttTopic"] == topic
        assert m.properties["mqttQos"] == str(qos)
        assert m.properties["mqttRetain"] == ("1" if qos == 1 else "0")
        assert m.properties["mqttClient"] == device.client_id
        if version == 5:
            assert m.properties["site"] == "north"
            assert m.properties[USER_PREFIX + "KEYS"] == "reserved"
            assert m.properties[USER_PREFIX + "mqttX"] == "mine"
            assert m.properties[MQTT_CONTENT_TYPE] == "application/json"
            assert m.properties[MQTT_RESPONSE_TOPIC] == f"{topic}/reply"
            assert m.properties[MQTT_CORRELATION] == b"\x00\x01corr".hex()
        else:
            assert "site" not in m.properties and MQTT_CONTENT_TYPE not in m.properties


def test_tag_and_sql92_subscriptions_filter(broker, clients):
    """A tag subscription 'devices/42/cmd' gets that topic only; SQL92 on mqttQos and on a user property
    gets exactly the matching publishes."""
    run = uuid.uuid4().hex[:12]
    mine = "devices/42/cmd"
    other = same_queue(mine, "devices/{}/cmd")
    by_tag = consume(clients, broker, "MQTT", mine)
    by_qos = consume(clients, broker, "MQTT", MessageSelector.by_sql(f"run = '{run}' AND mqttQos > 1"))
    by_prop = consume(clients, broker, "MQTT", MessageSelector.by_sql(f"run = '{run}' AND site = 'north'"))
    device = connect(clients, broker, 5)
    sent = []
    for i, (topic, qos, site) in enumerate([(other, 2, "north"), (mine, 0, "south"), (other, 1, "north"),
                                            (mine, 2, "south"), (other, 0, "south"), (mine, 1, "north")]):
        body = f"{run}-{i}".encode()
        sent.append((body, topic, qos, site))
        device.publish(topic, body, qos=qos, properties={"user_property": [("run", run), ("site", site)]})
    marker = f"{run}-end".encode()
    device.publish(mine, marker, qos=2, properties={"user_property": [("run", run), ("site", "north")]})

    got = by_tag.until_body(marker)
    assert {m.tags for m in got} == {mine}, "a tag subscription got another MQTT topic"
    assert {m.body for m in got if m.body.startswith(run.encode())} == \
        {b for b, t, _, _ in sent if t == mine} | {marker}
    got = by_qos.until_body(marker)
    assert sorted(m.body for m in got) == sorted([b for b, _, q, _ in sent if q == 2] + [marker])
    got = by_prop.until_body(marker)
    assert sorted(m.body for m in got) == sorted([b for b, _, _, s in sent if s == "north"] + [marker])
    assert all(m.properties["site"] == "north" for m in got)


def test_sdk_sends_reach_mqtt_subscribers(broker, clients):
    """An SDK send to the bridged topic with tag 'devices/42/cmd' reaches subscribers of that topic and of
    'devices/+/cmd' (QoS 1, its user properties as 5.0 user properties); one without a tag reaches a
    subscriber of the SmartGo topic's name."""
    exact = connect(clients, broker, 5)
    wild = connect(clients, broker, 4)
    named = connect(clients, broker, 5)
    assert exact.subscribe("devices/42/cmd", qos=2) == [2]
    assert wild.subscribe("devices/+/cmd", qos=1) == [1]
    assert named.subscribe("MQTT", qos=1) == [1]
    run = uuid.uuid4().hex[:12]
    with Producer(f"PG_{run}", registry(broker)) as producer:
        producer.send(Message("MQTT", f"{run}-cmd".encode(), tags="devices/42/cmd", properties={"color": "red"}))
        producer.send(Message("MQTT", f"{run}-broadcast".encode()))
    mine = [m for m in exact.messages.until(f"{run}-cmd".encode()) if m.payload.startswith(run.encode())]
    assert [(m.topic, m.qos, m.retain) for m in mine] == [("devices/42/cmd", 1, False)]
    assert ("color", "red") in mine[0].properties["user_property"]
    mine = [m for m in wild.messages.until(f"{run}-cmd".encode()) if m.payload.startswith(run.encode())]
    assert [(m.topic, m.qos) for m in mine] == [("devices/42/cmd", 1)]
    got = named.messages.until(f"{run}-broadcast".encode())
    assert [(m.topic, m.payload, m.qos) for m in got if m.payload.startswith(run.encode())] == \
        [("MQTT", f"{run}-broadcast".encode(), 1)]
    assert not any(m.payload == f"{run}-broadcast".encode() for m in exact.messages.all() + wild.messages.all())


def test_cpp_client_consumes_a_device_publish(broker, clients, tmp_path: Path):
    """The RocketMQ C++ client (tests/compat/cpp_client.py) reads a device publish by its MQTT topic tag."""
    topic = f"{unique('cpp')}/1/state"
    device = connect(clients, broker, 4)
    device.publish(topic, b"from a device", qos=1)
    [got] = cpp(tmp_path, registry(broker), [{"op": "pull", "topic": "MQTT", "group": f"CG_{uuid.uuid4().hex[:8]}",
                                              "expression": topic}])
    assert [(m["topic"], m["tags"], m["keys"], m["body"]) for m in got] == \
        [("MQTT", topic, topic, "from a device")]


def test_mosquitto_tools_across_the_bridge(broker, clients, mosquitto_clients):
    """mosquitto_pub (5.0, a user property) to an SDK consumer; an SDK send to mosquitto_sub (3.1.1)."""
    topic = f"{unique('mosq')}/7/cmd"
    consumer = consume(clients, broker, "MQTT", topic)
    pub(mosquitto_clients, broker, "mqttv5", topic, "from mosquitto_pub", 2, "-D", "publish", "user-property",
        "site", "west")
    [got] = consumer.wait_for(lambda ms: len(ms) >= 1, what="the mosquitto_pub message")
    assert (got.tags, got.body, got.properties["mqttQos"], got.properties["site"]) == \
        (topic, b"from mosquitto_pub", "2", "west")
    proc = sub(mosquitto_clients, broker, "mqttv311", topic, 1)
    try:
        with Producer(f"PG_{uuid.uuid4().hex[:8]}", registry(broker)) as producer:
            producer.send(Message("MQTT", b"to mosquitto_sub", tags=topic))
        lines = messages(proc, 1)
    finally:
        proc.close()
    assert lines == [f"{topic} 1 0 |to mosquitto_sub"]


def test_custom_topic_map_stores_device_topics_in_one_topic(tmp_path: Path):
    """mqtt_topic_map 'devices/#=DEVICES,#=MQTT': device topics are stored in DEVICES (the SDK reads them
    there, by tag), others in MQTT, deliveries come back from both, and no topic is made per device."""
    broker = start_smartgo(tmp_path / "node", {"mqtt_topic_map": "devices/#=DEVICES,#=MQTT"})
    made: list = []
    try:
        with Admin(registry(broker)) as admin:
            before = set(admin.topic_list())
        assert {"DEVICES", "MQTT"} <= before
        watcher = connect(made, broker, 5)
        watcher.subscribe(["devices/+/state", "other/#"], qos=1)
        consumer = consume(made, broker, "DEVICES", "*")
        device = connect(made, broker, 5)
        devices = [f"devices/{n}/state" for n in range(20)]
        for t in devices:
            device.publish(t, t.encode(), qos=1)
        device.publish("other/x", b"other", qos=1)
        got = consumer.wait_for(lambda ms: len(ms) >= len(devices), what="every device publish")
        assert sorted((m.topic, m.tags, m.body) for m in got) == sorted(("DEVICES", t, t.encode()) for t in devices)
        assert [(m.tags, m.body) for m in read_topic(registry(broker), "MQTT", tmp_path / "offsets")] == \
            [("other/x", b"other")]
        delivered = watcher.messages.wait_for(lambda ms: len(ms) >= len(devices) + 1, what="every delivery")
        assert sorted(m.topic for m in delivered) == sorted([*devices, "other/x"])
        with Admin(registry(broker)) as admin:
            made_now = {t for t in set(admin.topic_list()) - before if not t.startswith("%RETRY%")}
        assert not made_now, "a topic was made per device"
    finally:
        for c in reversed(made):
            c.close()
        broker.stop()
