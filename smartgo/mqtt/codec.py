"""Sans-IO MQTT codec (3.1, 3.1.1 and 5.0): bytes in, packet dataclasses out, and back.

One Decoder per connection direction: Decoder(server=True) reads what clients send a broker (the first
packet must be CONNECT, whose level then sets .version), Decoder(server=False) reads what a broker sends a
client (the client sets .version). A remaining length over max_packet_size is refused as soon as its
header arrives, so a peer cannot make us buffer more than one packet of the allowed size.

Errors carry the MQTT 5.0 reason code the connection must be closed with (OASIS MQTT 5.0 section 4.13):
MalformedPacket (0x81) when the bytes cannot be parsed, ProtocolError (0x82) when they parse but break a
rule, PacketTooLarge (0x95), UnsupportedProtocolVersion (0x84: a CONNECT of another level, to be answered
with a 3.1.1-format CONNACK return code 1). Checks that need the session (topic aliases, wildcards in a
topic name, packet ids in use) belong to the protocol engine.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, Union

# -- reason codes (MQTT 5.0 section 2.4) --------------------------------------------------------------------
SUCCESS = 0x00
NORMAL_DISCONNECTION = 0x00
GRANTED_QOS_0 = 0x00
GRANTED_QOS_1 = 0x01
GRANTED_QOS_2 = 0x02
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
CONTINUE_AUTHENTICATION = 0x18
RE_AUTHENTICATE = 0x19
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_ID_NOT_VALID = 0x85
BAD_USERNAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BANNED = 0x8A
SERVER_SHUTTING_DOWN = 0x8B
BAD_AUTH_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_ID_IN_USE = 0x91
PACKET_ID_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
MESSAGE_RATE_TOO_HIGH = 0x96
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
USE_ANOTHER_SERVER = 0x9C
SERVER_MOVED = 0x9D
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
CONNECTION_RATE_EXCEEDED = 0x9F
MAXIMUM_CONNECT_TIME = 0xA0
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

# -- 3.1 / 3.1.1 CONNACK return codes ---------------------------------------------------------------------
CONNACK_ACCEPTED = 0
REFUSED_PROTOCOL_VERSION = 1
REFUSED_IDENTIFIER = 2
REFUSED_SERVER_UNAVAILABLE = 3
REFUSED_BAD_CREDENTIALS = 4
REFUSED_NOT_AUTHORIZED = 5

_V3_CONNACK = {SUCCESS: CONNACK_ACCEPTED, UNSUPPORTED_PROTOCOL_VERSION: REFUSED_PROTOCOL_VERSION,
               CLIENT_ID_NOT_VALID: REFUSED_IDENTIFIER, BAD_USERNAME_OR_PASSWORD: REFUSED_BAD_CREDENTIALS,
               BAD_AUTH_METHOD: REFUSED_BAD_CREDENTIALS, NOT_AUTHORIZED: REFUSED_NOT_AUTHORIZED,
               BANNED: REFUSED_NOT_AUTHORIZED}

MAX_REMAINING_LENGTH = 268_435_455  # four bytes of variable byte integer


def connack_code_v3(reason5: int) -> int:
    """The 3.1.1 CONNACK return code for a 5.0 CONNACK reason (anything else refused as server unavailable)."""
    return _V3_CONNACK.get(reason5, REFUSED_SERVER_UNAVAILABLE)


# -- errors ---------------------------------------------------------------------------------------------------
class MqttError(Exception):
    """A packet the connection cannot survive; .reason is the 5.0 reason code to close it with.

    .packets holds the packets decoded from the same feed() before the bad one (valid, to be handled).
    """

    def __init__(self, reason: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.packets: list[Packet] = []


class MalformedPacket(MqttError):
    def __init__(self, message: str) -> None:
        super().__init__(MALFORMED_PACKET, message)


class ProtocolError(MqttError):
    def __init__(self, message: str) -> None:
        super().__init__(PROTOCOL_ERROR, message)


class PacketTooLarge(MqttError):
    def __init__(self, message: str) -> None:
        super().__init__(PACKET_TOO_LARGE, message)


class UnsupportedProtocolVersion(MqttError):
    def __init__(self, message: str) -> None:
        super().__init__(UNSUPPORTED_PROTOCOL_VERSION, message)


# -- packets --------------------------------------------------------------------------------------------------
Properties = dict[str, Any]


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    protocol_name: str = "MQTT"
    protocol_level: int = 4
    clean_start: bool = True
    keep_alive: int = 60
    client_id: str = ""
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class ConnAck:
    session_present: bool = False
    reason: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Ack:
    """The layout PUBACK, PUBREC, PUBREL and PUBCOMP share (never sent itself)."""
    packet_id: int
    reason: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PubAck(Ack):
    """QoS 1: the message is the receiver's."""


@dataclass(slots=True)
class PubRec(Ack):
    """QoS 2, step 1: received."""


@dataclass(slots=True)
class PubRel(Ack):
    """QoS 2, step 2: the sender forgets the message."""


@dataclass(slots=True)
class PubComp(Ack):
    """QoS 2, step 3: the receiver forgets the packet id."""


@dataclass(slots=True, frozen=True)
class SubOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


_OPTIONS: dict[tuple[int, bool, bool, int], SubOptions] = {}


def sub_options(qos: int, no_local: bool = False, retain_as_published: bool = False,
                retain_handling: int = 0) -> SubOptions:
    """One shared instance per combination: a node's million subscriptions hold a few dozen."""
    key = (qos, no_local, retain_as_published, retain_handling)
    options = _OPTIONS.get(key)
    if options is None:
        options = _OPTIONS[key] = SubOptions(*key)
    return options


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    topics: list[tuple[str, SubOptions]]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class SubAck:
    packet_id: int
    reasons: list[int]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    filters: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class UnsubAck:
    packet_id: int
    reasons: list[int] = field(default_factory=list)  # 5.0 only: 3.1.1 has none (ignored on encode)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PingReq:
    pass


@dataclass(slots=True)
class PingResp:
    pass


@dataclass(slots=True)
class ReasonOnly:
    """The layout DISCONNECT and AUTH share (never sent itself)."""
    reason: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Disconnect(ReasonOnly):
    """Either side closes, with a reason in 5.0."""


@dataclass(slots=True)
class Auth(ReasonOnly):
    """5.0 enhanced authentication exchange."""


Packet = Union[Connect, ConnAck, Publish, PubAck, PubRec, PubRel, PubComp, Subscribe, SubAck, Unsubscribe,
               UnsubAck, PingReq, PingResp, Disconnect, Auth]

# -- packet types and who may send them ------------------------------------------------------------------------
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15
_WILL = 0  # pseudo packet type of the will properties (type 0 is reserved on the wire)
_TYPE_NAMES = ("WILL", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL", "PUBCOMP", "SUBSCRIBE",
               "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ", "PINGRESP", "DISCONNECT", "AUTH")
_FROM_CLIENT = frozenset((CONNECT, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE, PINGREQ,
                          DISCONNECT, AUTH))
_FROM_SERVER = frozenset((CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, PINGRESP,
                          DISCONNECT, AUTH))
#: fixed header flags every packet but PUBLISH must carry (section 2.1.3; 0010 for PUBREL, SUBSCRIBE, UNSUBSCRIBE)
_FLAGS = (0, 0, 0, -1, 0, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0, 0)

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_HEAD2 = struct.Struct(">BB")
_HEAD_U16 = struct.Struct(">BBH")  # a fixed header of remaining length < 128, then a topic length or a packet id
_CONNACK4 = struct.Struct(">BBBB")
_PING_REQ = b"\xc0\x00"
_PING_RESP = b"\xd0\x00"

# -- properties (section 2.2.2.2) --------------------------------------------------------------------------------
_BYTE, _TWO, _FOUR, _VBI, _UTF8, _BINARY, _PAIR = range(7)


def _in(*types: int) -> int:
    return sum(1 << t for t in types)


_ALL = _in(CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK,
           DISCONNECT, AUTH, _WILL)
_ACKS = _in(CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH)
_MESSAGE = _in(PUBLISH, _WILL)
# (identifier, name, type, packets it may appear in)
_PROPERTY_TABLE = (
    (0x01, "payload_format_indicator", _BYTE, _MESSAGE),
    (0x02, "message_expiry_interval", _FOUR, _MESSAGE),
    (0x03, "content_type", _UTF8, _MESSAGE),
    (0x08, "response_topic", _UTF8, _MESSAGE),
    (0x09, "correlation_data", _BINARY, _MESSAGE),
    (0x0B, "subscription_identifier", _VBI, _in(PUBLISH, SUBSCRIBE)),
    (0x11, "session_expiry_interval", _FOUR, _in(CONNECT, CONNACK, DISCONNECT)),
    (0x12, "assigned_client_identifier", _UTF8, _in(CONNACK)),
    (0x13, "server_keep_alive", _TWO, _in(CONNACK)),
    (0x15, "authentication_method", _UTF8, _in(CONNECT, CONNACK, AUTH)),
    (0x16, "authentication_data", _BINARY, _in(CONNECT, CONNACK, AUTH)),
    (0x17, "request_problem_information", _BYTE, _in(CONNECT)),
    (0x18, "will_delay_interval", _FOUR, _in(_WILL)),
    (0x19, "request_response_information", _BYTE, _in(CONNECT)),
    (0x1A, "response_information", _UTF8, _in(CONNACK)),
    (0x1C, "server_reference", _UTF8, _in(CONNACK, DISCONNECT)),
    (0x1F, "reason_string", _UTF8, _ACKS),
    (0x21, "receive_maximum", _TWO, _in(CONNECT, CONNACK)),
    (0x22, "topic_alias_maximum", _TWO, _in(CONNECT, CONNACK)),
    (0x23, "topic_alias", _TWO, _in(PUBLISH)),
    (0x24, "maximum_qos", _BYTE, _in(CONNACK)),
    (0x25, "retain_available", _BYTE, _in(CONNACK)),
    (0x26, "user_property", _PAIR, _ALL),
    (0x27, "maximum_packet_size", _FOUR, _in(CONNECT, CONNACK)),
    (0x28, "wildcard_subscription_available", _BYTE, _in(CONNACK)),
    (0x29, "subscription_identifier_available", _BYTE, _in(CONNACK)),
    (0x2A, "shared_subscription_available", _BYTE, _in(CONNACK)),
)
#: byte properties whose only values are 0 and 1 (a Protocol Error otherwise)
_BOOLEAN = frozenset(("payload_format_indicator", "request_problem_information", "request_response_information",
                      "maximum_qos", "retain_available", "wildcard_subscription_available",
                      "subscription_identifier_available", "shared_subscription_available"))
#: numeric properties for which 0 is a Protocol Error
_NONZERO = frozenset(("receive_maximum", "maximum_packet_size", "topic_alias", "subscription_identifier"))
#: by identifier: (name, type, packets, largest value allowed, smallest value allowed)
_BY_ID: list[tuple[str, int, int, int, int] | None] = [None] * 256
_BY_NAME: dict[str, tuple[bytes, int, int]] = {}
for _pid, _name, _kind, _mask in _PROPERTY_TABLE:
    _BY_ID[_pid] = (_name, _kind, _mask, 1 if _name in _BOOLEAN else 1 << 32, 1 if _name in _NONZERO else 0)
    _BY_NAME[_name] = (bytes((_pid,)), _kind, _mask)


# -- decoding helpers: each takes the packet body and an offset, returns (value, next offset) ------------------
def _vbi(body: bytes, pos: int) -> tuple[int, int]:
    value = body[pos]
    if value < 0x80:
        return value, pos + 1
    value = 0
    shift = 0
    while True:
        byte = body[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift == 28:
            raise MalformedPacket("variable byte integer longer than 4 bytes")


def _utf8(body: bytes, pos: int) -> tuple[str, int]:
    end = pos + 2 + ((body[pos] << 8) | body[pos + 1])
    if end > len(body):
        raise MalformedPacket("string runs past the end of the packet")
    text = body[pos + 2:end].decode()
    if "\x00" in text:
        raise MalformedPacket("string contains U+0000")
    return text, end


def _binary(body: bytes, pos: int) -> tuple[bytes, int]:
    end = pos + 2 + ((body[pos] << 8) | body[pos + 1])
    if end > len(body):
        raise MalformedPacket("binary data runs past the end of the packet")
    return body[pos + 2:end], end


def _properties(body: bytes, pos: int, ptype: int, limit: int = -1) -> tuple[Properties, int]:
    """The property list at pos of a packet that ends at limit (default: the end of body)."""
    length, pos = _vbi(body, pos)
    stop = pos + length
    if stop > (len(body) if limit < 0 else limit):
        raise MalformedPacket("properties run past the end of the packet")
    props: Properties = {}
    bit = 1 << ptype
    value: Any
    while pos < stop:
        spec = _BY_ID[body[pos]]
        if spec is None or not spec[2] & bit:
            raise MalformedPacket(f"property 0x{body[pos]:02x} not allowed in {_TYPE_NAMES[ptype]}")
        name, kind, _, most, least = spec
        pos += 1
        if kind == _PAIR:
            key, pos = _utf8(body, pos)
            value, pos = _utf8(body, pos)
            props.setdefault(name, []).append((key, value))
            continue
        if kind == _BYTE:
            value = body[pos]
            pos += 1
        elif kind == _TWO:
            value = _U16.unpack_from(body, pos)[0]
            pos += 2
        elif kind == _FOUR:
            value = _U32.unpack_from(body, pos)[0]
            pos += 4
        elif kind == _VBI:
            value, pos = _vbi(body, pos)
        elif kind == _UTF8:
            value, pos = _utf8(body, pos)
        else:
            value, pos = _binary(body, pos)
        if kind < _UTF8 and not least <= value <= most:
            raise ProtocolError(f"{name} = {value} in {_TYPE_NAMES[ptype]}")
        if ptype == PUBLISH and name == "subscription_identifier":
            props.setdefault(name, []).append(value)
        elif name in props:
            raise ProtocolError(f"{name} twice in {_TYPE_NAMES[ptype]}")
        else:
            props[name] = value
    if pos != stop:
        raise MalformedPacket("properties run past their length")
    return props, pos


def _packet_id(body: bytes, pos: int) -> int:
    packet_id = (body[pos] << 8) | body[pos + 1]
    if not packet_id:
        raise ProtocolError("packet identifier 0")
    return packet_id


def _expect_end(body: bytes, pos: int, ptype: int) -> None:
    if pos != len(body):
        raise MalformedPacket(f"{_TYPE_NAMES[ptype]}: {len(body) - pos} bytes past its end")


# -- decoding of each packet type (body = the bytes after the fixed header) -------------------------------------
def _decode_connect(decoder: Decoder, flags: int, body: bytes) -> Connect:
    name, pos = _utf8(body, 0)
    level = body[pos]
    if name == "MQTT" and level not in (4, 5) or name == "MQIsdp" and level != 3:
        raise UnsupportedProtocolVersion(f"protocol {name!r} level {level}")
    if name not in ("MQTT", "MQIsdp"):
        raise ProtocolError(f"protocol name {name!r}")
    decoder.version = level  # even if the rest is bad: the CONNACK refusing it takes this level's format
    cflags = body[pos + 1]
    keep_alive = (body[pos + 2] << 8) | body[pos + 3]
    pos += 4
    if cflags & 0x01:
        raise MalformedPacket("CONNECT reserved flag set")
    will_flag = cflags & 0x04
    will_qos = (cflags >> 3) & 3
    will_retain = bool(cflags & 0x20)
    if will_qos == 3:
        raise MalformedPacket("CONNECT will QoS 3")
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("CONNECT will QoS or retain without a will")
    if cflags & 0x40 and not cflags & 0x80 and level < 5:
        raise ProtocolError("CONNECT password without a user name")
    props: Properties = {}
    if level == 5:
        props, pos = _properties(body, pos, CONNECT)
        if "authentication_data" in props and "authentication_method" not in props:
            raise ProtocolError("CONNECT authentication data without a method")
    client_id, pos = _utf8(body, pos)
    will = None
    if will_flag:
        will_props: Properties = {}
        if level == 5:
            will_props, pos = _properties(body, pos, _WILL)
        will_topic, pos = _utf8(body, pos)
        will_payload, pos = _binary(body, pos)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if cflags & 0x80:
        username, pos = _utf8(body, pos)
    if cflags & 0x40:
        password, pos = _binary(body, pos)
    _expect_end(body, pos, CONNECT)
    return Connect(name, level, bool(cflags & 0x02), keep_alive, client_id, will, username, password, props)


def _decode_connack(decoder: Decoder, flags: int, body: bytes) -> ConnAck:
    ack_flags = body[0]
    if ack_flags & 0xFE and decoder.version > 3:
        raise MalformedPacket("CONNACK reserved flags set")
    props: Properties = {}
    pos = 2
    if decoder.version == 5:
        props, pos = _properties(body, 2, CONNACK)
    _expect_end(body, pos, CONNACK)
    return ConnAck(bool(ack_flags & 1) and decoder.version > 3, body[1], props)


def _decode_ack(decoder: Decoder, ptype: int, body: bytes) -> tuple[int, int, Properties]:
    packet_id = _packet_id(body, 0)
    if decoder.version < 5 or len(body) == 2:
        _expect_end(body, 2, ptype)
        return packet_id, 0, {}
    if len(body) == 3:
        return packet_id, body[2], {}
    props, pos = _properties(body, 3, ptype)
    _expect_end(body, pos, ptype)
    return packet_id, body[2], props


def _decode_puback(decoder: Decoder, flags: int, body: bytes) -> PubAck:
    return PubAck(*_decode_ack(decoder, PUBACK, body))


def _decode_pubrec(decoder: Decoder, flags: int, body: bytes) -> PubRec:
    return PubRec(*_decode_ack(decoder, PUBREC, body))


def _decode_pubrel(decoder: Decoder, flags: int, body: bytes) -> PubRel:
    return PubRel(*_decode_ack(decoder, PUBREL, body))


def _decode_pubcomp(decoder: Decoder, flags: int, body: bytes) -> PubComp:
    return PubComp(*_decode_ack(decoder, PUBCOMP, body))


def _id_and_properties(decoder: Decoder, body: bytes, ptype: int) -> tuple[int, Properties, int]:
    packet_id = _packet_id(body, 0)
    if decoder.version == 5:
        props, pos = _properties(body, 2, ptype)
        return packet_id, props, pos
    return packet_id, {}, 2


def _decode_subscribe(decoder: Decoder, flags: int, body: bytes) -> Subscribe:
    packet_id, props, pos = _id_and_properties(decoder, body, SUBSCRIBE)
    reserved = 0xC0 if decoder.version == 5 else 0xFC
    topics = []
    while pos < len(body):
        topic, pos = _utf8(body, pos)
        options = body[pos]
        pos += 1
        if options & reserved:
            raise MalformedPacket("SUBSCRIBE options reserved bits set")
        if options & 3 == 3:
            raise MalformedPacket("SUBSCRIBE QoS 3")
        if options & 0x30 == 0x30:
            raise ProtocolError("SUBSCRIBE retain handling 3")
        topics.append((topic, sub_options(options & 3, bool(options & 4), bool(options & 8), options >> 4)))
    if not topics:
        raise ProtocolError("SUBSCRIBE without a topic filter")
    return Subscribe(packet_id, topics, props)


def _decode_suback(decoder: Decoder, flags: int, body: bytes) -> SubAck:
    packet_id, props, pos = _id_and_properties(decoder, body, SUBACK)
    return SubAck(packet_id, list(body[pos:]), props)


def _decode_unsubscribe(decoder: Decoder, flags: int, body: bytes) -> Unsubscribe:
    packet_id, props, pos = _id_and_properties(decoder, body, UNSUBSCRIBE)
    filters = []
    while pos < len(body):
        topic, pos = _utf8(body, pos)
        filters.append(topic)
    if not filters:
        raise ProtocolError("UNSUBSCRIBE without a topic filter")
    return Unsubscribe(packet_id, filters, props)


def _decode_unsuback(decoder: Decoder, flags: int, body: bytes) -> UnsubAck:
    packet_id, props, pos = _id_and_properties(decoder, body, UNSUBACK)
    if decoder.version < 5:
        _expect_end(body, pos, UNSUBACK)
    return UnsubAck(packet_id, list(body[pos:]), props)


def _decode_pingreq(decoder: Decoder, flags: int, body: bytes) -> PingReq:
    _expect_end(body, 0, PINGREQ)
    return PingReq()


def _decode_pingresp(decoder: Decoder, flags: int, body: bytes) -> PingResp:
    _expect_end(body, 0, PINGRESP)
    return PingResp()


def _reason_and_properties(decoder: Decoder, body: bytes, ptype: int) -> tuple[int, Properties]:
    if decoder.version < 5 or not body:
        _expect_end(body, 0, ptype)
        return 0, {}
    if len(body) == 1:
        return body[0], {}
    props, pos = _properties(body, 1, ptype)
    _expect_end(body, pos, ptype)
    return body[0], props


def _decode_disconnect(decoder: Decoder, flags: int, body: bytes) -> Disconnect:
    if not decoder.server and decoder.version < 5:
        raise ProtocolError("DISCONNECT from a 3.1.1 server")
    return Disconnect(*_reason_and_properties(decoder, body, DISCONNECT))


def _decode_auth(decoder: Decoder, flags: int, body: bytes) -> Auth:
    return Auth(*_reason_and_properties(decoder, body, AUTH))


#: by packet type; PUBLISH (3) is decoded inline by Decoder.feed, its hot path
_DECODERS: tuple[Any, ...] = (None, _decode_connect, _decode_connack, None, _decode_puback, _decode_pubrec,
                              _decode_pubrel, _decode_pubcomp, _decode_subscribe, _decode_suback, _decode_unsubscribe,
                              _decode_unsuback, _decode_pingreq, _decode_pingresp, _decode_disconnect, _decode_auth)


class Decoder:
    """Feed it the bytes of one connection; get back every complete packet in order.

    After an MqttError the stream position is lost: the decoder refuses further input (close the connection).
    """

    __slots__ = ("max_packet_size", "server", "version", "_tail", "_need", "_connected", "_failed")

    def __init__(self, max_packet_size: int = MAX_REMAINING_LENGTH, server: bool = True) -> None:
        self.max_packet_size = max_packet_size
        self.server = server
        self.version = 4
        self._tail: bytes | bytearray = b""     # a packet's start while the rest is on its way
        self._need = 0  # bytes the tail must reach before another packet can complete
        self._connected = not server
        self._failed: MqttError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        if self._failed is not None:
            raise self._failed
        if self._tail:
            self._tail += data
            if len(self._tail) < self._need:
                return []
            data = self._tail
            self._tail = b""
        buf = data if type(data) is bytes else bytes(data)  # one copy here beats a view per field
        size = len(buf)
        packets: list[Packet] = []
        pos = 0
        ptype = 0
        try:
            while pos < size:
                first = buf[pos]
                ptype = first >> 4
                if not self._connected and ptype != CONNECT:
                    raise ProtocolError(f"{_TYPE_NAMES[ptype]} before CONNECT")
                if pos + 1 == size:
                    self._need = 2
                    break
                length = buf[pos + 1]
                start = pos + 2
                if length > 0x7F:  # a remaining length of more than one byte
                    length, start = self._long_length(buf, pos)
                    if length < 0:
                        break
                end = start + length
                if end - pos > self.max_packet_size:
                    raise PacketTooLarge(f"{_TYPE_NAMES[ptype]} of {end - pos} bytes, over {self.max_packet_size}")
                if end > size:
                    self._need = end - pos
                    break
                if ptype == PUBLISH:
                    qos = (first >> 1) & 3
                    if qos == 3:
                        raise MalformedPacket("PUBLISH QoS 3")
                    at = start + 2 + ((buf[start] << 8) | buf[start + 1])
                    if at > end:
                        raise MalformedPacket("PUBLISH topic runs past the end of the packet")
                    topic = buf[start + 2:at].decode()
                    if "\x00" in topic:
                        raise MalformedPacket("PUBLISH topic contains U+0000")
                    packet_id = None
                    if qos:
                        packet_id = (buf[at] << 8) | buf[at + 1]
                        at += 2
                        if not packet_id:
                            raise ProtocolError("PUBLISH packet identifier 0")
                    elif first & 8:
                        raise MalformedPacket("PUBLISH DUP set at QoS 0")
                    props: Properties = {}
                    if self.version == 5:
                        if buf[at] == 0:  # no properties: the common case
                            at += 1
                        else:
                            props, at = _properties(buf, at, PUBLISH, end)
                        if self.server and "subscription_identifier" in props:
                            raise ProtocolError("PUBLISH from a client with a subscription identifier")
                    if at > end:
                        raise MalformedPacket("PUBLISH header runs past the end of the packet")
                    packets.append(Publish(topic, buf[at:end], qos, (first & 1) == 1, (first & 8) == 8, packet_id,
                                           props))
                else:
                    packets.append(self._decode(ptype, first & 0x0F, buf[start:end]))
                pos = end
        except MqttError as error:
            error.packets = packets
            self._failed = error
            raise
        except (IndexError, struct.error, UnicodeDecodeError) as error:
            failure = MalformedPacket(f"{_TYPE_NAMES[ptype]}: {error}")
            failure.packets = packets
            self._failed = failure
            raise failure from None
        if pos < size:
            self._tail = bytearray(buf[pos:])
        return packets

    def _long_length(self, buf: bytes, pos: int) -> tuple[int, int]:
        """(remaining length, offset of the body) of the packet at pos, or (-1, 0) when it is incomplete."""
        start = pos + 1
        length = shift = 0
        while start < len(buf):
            byte = buf[start]
            start += 1
            length |= (byte & 0x7F) << shift
            if byte < 0x80:
                return length, start
            shift += 7
            if shift == 28:
                raise MalformedPacket("remaining length longer than 4 bytes")
        self._need = start - pos + 1
        return -1, 0

    def _decode(self, ptype: int, flags: int, body: bytes) -> Packet:
        if ptype == 0 or ptype == AUTH and self.version < 5:
            raise MalformedPacket(f"reserved packet type {ptype}")
        expected = _FLAGS[ptype]
        if flags != expected and not (self.version == 3 and flags & 0x7 == expected):  # 3.1 may set DUP there
            raise MalformedPacket(f"{_TYPE_NAMES[ptype]} fixed header flags {flags:04b}")
        if ptype not in (_FROM_CLIENT if self.server else _FROM_SERVER):
            raise ProtocolError(f"{_TYPE_NAMES[ptype]} sent the wrong way")
        if ptype == CONNECT:
            if self._connected:
                raise ProtocolError("second CONNECT")
            self._connected = True
        return _DECODERS[ptype](self, flags, body)


# -- encoding -------------------------------------------------------------------------------------------------
def _vbi_bytes(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    if value > MAX_REMAINING_LENGTH:
        raise ValueError(f"{value} does not fit a variable byte integer")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _str_bytes(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise ValueError(f"string of {len(raw)} bytes, over 65535")
    return _U16.pack(len(raw)) + raw


def _bin_bytes(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError(f"binary data of {len(data)} bytes, over 65535")
    return _U16.pack(len(data)) + data


def _properties_bytes(props: Properties, ptype: int) -> bytes:
    if not props:
        return b"\x00"
    parts: list[bytes] = []
    bit = 1 << ptype
    for name, value in props.items():
        spec = _BY_NAME.get(name)
        if spec is None or not spec[2] & bit:
            raise ValueError(f"property {name!r} not allowed in {_TYPE_NAMES[ptype]}")
        pid, kind, _ = spec
        if kind == _PAIR:
            parts.extend(pid + _str_bytes(key) + _str_bytes(val) for key, val in value)
        elif kind == _VBI:
            parts.extend(pid + _vbi_bytes(each) for each in (value if isinstance(value, list) else (value,)))
        elif kind == _BYTE:
            parts.append(pid + bytes((value,)))
        elif kind == _TWO:
            parts.append(pid + _U16.pack(value))
        elif kind == _FOUR:
            parts.append(pid + _U32.pack(value))
        elif kind == _UTF8:
            parts.append(pid + _str_bytes(value))
        else:
            parts.append(pid + _bin_bytes(value))
    body = b"".join(parts)
    return _vbi_bytes(len(body)) + body


def _frame(first: int, *parts: bytes) -> bytes:
    length = sum(map(len, parts))
    if length < 0x80:
        return b"".join((_HEAD2.pack(first, length), *parts))
    return b"".join((bytes((first,)), _vbi_bytes(length), *parts))


def encode_publish(topic: str, payload: bytes, qos: int = 0, retain: bool = False, dup: bool = False,
                   packet_id: int | None = None, properties: Properties | None = None, version: int = 4) -> bytes:
    """One PUBLISH packet: the fan-out path, so without building a Publish first."""
    raw = topic.encode()
    size = len(raw)
    if size > 0xFFFF:
        raise ValueError(f"topic of {size} bytes, over 65535")
    props = (_properties_bytes(properties, PUBLISH) if properties else b"\x00") if version == 5 else b""
    first = 0x30 | (dup << 3) | (qos << 1) | retain
    if qos:
        if not packet_id:
            raise ValueError(f"QoS {qos} PUBLISH needs a packet id")
        length = size + 4 + len(props) + len(payload)
        if length < 0x80:
            return b"".join((_HEAD_U16.pack(first, length, size), raw, _U16.pack(packet_id), props, payload))
        return b"".join((bytes((first,)), _vbi_bytes(length), _U16.pack(size), raw, _U16.pack(packet_id), props,
                         payload))
    length = size + 2 + len(props) + len(payload)
    if length < 0x80:
        return b"".join((_HEAD_U16.pack(first, length, size), raw, props, payload))
    return b"".join((bytes((first,)), _vbi_bytes(length), _U16.pack(size), raw, props, payload))


def _encode_connect(packet: Connect, version: int) -> bytes:
    level = packet.protocol_level
    will = packet.will
    cflags = (packet.clean_start << 1) | ((packet.username is not None) << 7) | ((packet.password is not None) << 6)
    parts = [_str_bytes(packet.protocol_name), b"", _U16.pack(packet.keep_alive)]
    if level == 5:
        parts.append(_properties_bytes(packet.properties, CONNECT))
    parts.append(_str_bytes(packet.client_id))
    if will is not None:
        cflags |= 0x04 | (will.qos << 3) | (will.retain << 5)
        if level == 5:
            parts.append(_properties_bytes(will.properties, _WILL))
        parts.append(_str_bytes(will.topic))
        parts.append(_bin_bytes(will.payload))
    if packet.username is not None:
        parts.append(_str_bytes(packet.username))
    if packet.password is not None:
        parts.append(_bin_bytes(packet.password))
    parts[1] = bytes((level, cflags))
    return _frame(0x10, *parts)


def _encode_connack(packet: ConnAck, version: int) -> bytes:
    if version < 5:
        return _CONNACK4.pack(0x20, 2, packet.session_present and version > 3, packet.reason)
    return _frame(0x20, bytes((packet.session_present, packet.reason)), _properties_bytes(packet.properties, CONNACK))


def _ack_encoder(ptype: int, first: int) -> Callable[[Ack, int], bytes]:
    def encode(packet: Ack, version: int) -> bytes:
        if version < 5 or not packet.reason and not packet.properties:
            return _HEAD_U16.pack(first, 2, packet.packet_id)
        if not packet.properties:
            return _HEAD_U16.pack(first, 3, packet.packet_id) + bytes((packet.reason,))
        return _frame(first, _U16.pack(packet.packet_id), bytes((packet.reason,)),
                      _properties_bytes(packet.properties, ptype))
    return encode


def _id_head(packet_id: int, props: Properties, ptype: int, version: int) -> bytes:
    if version == 5:
        return _U16.pack(packet_id) + _properties_bytes(props, ptype)
    return _U16.pack(packet_id)


def _encode_subscribe(packet: Subscribe, version: int) -> bytes:
    parts = [_id_head(packet.packet_id, packet.properties, SUBSCRIBE, version)]
    for topic, opts in packet.topics:
        options = opts.qos
        if version == 5:
            options |= (opts.no_local << 2) | (opts.retain_as_published << 3) | (opts.retain_handling << 4)
        parts.append(_str_bytes(topic) + bytes((options,)))
    return _frame(0x82, *parts)


def _encode_suback(packet: SubAck, version: int) -> bytes:
    return _frame(0x90, _id_head(packet.packet_id, packet.properties, SUBACK, version), bytes(packet.reasons))


def _encode_unsubscribe(packet: Unsubscribe, version: int) -> bytes:
    return _frame(0xA2, _id_head(packet.packet_id, packet.properties, UNSUBSCRIBE, version),
                  *map(_str_bytes, packet.filters))


def _encode_unsuback(packet: UnsubAck, version: int) -> bytes:
    if version < 5:
        return _HEAD_U16.pack(0xB0, 2, packet.packet_id)
    return _frame(0xB0, _id_head(packet.packet_id, packet.properties, UNSUBACK, version), bytes(packet.reasons))


def _encode_disconnect(packet: Disconnect, version: int) -> bytes:
    if version < 5 or not packet.reason and not packet.properties:
        return b"\xe0\x00"
    if not packet.properties:
        return bytes((0xE0, 1, packet.reason))
    return _frame(0xE0, bytes((packet.reason,)), _properties_bytes(packet.properties, DISCONNECT))


def _encode_auth(packet: Auth, version: int) -> bytes:
    if version < 5:
        raise ValueError("AUTH exists only in MQTT 5.0")
    if not packet.reason and not packet.properties:
        return b"\xf0\x00"
    return _frame(0xF0, bytes((packet.reason,)), _properties_bytes(packet.properties, AUTH))


_ENCODERS: dict[type, Any] = {
    Connect: _encode_connect, ConnAck: _encode_connack,
    PubAck: _ack_encoder(PUBACK, 0x40), PubRec: _ack_encoder(PUBREC, 0x50), PubRel: _ack_encoder(PUBREL, 0x62),
    PubComp: _ack_encoder(PUBCOMP, 0x70), Subscribe: _encode_subscribe, SubAck: _encode_suback,
    Unsubscribe: _encode_unsubscribe, UnsubAck: _encode_unsuback,
    PingReq: lambda packet, version: _PING_REQ, PingResp: lambda packet, version: _PING_RESP,
    Disconnect: _encode_disconnect, Auth: _encode_auth,
}


def encode(packet: Packet, version: int) -> bytes:
    """The wire bytes of packet for a connection at MQTT level version (3, 4 or 5).

    A CONNECT is laid out by its own protocol_level. Fields the version cannot carry (properties before 5.0,
    UNSUBACK reasons, DISCONNECT reasons) are left out; values out of range raise ValueError or struct.error.
    """
    if type(packet) is Publish:
        return encode_publish(packet.topic, packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id,
                              packet.properties, version)
    return _ENCODERS[type(packet)](packet, version)
