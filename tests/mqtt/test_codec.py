"""The MQTT codec: round trips of every packet in every version, vectors from the standard and from
third-party clients (paho-mqtt, mosquitto_pub), and the error each malformed packet must raise."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from smartgo.mqtt import codec
from smartgo.mqtt.codec import (Auth, ConnAck, Connect, Decoder, Disconnect, MalformedPacket, MqttError, Packet,
                                PacketTooLarge, PingReq, PingResp, ProtocolError, PubAck, PubComp, Publish, PubRec,
                                PubRel, SubAck, Subscribe, SubOptions, UnsubAck, Unsubscribe,
                                UnsupportedProtocolVersion, Will, connack_code_v3, encode, encode_publish)

VERSIONS = (3, 4, 5)
NAMES = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}
USER = {"user_property": [("a", "1"), ("a", "2"), ("ключ", "值")]}
REASON = {"reason_string": "why", **USER}
CONNECT_PROPS = {"session_expiry_interval": 3600, "receive_maximum": 20, "maximum_packet_size": 1 << 20,
                 "topic_alias_maximum": 10, "request_response_information": 1, "request_problem_information": 0,
                 "authentication_method": "SCRAM", "authentication_data": b"\x00\x01", **USER}
WILL_PROPS = {"will_delay_interval": 5, "payload_format_indicator": 1, "message_expiry_interval": 60,
              "content_type": "text/plain", "response_topic": "r/t", "correlation_data": b"\xff\x00", **USER}
CONNACK_PROPS = {"session_expiry_interval": 0, "receive_maximum": 65535, "maximum_qos": 1, "retain_available": 1,
                 "maximum_packet_size": 268435455, "assigned_client_identifier": "auto-1", "topic_alias_maximum": 0,
                 "reason_string": "ok", "wildcard_subscription_available": 1, "subscription_identifier_available": 0,
                 "shared_subscription_available": 1, "server_keep_alive": 120, "response_information": "resp/",
                 "server_reference": "other:1883", "authentication_method": "SCRAM", "authentication_data": b"x",
                 **USER}
PUBLISH_PROPS = {"payload_format_indicator": 0, "message_expiry_interval": 0xFFFFFFFF, "topic_alias": 3,
                 "response_topic": "reply/to", "correlation_data": b"", "content_type": "application/json", **USER}


def client_packets(v: int) -> list[Packet]:
    """Packets a client sends, with every property each may carry at level v."""
    five = v == 5
    opts = [SubOptions(0), SubOptions(1), SubOptions(2)]
    if five:
        opts += [SubOptions(1, True, True, 2), SubOptions(0, False, True, 1)]
    return [
        Publish("a/b", b"payload", 0),
        Publish("a/\u00e9/\U0001f600", b"\x00" * 300, 1, True, True, 65535, PUBLISH_PROPS if five else {}),
        Publish("", b"", 2, False, False, 1, {"topic_alias": 1} if five else {}),
        PubAck(1, 0x10 if five else 0, REASON if five else {}),
        PubAck(2, 0x97 if five else 0),
        PubRec(3, 0x80 if five else 0, REASON if five else {}),
        PubRel(4, 0x92 if five else 0, REASON if five else {}),
        PubComp(5, 0, REASON if five else {}),
        PubComp(6),
        Subscribe(7, [(f"t/{i}/+", o) for i, o in enumerate(opts)],
                  {"subscription_identifier": 268435455, **USER} if five else {}),
        Unsubscribe(8, ["a/#", "b/+/c"], USER if five else {}),
        PingReq(),
        Disconnect(0x04 if five else 0, {"session_expiry_interval": 10, **REASON} if five else {}),
        Disconnect(),
        *([Auth(0x18, {"authentication_method": "SCRAM", "authentication_data": b"\x01", **REASON}), Auth(),
           Disconnect(0x8E)] if five else []),
    ]


def server_packets(v: int) -> list[Packet]:
    """Packets a broker sends, with every property each may carry at level v."""
    five = v == 5
    return [
        ConnAck(v > 3, 0x86 if five else 4, CONNACK_PROPS if five else {}),
        ConnAck(False, 0),
        Publish("x", b"y" * 200, 1, False, False, 9,
                {"subscription_identifier": [1, 128, 16384], **PUBLISH_PROPS} if five else {}),
        PubAck(10), PubRec(11, 0x10 if five else 0), PubRel(12),
        PubComp(13, 0x92 if five else 0, REASON if five else {}),
        SubAck(14, [0, 1, 2, 0x80] + ([0x8F, 0xA2] if five else []), REASON if five else {}),
        UnsubAck(15, [0, 0x11, 0x87] if five else [], REASON if five else {}),
        PingResp(),
        *([Disconnect(0x9C, {"server_reference": "b:1883", **REASON}), Auth(0x19)] if five else []),
    ]


def connect_packet(v: int, **fields: Any) -> Connect:
    return Connect(NAMES[v], v, **fields)


def server_decoder(v: int) -> Decoder:
    """A broker-side decoder past the CONNECT of level v."""
    decoder = Decoder()
    assert decoder.feed(encode(connect_packet(v, client_id="c"), v)) == [connect_packet(v, client_id="c")]
    assert decoder.version == v
    return decoder


def client_decoder(v: int) -> Decoder:
    decoder = Decoder(server=False)
    decoder.version = v
    return decoder


def raises(decoder: Decoder, data: bytes, kind: type[MqttError], reason: int) -> MqttError:
    with pytest.raises(kind) as info:
        decoder.feed(data)
    assert info.value.reason == reason
    return info.value


# -- round trips ----------------------------------------------------------------------------------------------
CONNECTS = [
    dict(client_id="c1"),
    dict(client_id="", clean_start=False, keep_alive=0),
    dict(client_id="dev-42", keep_alive=65535, username="u", password=b"p\x00w"),
    dict(client_id="dev-43", will=Will("will/t", b"gone", 2, True), username="", password=b""),
    dict(client_id="dev-44", will=Will("w", b"", 1, False), username="only-user"),
]


@pytest.mark.parametrize("v", VERSIONS)
@pytest.mark.parametrize("fields", CONNECTS)
def test_connect_round_trip(v: int, fields: dict[str, Any]) -> None:
    fields = dict(fields)
    if v == 5:
        fields["properties"] = CONNECT_PROPS
        if fields.get("will"):
            fields["will"] = Will(fields["will"].topic, fields["will"].payload, fields["will"].qos,
                                  fields["will"].retain, WILL_PROPS)
    packet = connect_packet(v, **fields)
    decoder = Decoder()
    assert decoder.feed(encode(packet, v)) == [packet]
    assert decoder.version == v


@pytest.mark.parametrize("v", VERSIONS)
def test_client_packets_round_trip(v: int) -> None:
    packets = client_packets(v)
    wire = b"".join(encode(p, v) for p in packets)
    assert server_decoder(v).feed(wire) == packets


@pytest.mark.parametrize("v", VERSIONS)
def test_server_packets_round_trip(v: int) -> None:
    packets = server_packets(v)
    wire = b"".join(encode(p, v) for p in packets)
    assert client_decoder(v).feed(wire) == packets


@pytest.mark.parametrize("v", VERSIONS)
def test_both_way_packets_decode_on_both_sides(v: int) -> None:
    both = [p for p in client_packets(v) if isinstance(p, (PubAck, PubRec, PubRel, PubComp, Auth))]
    both += [Publish("a", b"b", 1, packet_id=5)]
    wire = b"".join(encode(p, v) for p in both)
    assert client_decoder(v).feed(wire) == both
    assert server_decoder(v).feed(wire) == both


@pytest.mark.parametrize("v", VERSIONS)
def test_split_feeding_byte_by_byte(v: int) -> None:
    connect = connect_packet(v, client_id="c", will=Will("w", b"x" * 200, 1, True), username="u", password=b"p")
    packets: list[Packet] = [connect, *client_packets(v), Publish("big", b"z" * 70000, 1, packet_id=1)]
    wire = b"".join(encode(p, v) for p in packets)
    decoder = Decoder()
    out: list[Packet] = []
    for i in range(len(wire) - 70100):  # the small packets one byte at a time, then the big one in two
        out += decoder.feed(wire[i:i + 1])
    out += decoder.feed(memoryview(wire)[len(wire) - 70100:len(wire) - 1000])
    out += decoder.feed(bytearray(wire[len(wire) - 1000:]))
    assert out == packets
    server = server_packets(v)
    wire = b"".join(encode(p, v) for p in server)
    decoder = client_decoder(v)
    out = []
    for i in range(len(wire)):
        out += decoder.feed(wire[i:i + 1])
    assert out == server


@pytest.mark.parametrize("packet", [PubRel(1), Subscribe(1, [("a", SubOptions(1))]), Unsubscribe(1, ["a"])])
def test_3_1_accepts_dup_on_pubrel_subscribe_unsubscribe(packet: Packet) -> None:
    """MQTT 3.1 clients set DUP when they retry these; 3.1.1 forbids it."""
    wire = bytearray(encode(packet, 3))
    wire[0] |= 0x08
    assert server_decoder(3).feed(bytes(wire)) == [packet]
    raises(server_decoder(4), bytes(wire), MalformedPacket, 0x81)


# -- byte-exact vectors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("length, encoded", [
    (0, "00"), (127, "7f"), (128, "8001"), (16383, "ff7f"), (16384, "808001"), (2097151, "ffff7f"),
    (2097152, "80808001"),
])
def test_remaining_length_vectors_of_the_standard(length: int, encoded: str) -> None:
    """MQTT 3.1.1 table 2.4 (5.0 section 1.5.5): the encoding of the remaining length."""
    wire = encode_publish("", b"\x00" * (length - 2), version=4) if length else b"\x30\x00"
    header = bytes.fromhex("30" + encoded)
    if length:
        assert wire[:len(header)] == header and len(wire) == len(header) + length
        decoder = client_decoder(4)
        assert decoder.feed(wire) == [Publish("", b"\x00" * (length - 2))]
    else:  # a PUBLISH of remaining length 0 lacks its topic
        raises(client_decoder(4), header, MalformedPacket, 0x81)


def test_largest_remaining_length_is_refused_over_the_limit_before_its_body() -> None:
    decoder = client_decoder(4)
    error = raises(decoder, bytes.fromhex("30ffffff7f") + b"\x00" * 10, PacketTooLarge, 0x95)
    assert "268435460" in str(error)
    with pytest.raises(PacketTooLarge):  # the decoder is dead now
        decoder.feed(b"\xc0\x00")


def test_connect_example_of_the_standard() -> None:
    """MQTT 3.1.1 section 3.1.2.10's example variable header: level 4, flags 0xCE, keep alive 10."""
    connect = Connect("MQTT", 4, True, 10, "cid", Will("wt", b"wm", 1, False), "user", b"pw")
    wire = encode(connect, 4)
    assert wire == bytes.fromhex("1021" "00044d515454" "04" "ce" "000a" "0003636964" "00027774" "0002776d"
                                 "000475736572" "00027077")
    assert Decoder().feed(wire) == [connect]


@pytest.mark.parametrize("packet, v, hexa", [
    (PingReq(), 4, "c000"), (PingResp(), 4, "d000"), (Disconnect(), 4, "e000"), (Disconnect(), 5, "e000"),
    (Disconnect(0x04), 5, "e00104"), (PubAck(1), 4, "40020001"), (PubAck(1), 5, "40020001"),
    (PubAck(1, 0x10), 5, "4003000110"), (PubRel(0x1234), 4, "62021234"),
    (PubRec(2, 0x80, {"reason_string": "no"}), 5, "5009" "0002" "80" "05" "1f00026e6f"),
    (ConnAck(True, 0), 4, "20020100"), (ConnAck(False, 5), 3, "20020005"), (ConnAck(False, 0), 5, "2003000000"),
    (Subscribe(10, [("a/b", SubOptions(1))]), 4, "8208000a0003612f6201"),
    (Subscribe(10, [("a/b", SubOptions(2, True, True, 2))]), 5, "8209000a000003612f622e"),
    (SubAck(10, [1, 0x80]), 4, "9004000a0180"), (UnsubAck(10, [0x11]), 4, "b002000a"),
    (UnsubAck(10, [0x11]), 5, "b004000a0011"), (Unsubscribe(10, ["a/b"]), 4, "a207000a0003612f62"),
    (Publish("a/b", b"hi", 1, True, True, 0x0102), 4, "3b090003612f62" "0102" "6869"),
    (Publish("a/b", b"hi", 0, False, False, None, {"message_expiry_interval": 1}), 5,
     "300d0003612f62" "05" "0200000001" "6869"),
    (Auth(0x18, {"authentication_method": "M"}), 5, "f006" "18" "04" "1500014d"),
])
def test_byte_exact_encodings(packet: Packet, v: int, hexa: str) -> None:
    wire = encode(packet, v)
    assert wire.hex() == hexa
    to_server = not isinstance(packet, (ConnAck, SubAck, UnsubAck, PingResp))
    decoder = server_decoder(v) if to_server else client_decoder(v)
    expected = packet
    if isinstance(packet, UnsubAck) and v < 5:
        expected = UnsubAck(packet.packet_id, [])
    assert decoder.feed(wire) == [expected]


# -- third-party clients on a local socket ----------------------------------------------------------------------
class CaptureServer:
    """A one-connection MQTT server on loopback, answering with our encoder: it records every byte the
    client sends and the packets our decoder made of them."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.raw = bytearray()
        self.packets: list[Packet] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.listener.settimeout(60)
            conn, _ = self.listener.accept()
            conn.settimeout(60)
            decoder = Decoder()
            with conn:
                while data := conn.recv(65536):
                    self.raw += data
                    for packet in decoder.feed(data):
                        self.packets.append(packet)
                        reply = self._reply(packet, decoder.version)
                        if reply is not None:
                            conn.sendall(encode(reply, decoder.version))
                    if any(isinstance(p, Disconnect) for p in self.packets):
                        return
        except BaseException as exc:  # reported by join()
            self.error = exc
        finally:
            self.listener.close()

    @staticmethod
    def _reply(packet: Packet, v: int) -> Packet | None:
        if isinstance(packet, Connect):
            return ConnAck(False, 0, {"receive_maximum": 10, "topic_alias_maximum": 5} if v == 5 else {})
        if isinstance(packet, Subscribe):
            return SubAck(packet.packet_id, [o.qos for _, o in packet.topics])
        if isinstance(packet, Unsubscribe):
            return UnsubAck(packet.packet_id, [0] * len(packet.filters))
        if isinstance(packet, Publish) and packet.qos == 1:
            assert packet.packet_id is not None
            return PubAck(packet.packet_id)
        if isinstance(packet, Publish) and packet.qos == 2:
            assert packet.packet_id is not None
            return PubRec(packet.packet_id)
        if isinstance(packet, PubRel):
            return PubComp(packet.packet_id)
        if isinstance(packet, PingReq):
            return PingResp()
        return None

    def join(self) -> list[Packet]:
        self.thread.join(90)
        assert not self.thread.is_alive(), "the client never disconnected"
        if self.error is not None:
            raise self.error
        v = next(p.protocol_level for p in self.packets if isinstance(p, Connect))
        assert b"".join(encode(p, v) for p in self.packets) == bytes(self.raw)  # byte-exact re-encoding
        return self.packets


def run_paho(port: int, protocol: int, steps: Callable[[paho.Client], None]) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="paho-1", protocol=protocol)
    client.username_pw_set("user", "secret")
    props = None
    if protocol == paho.MQTTv5:
        client.will_set("will/t", b"bye", 1, True, properties=_paho_props(PacketTypes.WILLMESSAGE,
                                                                            WillDelayInterval=3))
        props = _paho_props(PacketTypes.CONNECT, SessionExpiryInterval=120, ReceiveMaximum=7)
    else:
        client.will_set("will/t", b"bye", 1, True)
    client.connect("127.0.0.1", port, keepalive=30, properties=props)
    client.loop_start()
    try:
        steps(client)
    finally:
        client.disconnect()
        client.loop_stop()


def _paho_props(kind: int, **values: Any) -> PahoProperties:
    props = PahoProperties(kind)
    for name, value in values.items():
        setattr(props, name, value)
    return props


@pytest.mark.parametrize("protocol", [paho.MQTTv311, paho.MQTTv5])
def test_paho_mqtt_packets_decode_and_reencode_byte_exact(protocol: int) -> None:
    server = CaptureServer()
    five = protocol == paho.MQTTv5

    def steps(client: paho.Client) -> None:
        assert client.subscribe([("a/+", 1), ("b/#", 2)])[0] == paho.MQTT_ERR_SUCCESS
        pub_props = _paho_props(PacketTypes.PUBLISH, ContentType="text/plain", UserProperty=[("k", "v")]) \
            if five else None
        client.publish("a/b", b"x" * 128, 1, properties=pub_props).wait_for_publish(30)
        client.publish("a/c", b"two", 2).wait_for_publish(30)
        client.publish("a/d", b"zero", 0, retain=True).wait_for_publish(30)
        assert client.unsubscribe("a/+")[0] == paho.MQTT_ERR_SUCCESS

    run_paho(server.port, protocol, steps)
    packets = server.join()
    v = 5 if five else 4
    connect = packets[0]
    assert isinstance(connect, Connect)
    assert (connect.protocol_name, connect.protocol_level, connect.client_id, connect.keep_alive) == \
        ("MQTT", v, "paho-1", 30)
    assert (connect.username, connect.password) == ("user", b"secret")
    assert connect.will is not None and (connect.will.topic, connect.will.payload, connect.will.qos,
                                         connect.will.retain) == ("will/t", b"bye", 1, True)
    if five:
        assert connect.properties == {"session_expiry_interval": 120, "receive_maximum": 7}
        assert connect.will.properties == {"will_delay_interval": 3}
    kinds = [type(p).__name__ for p in packets]
    assert kinds[:2] == ["Connect", "Subscribe"] and kinds[-1] == "Disconnect"
    assert {"Publish", "PubRel", "Unsubscribe"} <= set(kinds)
    publishes = [p for p in packets if isinstance(p, Publish)]
    assert [(p.topic, p.qos, p.retain) for p in publishes] == [("a/b", 1, False), ("a/c", 2, False),
                                                               ("a/d", 0, True)]
    if five:
        assert publishes[0].properties == {"content_type": "text/plain", "user_property": [("k", "v")]}
    subscribe = packets[1]
    assert isinstance(subscribe, Subscribe)
    assert [(t, o.qos) for t, o in subscribe.topics] == [("a/+", 1), ("b/#", 2)]


@pytest.mark.parametrize("version", ["mqttv31", "mqttv311", "mqttv5"])
def test_mosquitto_pub_packets_decode_and_reencode_byte_exact(version: str) -> None:
    server = CaptureServer()
    extra = ["-D", "connect", "session-expiry-interval", "60", "-D", "publish", "user-property", "k", "v",
             "-D", "publish", "message-expiry-interval", "90"] if version == "mqttv5" else []
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(server.port), "-V", version, "-i", "mosq-1",
                    "-t", "dev/1/up", "-m", "hello", "-q", "1", "-r", "-u", "name", "-P", "pw", *extra],
                   check=True, timeout=60)
    packets = server.join()
    connect, publish = packets[0], packets[1]
    assert isinstance(connect, Connect) and isinstance(publish, Publish)
    level = {"mqttv31": 3, "mqttv311": 4, "mqttv5": 5}[version]
    assert (connect.protocol_level, connect.client_id, connect.username, connect.password) == \
        (level, "mosq-1", "name", b"pw")
    assert (publish.topic, publish.payload, publish.qos, publish.retain) == ("dev/1/up", b"hello", 1, True)
    if level == 5:
        assert connect.properties == {"session_expiry_interval": 60, "receive_maximum": 20}  # mosquitto adds it
        assert publish.properties == {"user_property": [("k", "v")], "message_expiry_interval": 90}
    assert isinstance(packets[-1], Disconnect)


# -- malformed input: the error and the reason code ---------------------------------------------------------------
def test_first_packet_must_be_connect_and_only_once() -> None:
    raises(Decoder(), b"\x30", ProtocolError, 0x82)  # refused on its first byte
    raises(Decoder(), encode(PingReq(), 4), ProtocolError, 0x82)
    raises(server_decoder(4), encode(connect_packet(4, client_id="again"), 4), ProtocolError, 0x82)


@pytest.mark.parametrize("v", (4, 5))
def test_packets_sent_the_wrong_way(v: int) -> None:
    for packet in server_packets(v):
        if not isinstance(packet, (Publish, PubAck, PubRec, PubRel, PubComp, Disconnect, Auth)):
            raises(server_decoder(v), encode(packet, v), ProtocolError, 0x82)
    for packet in (Subscribe(1, [("a", SubOptions(0))]), Unsubscribe(1, ["a"]), PingReq()):
        raises(client_decoder(v), encode(packet, v), ProtocolError, 0x82)
    raises(client_decoder(v), encode(connect_packet(v), v), ProtocolError, 0x82)
    if v == 4:  # a 3.1.1 server never sends DISCONNECT
        raises(client_decoder(4), b"\xe0\x00", ProtocolError, 0x82)


@pytest.mark.parametrize("v", (4, 5))
@pytest.mark.parametrize("wire, what", [
    ("00020000", "reserved packet type 0"),
    ("8008000a0003612f6201", "SUBSCRIBE flags 0000"),
    ("8a08000a0003612f6201", "SUBSCRIBE flags 1010"),
    ("a007000a0003612f62", "UNSUBSCRIBE flags 0000"),
    ("60020001", "PUBREL flags 0000"),
    ("42020001", "PUBACK flags 0010"),
    ("c100", "PINGREQ flags 0001"),
    ("e800", "DISCONNECT flags 1000"),
    ("c00100", "PINGREQ with a body"),
    ("36050001610001", "PUBLISH QoS 3"),
    ("38040001616263", "PUBLISH DUP at QoS 0"),
    ("3003000261", "PUBLISH topic past the end"),
    ("300400026162", "PUBLISH with an empty payload (valid)"),
    ("30040002c328", "PUBLISH topic not UTF-8"),
    ("30050003eda080", "PUBLISH topic a UTF-16 surrogate"),
    ("300400020000", "PUBLISH topic with U+0000"),
    ("3280808080010000", "remaining length of five bytes"),
    ("4003000100", "PUBACK one byte too long (3.1.1) / fine (5.0)"),
    ("40010001", "PUBACK too short"),
    ("82050001000161", "SUBSCRIBE without options byte"),
    ("a2050001000261", "UNSUBSCRIBE filter past the end"),
    ("b003000100", "UNSUBACK with a reason in 3.1.1"),
])
def test_malformed_packets(v: int, wire: str, what: str) -> None:
    data = bytes.fromhex(wire)
    if what == "PUBLISH with an empty payload (valid)":  # the control
        data = bytes.fromhex("30050002616200") if v == 5 else data  # 5.0: an empty property list
        assert server_decoder(v).feed(data) == [Publish("ab", b"")]
        return
    if what.startswith("PUBACK one byte too long") and v == 5:
        assert server_decoder(v).feed(data) == [PubAck(1, 0)]
        return
    if what == "UNSUBACK with a reason in 3.1.1":
        if v == 5:
            assert client_decoder(v).feed(data) == [UnsubAck(1, [])]
        else:
            raises(client_decoder(v), data, MalformedPacket, 0x81)
        return
    raises(server_decoder(v), data, MalformedPacket, 0x81)


@pytest.mark.parametrize("v", (4, 5))
def test_packet_id_zero_is_a_protocol_error(v: int) -> None:
    for wire in ("3205000161" "0000", "40020000", "50020000", "62020000", "70020000",
                 "8206" "0000" "0001" "61" "00" if v == 4 else "8207" "0000" "00" "0001" "61" "00",
                 "a205" "0000" "000161" if v == 4 else "a206" "0000" "00" "000161"):
        raises(server_decoder(v), bytes.fromhex(wire), ProtocolError, 0x82)


@pytest.mark.parametrize("v", (4, 5))
def test_subscribe_and_unsubscribe_need_a_filter(v: int) -> None:
    props = "00" if v == 5 else ""
    raises(server_decoder(v), bytes.fromhex(f"820{2 + len(props) // 2}0001{props}"), ProtocolError, 0x82)
    raises(server_decoder(v), bytes.fromhex(f"a20{2 + len(props) // 2}0001{props}"), ProtocolError, 0x82)


def test_subscribe_options_reserved_bits() -> None:
    no_local = bytes.fromhex("8206" "0001" "000161" "05")  # no-local bit: reserved in 3.1.1
    raises(server_decoder(4), no_local, MalformedPacket, 0x81)
    raises(server_decoder(5), bytes.fromhex("8207" "0001" "00" "000161" "41"), MalformedPacket, 0x81)
    raises(server_decoder(5), bytes.fromhex("8207" "0001" "00" "000161" "31"), ProtocolError, 0x82)
    raises(server_decoder(4), bytes.fromhex("8206" "0001" "000161" "03"), MalformedPacket, 0x81)  # QoS 3
    raises(server_decoder(5), bytes.fromhex("8207" "0001" "00" "000161" "03"), MalformedPacket, 0x81)
    got = server_decoder(5).feed(bytes.fromhex("8207" "0001" "00" "000161" "2d"))
    assert got == [Subscribe(1, [("a", SubOptions(1, True, True, 2))])]


def _connect_wire(flags: int, payload: bytes, level: int = 4, name: bytes = b"MQTT", props: bytes = b"") -> bytes:
    body = len(name).to_bytes(2, "big") + name + bytes((level, flags)) + b"\x00\x3c" + props + payload
    return bytes((0x10, len(body))) + body


CLIENT_ID = b"\x00\x01c"


@pytest.mark.parametrize("flags, payload, kind, reason", [
    (0x03, CLIENT_ID, MalformedPacket, 0x81),                          # reserved bit 0 set
    (0x08, CLIENT_ID, MalformedPacket, 0x81),                          # will QoS without a will
    (0x20, CLIENT_ID, MalformedPacket, 0x81),                          # will retain without a will
    (0x1C, CLIENT_ID + b"\x00\x01w\x00\x00", MalformedPacket, 0x81),   # will QoS 3
    (0x42, CLIENT_ID + b"\x00\x01p", ProtocolError, 0x82),             # password without a user name
    (0x82, CLIENT_ID, MalformedPacket, 0x81),                          # user name flag, no user name
    (0x02, CLIENT_ID + b"\x00", MalformedPacket, 0x81),                # a byte past the end
    (0x06, CLIENT_ID + b"\x00\x01w", MalformedPacket, 0x81),           # will without its payload
    (0x02, b"\x00\x03c\x00d", MalformedPacket, 0x81),                  # client id with U+0000
    (0x02, b"\x00\x02\xc0\xaf", MalformedPacket, 0x81),                # overlong UTF-8
])
def test_connect_flag_and_payload_checks_3_1_1(flags: int, payload: bytes, kind: type[MqttError],
                                              reason: int) -> None:
    raises(Decoder(), _connect_wire(flags, payload), kind, reason)


def test_connect_password_without_user_name_is_allowed_in_5_0() -> None:
    got = Decoder().feed(_connect_wire(0x42, CLIENT_ID + b"\x00\x01p", 5, props=b"\x00"))
    assert got == [Connect("MQTT", 5, True, 60, "c", None, None, b"p", {})]
    raises(Decoder(), _connect_wire(0x42, CLIENT_ID + b"\x00\x01p", 3, name=b"MQIsdp"), ProtocolError, 0x82)


def test_connect_protocol_name_and_level() -> None:
    for level, name in ((6, b"MQTT"), (3, b"MQTT"), (2, b"MQTT"), (4, b"MQIsdp"), (5, b"MQIsdp")):
        decoder = Decoder()
        raises(decoder, _connect_wire(0x02, CLIENT_ID, level, name), UnsupportedProtocolVersion, 0x84)
        assert decoder.version == 4  # the refusal is a 3.1.1-format CONNACK
    raises(Decoder(), _connect_wire(0x02, CLIENT_ID, 4, b"MQTX"), ProtocolError, 0x82)


def test_a_bad_5_0_connect_still_sets_the_version_for_its_connack() -> None:
    decoder = Decoder()
    raises(decoder, _connect_wire(0x02, CLIENT_ID, 5, props=b"\x02\x23\x00"), MalformedPacket, 0x81)
    assert decoder.version == 5


@pytest.mark.parametrize("props, kind, reason", [
    ("0a11000000011100000002", ProtocolError, 0x82),   # session expiry twice
    ("03230001", MalformedPacket, 0x81),               # topic alias: not a CONNECT property
    ("027f00", MalformedPacket, 0x81),                 # unknown property
    ("03210000", ProtocolError, 0x82),                 # receive maximum 0
    ("052700000000", ProtocolError, 0x82),             # maximum packet size 0
    ("021702", ProtocolError, 0x82),                   # request problem information 2
    ("7f11000000", MalformedPacket, 0x81),             # length past the end of the packet
    ("0411000000", MalformedPacket, 0x81),             # the value runs past the properties
    ("06260001610001", MalformedPacket, 0x81),         # user property cut short
    ("801500", MalformedPacket, 0x81),                 # a two-byte length (2688) past the end
    ("ffffffff7f", MalformedPacket, 0x81),             # property length of five bytes
    ("041600016b", ProtocolError, 0x82),               # authentication data without a method
])
def test_connect_property_errors(props: str, kind: type[MqttError], reason: int) -> None:
    raises(Decoder(), _connect_wire(0x02, CLIENT_ID, 5, props=bytes.fromhex(props)), kind, reason)


def test_publish_property_errors() -> None:
    def publish(props: str) -> bytes:
        body = bytes.fromhex("000161" + props) + b"payload"
        return bytes((0x30, len(body))) + body
    raises(server_decoder(5), publish("020102"), ProtocolError, 0x82)           # payload format 2
    raises(server_decoder(5), publish("03230000"), ProtocolError, 0x82)         # topic alias 0
    raises(server_decoder(5), publish("06230001230002"), ProtocolError, 0x82)   # topic alias twice
    raises(server_decoder(5), publish("020b01"), ProtocolError, 0x82)           # subscription id from a client
    raises(server_decoder(5), publish("021100"), MalformedPacket, 0x81)         # session expiry in PUBLISH
    assert client_decoder(5).feed(publish("040b010b02")) == [
        Publish("a", b"payload", properties={"subscription_identifier": [1, 2]})]
    raises(client_decoder(5), publish("020b00"), ProtocolError, 0x82)           # subscription id 0
    sub_twice = bytes.fromhex("820b" "0001" "04" "0b010b02" "000161" "00")
    raises(server_decoder(5), sub_twice, ProtocolError, 0x82)


def test_auth_does_not_exist_before_5_0() -> None:
    raises(server_decoder(4), b"\xf0\x00", MalformedPacket, 0x81)
    assert server_decoder(5).feed(b"\xf0\x00") == [Auth()]
    with pytest.raises(ValueError):
        encode(Auth(), 4)


def test_packet_too_large_before_the_body_arrives() -> None:
    decoder = Decoder(max_packet_size=100)
    decoder.feed(encode(connect_packet(4), 4))
    assert decoder.feed(encode_publish("t", b"x" * 95)) == [Publish("t", b"x" * 95)]  # 100 bytes: the limit
    raises(decoder, encode_publish("t", b"x" * 96)[:3], PacketTooLarge, 0x95)


def test_errors_keep_the_packets_before_them_and_kill_the_decoder() -> None:
    decoder = server_decoder(4)
    error = raises(decoder, encode(PingReq(), 4) + encode_publish("a", b"b") + b"\x36\x00", MalformedPacket, 0x81)
    assert error.packets == [PingReq(), Publish("a", b"b")]
    with pytest.raises(MalformedPacket):
        decoder.feed(encode(PingReq(), 4))


# -- the encoder's own checks and helpers ------------------------------------------------------------------------
def test_encoder_refuses_what_it_cannot_send() -> None:
    with pytest.raises(ValueError):
        encode_publish("a", b"", 1)  # QoS 1 without a packet id
    with pytest.raises(ValueError):
        encode(Publish("a", b"", properties={"session_expiry_interval": 1}), 5)
    with pytest.raises(ValueError):
        encode(ConnAck(properties={"no_such_property": 1}), 5)
    with pytest.raises(ValueError):
        encode_publish("t" * 70000, b"")
    assert encode(Publish("a", b"", properties={"content_type": "x"}), 4) == encode_publish("a", b"")


def test_encode_publish_is_encode_of_a_publish() -> None:
    for v in VERSIONS:
        for packet in client_packets(v) + server_packets(v):
            if isinstance(packet, Publish):
                assert encode_publish(packet.topic, packet.payload, packet.qos, packet.retain, packet.dup,
                                      packet.packet_id, packet.properties, v) == encode(packet, v)


def test_connack_codes_for_3_1_1() -> None:
    assert [connack_code_v3(r) for r in (0, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x80, 0x9F)] == \
        [0, 1, 2, 4, 5, 3, 3, 5, 4, 3, 3]
    assert (codec.SUCCESS, codec.MALFORMED_PACKET, codec.PACKET_TOO_LARGE, codec.NO_MATCHING_SUBSCRIBERS,
            codec.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, codec.DISCONNECT_WITH_WILL) == (0, 0x81, 0x95, 0x10, 0xA2, 4)
