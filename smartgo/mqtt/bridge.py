"""MQTT topics and SmartGo messages, both ways: which SmartGo topic and queue a device publish is stored in
(setting mqtt_topic_map), the message properties that carry its MQTT topic, QoS, retain flag and 5.0
properties to RocketMQ consumers, and the delivery a stored message (from a device or a RocketMQ producer)
becomes for MQTT subscribers. Pure functions: the engine calls them around its store client."""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass

from smartgo.client.errors import MessageError
from smartgo.client.message import Prop, check_topic
from smartgo.mqtt.topics import matches, split_share, valid_filter, valid_topic_name

__all__ = ["DEFAULT_TOPIC_MAP", "TopicMap", "publish_properties", "Delivery", "delivery_from_message",
           "MQTT_TOPIC", "MQTT_QOS", "MQTT_RETAIN", "MQTT_CLIENT", "MQTT_CONTENT_TYPE", "MQTT_PAYLOAD_FORMAT",
           "MQTT_RESPONSE_TOPIC", "MQTT_CORRELATION", "MQTT_EXPIRY", "MQTT_USER", "MQTT_EMPTY", "EMPTY_BODY",
           "USER_PREFIX", "mqtt_topic_of"]

DEFAULT_TOPIC_MAP = "#=MQTT"

MQTT_TOPIC = "mqttTopic"
MQTT_QOS = "mqttQos"
MQTT_RETAIN = "mqttRetain"
MQTT_CLIENT = "mqttClient"
MQTT_CONTENT_TYPE = "mqttContentType"
MQTT_PAYLOAD_FORMAT = "mqttPayloadFormat"
MQTT_RESPONSE_TOPIC = "mqttResponseTopic"
MQTT_CORRELATION = "mqttCorrelation"
MQTT_EXPIRY = "mqttExpiry"
#: Every 5.0 user property in order, repeats and empty strings included (JSON pairs): what MQTT subscribers get.
MQTT_USER = "mqttUser"
#: "1" when the MQTT payload is empty: the store keeps a one-byte body (a SmartGo message has one).
MQTT_EMPTY = "mqttEmpty"
EMPTY_BODY = b"\x00"
#: A 5.0 user property whose name RocketMQ or the bridge reserves is stored under this prefix.
USER_PREFIX = "mqtt.up."

#: The names RocketMQ gives a meaning (MessageConst): a user property may not take them.
_ROCKETMQ_NAMES = frozenset(value for name, value in vars(Prop).items() if name.isupper())
#: The property record's separators (name \x01 value \x02): a string holding one would corrupt the record.
_SEPARATORS = ("\x01", "\x02")


def _storable(text: str) -> bool:
    return _SEPARATORS[0] not in text and _SEPARATORS[1] not in text


class TopicMap:
    """The rules of setting mqtt_topic_map: comma-separated filter=SmartGoTopic, the first rule whose MQTT
    filter matches a topic wins. A topic no rule matches is refused (so is a $-topic unless a rule's filter
    starts with $: # does not match $SYS/x). Filters may not contain a comma or be shared ($share/...)."""

    __slots__ = ("rules", "topics", "_known")

    #: MQTT topics whose answer is remembered (devices publish to the same topics again and again)
    KNOWN = 1 << 16

    def __init__(self, rules: list[tuple[str, str]]) -> None:
        #: (MQTT filter, SmartGo topic) in priority order
        self.rules = rules
        self._known: dict[str, str | None] = {}
        #: the SmartGo topics the rules name, distinct, in rule order: what the bridge creates and pulls
        self.topics = list(dict.fromkeys(topic for _, topic in rules))

    @classmethod
    def parse(cls, text: str) -> TopicMap:
        """ValueError naming the setting and the rule on anything malformed."""
        rules = []
        for n, rule in enumerate(text.split(","), 1):
            rule = rule.strip()
            topic_filter, eq, topic = (part.strip() for part in rule.rpartition("="))
            where = f"mqtt_topic_map rule {n} {rule!r}"
            if not eq or not topic_filter:
                raise ValueError(f"{where}: expected <MQTT topic filter>=<SmartGo topic>, e.g. 'devices/#=DEVICES'")
            if not valid_filter(topic_filter) or not _storable(topic_filter):
                raise ValueError(f"{where}: {topic_filter!r} is not a valid MQTT topic filter")
            if split_share(topic_filter)[0] is not None:
                raise ValueError(f"{where}: a shared subscription ($share/...) is not a topic filter to map")
            try:
                check_topic(topic)
            except MessageError as exc:
                raise ValueError(f"{where}: SmartGo {exc}") from None
            rules.append((topic_filter, topic))
        return cls(rules)

    def smartgo_topic(self, mqtt_topic: str) -> str | None:
        """The SmartGo topic a publish to mqtt_topic is stored in; None: refuse it (no rule matches, or the
        topic holds a character the property record cannot carry: U+0001 or U+0002)."""
        known = self._known
        if mqtt_topic in known:
            return known[mqtt_topic]
        found = None
        if _storable(mqtt_topic):
            found = next((topic for topic_filter, topic in self.rules if matches(topic_filter, mqtt_topic)), None)
        if len(known) >= self.KNOWN:
            known.clear()
        known[mqtt_topic] = found
        return found

    @staticmethod
    def queue_for(mqtt_topic: str, queue_count: int) -> int:
        """The queue of a publish: by its MQTT topic, so the messages of one topic keep their order."""
        return zlib.crc32(mqtt_topic.encode("utf-8")) % queue_count


def publish_properties(mqtt_topic: str, qos: int, retain: bool, client_id: str, props: dict,
                       now_ms: int) -> dict[str, str]:
    """The SmartGo message properties of a device publish. props are its 5.0 properties (codec names; empty
    for 3.1.1). User properties keep their names unless RocketMQ or the bridge reserves them (USER_PREFIX
    then) for RocketMQ consumers and filters, where a name repeated keeps its last value and an empty name or
    value is not stored (RocketMQ's property record drops it); all of them, in order, are in MQTT_USER for
    MQTT subscribers. ValueError if a string holds U+0001 or U+0002, which the record cannot carry.
    The caller checked mqtt_topic with TopicMap.smartgo_topic."""
    out = {MQTT_TOPIC: mqtt_topic, MQTT_QOS: str(qos), MQTT_RETAIN: "1" if retain else "0",
           MQTT_CLIENT: client_id, Prop.TAGS: mqtt_topic, Prop.KEYS: mqtt_topic}
    if not props:
        return out
    users = props.get("user_property", ())
    for name, value in users:
        if name in _ROCKETMQ_NAMES or name.startswith("mqtt"):
            name = USER_PREFIX + name
        if name and value:
            out[name] = value
    if users:
        out[MQTT_USER] = json.dumps([list(pair) for pair in users], separators=(",", ":"))
    if "content_type" in props:
        out[MQTT_CONTENT_TYPE] = props["content_type"]
    if "payload_format_indicator" in props:
        out[MQTT_PAYLOAD_FORMAT] = str(props["payload_format_indicator"])
    if "response_topic" in props:
        out[MQTT_RESPONSE_TOPIC] = props["response_topic"]
    if "correlation_data" in props:
        out[MQTT_CORRELATION] = bytes(props["correlation_data"]).hex()
    if "message_expiry_interval" in props:
        out[MQTT_EXPIRY] = str(now_ms + 1000 * int(props["message_expiry_interval"]))
    for name, value in out.items():
        if not (_storable(name) and _storable(value)):
            raise ValueError(f"MQTT property {name!r} holds U+0001 or U+0002, which a SmartGo message "
                             "property cannot carry")
    return out


@dataclass(slots=True)
class Delivery:
    """A stored message on its way to MQTT subscribers. retain is the publisher's RETAIN flag: subscribers
    see it only with retain-as-published. properties are the 5.0 PUBLISH properties to forward (codec
    names); their message_expiry_interval is what remained when the delivery was made: resend it as
    ceil((expires_ms - now) / 1000)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    client_id: str
    properties: dict
    #: absolute expiry in ms since the epoch; 0 = never
    expires_ms: int = 0


def mqtt_topic_of(smartgo_topic: str, properties: dict[str, str]) -> str:
    """The property mqttTopic, else the TAGS, else the SmartGo topic: the first that is a valid topic name
    (a RocketMQ tag may hold + or #; a SmartGo topic name always is one)."""
    for topic in (properties.get(MQTT_TOPIC), properties.get(Prop.TAGS)):
        if topic and valid_topic_name(topic):
            return topic
    return smartgo_topic


def delivery_from_message(smartgo_topic: str, properties: dict[str, str], body: bytes,
                          now_ms: int | None = None) -> Delivery:
    """The delivery of a stored message (published by a device, or sent with the RocketMQ API to a bridged
    topic: QoS 1 then, unless it sets mqttQos). Properties RocketMQ or the bridge reserve stay behind; every
    other one is a user property. now_ms (default: the clock) dates the remaining expiry."""
    qos = properties.get(MQTT_QOS, "1")
    out: dict = {}
    users = []
    if MQTT_USER in properties:
        try:
            users = [(str(name), str(value)) for name, value in json.loads(properties[MQTT_USER])]
        except (ValueError, TypeError):
            users = []
    else:
        for name, value in properties.items():
            if name.startswith(USER_PREFIX):
                users.append((name[len(USER_PREFIX):], value))
            elif name not in _ROCKETMQ_NAMES and not name.startswith("mqtt"):
                users.append((name, value))
    if users:
        out["user_property"] = users
    if MQTT_CONTENT_TYPE in properties:
        out["content_type"] = properties[MQTT_CONTENT_TYPE]
    if properties.get(MQTT_PAYLOAD_FORMAT) in ("0", "1"):
        out["payload_format_indicator"] = int(properties[MQTT_PAYLOAD_FORMAT])
    response = properties.get(MQTT_RESPONSE_TOPIC)
    if response and valid_topic_name(response):
        out["response_topic"] = response
    correlation = properties.get(MQTT_CORRELATION)
    if correlation:
        try:
            out["correlation_data"] = bytes.fromhex(correlation)
        except ValueError:
            pass  # not one the bridge wrote: a RocketMQ producer's own property, nothing to forward
    expires_ms = int(properties[MQTT_EXPIRY]) if properties.get(MQTT_EXPIRY, "").isdigit() else 0
    if expires_ms:
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        out["message_expiry_interval"] = max(0, -(-(expires_ms - now_ms) // 1000))
    if properties.get(MQTT_EMPTY) == "1":
        body = b""
    return Delivery(mqtt_topic_of(smartgo_topic, properties), body, int(qos) if qos in ("0", "1", "2") else 1,
                    properties.get(MQTT_RETAIN) == "1", properties.get(MQTT_CLIENT, ""), out, expires_ms)
