"""The MQTT <-> SmartGo mapping (smartgo.mqtt.bridge): rules of mqtt_topic_map, the message properties of a
device publish, and the delivery a stored message becomes - through the store's own property codec, as a
RocketMQ consumer and the bridge's puller see it."""

from __future__ import annotations

import zlib

import pytest

from smartgo.client.message import Message
from smartgo.mqtt.bridge import (DEFAULT_TOPIC_MAP, EMPTY_BODY, MQTT_EMPTY, Delivery, TopicMap, delivery_from_message,
                                 publish_properties)
from smartgo.store.record import decode_properties, encode_properties

NOW = 1_800_000_000_000


def stored(props: dict[str, str]) -> dict[str, str]:
    """What a consumer reads back: the properties through the record's name\\x01value\\x02 encoding."""
    return decode_properties(encode_properties(props))


def test_default_map_takes_every_topic_but_dollar_ones() -> None:
    rules = TopicMap.parse(DEFAULT_TOPIC_MAP)
    assert rules.topics == ["MQTT"]
    assert rules.smartgo_topic("devices/42/cmd") == "MQTT"
    assert rules.smartgo_topic("/") == "MQTT"
    assert rules.smartgo_topic("$SYS/broker/load") is None


def test_first_matching_rule_wins() -> None:
    rules = TopicMap.parse(" devices/+/cmd = COMMANDS, devices/# =DEVICES,$SYS/#=SYSTEM, #=MQTT, x/#=DEVICES ")
    assert rules.topics == ["COMMANDS", "DEVICES", "SYSTEM", "MQTT"]
    assert rules.smartgo_topic("devices/42/cmd") == "COMMANDS"
    assert rules.smartgo_topic("devices/42/state") == "DEVICES"
    assert rules.smartgo_topic("devices") == "DEVICES"
    assert rules.smartgo_topic("$SYS/x") == "SYSTEM"
    assert rules.smartgo_topic("x/y") == "MQTT"
    assert rules.smartgo_topic("a=b") == "MQTT"


def test_unmatched_and_unstorable_topics_are_refused() -> None:
    rules = TopicMap.parse("devices/#=DEVICES")
    assert rules.smartgo_topic("other/1") is None
    assert rules.smartgo_topic("devices/\x01") is None  # the property record's separators
    assert rules.smartgo_topic("devices/\x02") is None
    assert rules.smartgo_topic("devices/\x03") == "DEVICES"


@pytest.mark.parametrize(("text", "message"), [
    ("", "rule 1 '': expected <MQTT topic filter>=<SmartGo topic>"),
    ("#=MQTT,", "rule 2 '': expected"),
    ("devices/#", "expected <MQTT topic filter>=<SmartGo topic>"),
    ("=MQTT", "expected"),
    ("a/#/b=MQTT", "'a/#/b' is not a valid MQTT topic filter"),
    ("$share/g/#=MQTT", "shared subscription"),
    ("#=MQTT/X", "SmartGo topic 'MQTT/X' is invalid"),
    ("#=", "SmartGo topic '' is invalid"),
    ("a\x01=MQTT", "is not a valid MQTT topic filter"),
])
def test_bad_rules_name_the_setting(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="mqtt_topic_map") as caught:
        TopicMap.parse(text)
    assert message in str(caught.value)


def test_queue_by_topic_hash() -> None:
    rules = TopicMap.parse(DEFAULT_TOPIC_MAP)
    for topic in ("devices/42/cmd", "é", "a"):
        assert rules.queue_for(topic, 8) == zlib.crc32(topic.encode()) % 8
    queues = {rules.queue_for(f"devices/{i}/cmd", 8) for i in range(200)}
    assert queues == set(range(8))  # spread, so one hot branch does not take one queue


def test_properties_of_a_311_publish() -> None:
    props = publish_properties("devices/42/state", 1, True, "dev-42", {}, NOW)
    assert props == {"mqttTopic": "devices/42/state", "mqttQos": "1", "mqttRetain": "1", "mqttClient": "dev-42",
                     "TAGS": "devices/42/state", "KEYS": "devices/42/state"}


def test_properties_of_a_50_publish() -> None:
    five = {"user_property": [("color", "red"), ("TAGS", "spoof"), ("mqttQos", "2"), ("UNIQ_KEY", "u"),
                              ("color", "blue"), ("shape", "")],
            "content_type": "application/json", "payload_format_indicator": 1, "response_topic": "replies/42",
            "correlation_data": b"\x00\xffid", "message_expiry_interval": 30}
    props = stored(publish_properties("devices/42/cmd", 2, False, "app", five, NOW))
    assert props["TAGS"] == "devices/42/cmd"
    assert props["mqttQos"] == "2"
    assert props["color"] == "blue"  # a repeated name keeps its last value (properties are a map)
    assert props["mqtt.up.TAGS"] == "spoof"
    assert props["mqtt.up.mqttQos"] == "2"
    assert props["mqtt.up.UNIQ_KEY"] == "u"
    assert "shape" not in props  # the record drops an empty value
    assert props["mqttContentType"] == "application/json"
    assert props["mqttPayloadFormat"] == "1"
    assert props["mqttResponseTopic"] == "replies/42"
    assert props["mqttCorrelation"] == "00ff6964"
    assert props["mqttExpiry"] == str(NOW + 30_000)


@pytest.mark.parametrize("five", [{"user_property": [("a\x01", "b")]}, {"user_property": [("a", "b\x02")]},
                                  {"content_type": "x\x01"}, {"response_topic": "r\x02"}])
def test_separator_characters_are_refused(five: dict) -> None:
    with pytest.raises(ValueError, match="U\\+0001 or U\\+0002"):
        publish_properties("a", 0, False, "c", five, NOW)


def test_device_publish_round_trip() -> None:
    five = {"user_property": [("color", "red"), ("TAGS", "mine"), ("size", "L")], "content_type": "text/plain",
            "payload_format_indicator": 1, "response_topic": "replies/42", "correlation_data": b"\x01\x02",
            "message_expiry_interval": 30}
    props = stored(publish_properties("devices/42/cmd", 2, True, "app-1", five, NOW))
    d = delivery_from_message("DEVICES", props, b"payload", now_ms=NOW + 10_500)
    assert d == Delivery("devices/42/cmd", b"payload", 2, True, "app-1",
                         {"user_property": [("color", "red"), ("TAGS", "mine"), ("size", "L")],
                          "content_type": "text/plain", "payload_format_indicator": 1, "response_topic": "replies/42",
                          "correlation_data": b"\x01\x02", "message_expiry_interval": 20}, NOW + 30_000)
    assert delivery_from_message("DEVICES", props, b"", now_ms=NOW + 40_000).properties["message_expiry_interval"] == 0


def test_user_properties_keep_order_repeats_and_empty_strings() -> None:
    """MQTT 5.0 (3.3.2.3.10): user properties reach subscribers in order, a name may repeat; RocketMQ
    consumers see the named ones (the last of a repeated name, none empty)."""
    users = [("b", "2"), ("a", "1"), ("b", "3"), ("", "x"), ("e", ""), ("TAGS", "t"), ("quote", '"\\')]
    props = stored(publish_properties("a/b", 1, False, "dev", {"user_property": users}, NOW))
    assert (props["b"], props["a"], props["mqtt.up.TAGS"], props["quote"]) == ("3", "1", "t", '"\\')
    assert "e" not in props
    assert delivery_from_message("MQTT", props, b"x").properties == {"user_property": users}


def test_a_malformed_user_list_forwards_none() -> None:
    d = delivery_from_message("MQTT", {"mqttUser": "[1, 2", "color": "red"}, b"")
    assert d.properties == {}


def test_empty_payload_survives_the_store() -> None:
    """A SmartGo message has a body: an empty MQTT payload is stored as EMPTY_BODY and MQTT_EMPTY=1, and
    delivered empty (an empty retained publish deletes the retained message)."""
    props = stored({**publish_properties("a/b", 1, True, "dev", {}, NOW), MQTT_EMPTY: "1"})
    assert delivery_from_message("MQTT", props, EMPTY_BODY).payload == b""
    assert delivery_from_message("MQTT", {}, EMPTY_BODY).payload == EMPTY_BODY  # a RocketMQ message's own byte


def test_311_publish_round_trip() -> None:
    props = stored(publish_properties("a/b", 0, False, "dev", {}, NOW))
    assert delivery_from_message("MQTT", props, b"x") == Delivery("a/b", b"x", 0, False, "dev", {}, 0)


def test_rocketmq_send_reaches_the_tag_topic() -> None:
    """A RocketMQ producer's message to a bridged topic: the MQTT topic is its tag, QoS 1, no retain, its own
    properties are user properties and RocketMQ's are not forwarded."""
    msg = Message("DEVICES", b"reboot", tags="devices/42/cmd", keys="k1", properties={"color": "red"})
    props = stored({**msg.wire_properties(), "UNIQ_KEY": "7F00", "CLUSTER": "c", "mqttSomething": "x"})
    d = delivery_from_message("DEVICES", props, b"reboot")
    assert d == Delivery("devices/42/cmd", b"reboot", 1, False, "", {"user_property": [("color", "red")]}, 0)


@pytest.mark.parametrize(("props", "topic", "qos"), [
    ({}, "DEVICES", 1),
    ({"TAGS": "a+b"}, "DEVICES", 1),  # a tag that is no topic name
    ({"TAGS": "t", "mqttTopic": "m/1"}, "m/1", 1),
    ({"mqttTopic": "m/#", "TAGS": "t"}, "t", 1),
    ({"mqttQos": "0"}, "DEVICES", 0),
    ({"mqttQos": "2"}, "DEVICES", 2),
    ({"mqttQos": "3"}, "DEVICES", 1),
    ({"mqttQos": "x"}, "DEVICES", 1),
])
def test_reverse_topic_and_qos(props: dict[str, str], topic: str, qos: int) -> None:
    d = delivery_from_message("DEVICES", props, b"")
    assert (d.topic, d.qos, d.retain) == (topic, qos, False)


def test_foreign_values_of_bridge_properties_are_not_forwarded() -> None:
    d = delivery_from_message("T", {"mqttCorrelation": "not hex", "mqttExpiry": "soon", "mqttPayloadFormat": "7",
                                    "mqttResponseTopic": "r/+"}, b"")
    assert d.properties == {}
    assert d.expires_ms == 0


def test_topic_map_remembers_answers_within_a_bound(monkeypatch):
    monkeypatch.setattr(TopicMap, "KNOWN", 4)
    tm = TopicMap.parse("devices/#=DEVICES,#=MQTT")
    answers = [tm.smartgo_topic(f"devices/{i}/up") for i in range(10)] + [tm.smartgo_topic("$SYS/x")]
    assert answers == ["DEVICES"] * 10 + [None]
    assert len(tm._known) <= 4
    assert tm.smartgo_topic("other/1") == "MQTT" and tm.smartgo_topic("other/1") == "MQTT"
