"""Property tests of the MQTT codec: any input gives packets or an MqttError, nothing else; every valid
packet of every version survives encode -> decode, however the bytes are cut."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smartgo.mqtt.codec import (Auth, ConnAck, Connect, Decoder, Disconnect, MqttError, Packet, PingReq, PingResp,
                                PubAck, PubComp, Publish, PubRec, PubRel, SubAck, Subscribe, SubOptions, UnsubAck,
                                Unsubscribe, Will, encode)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VERSIONS = (3, 4, 5)
NAMES = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
BINARY = st.binary(max_size=40)
BIT = st.integers(0, 1)
U16 = st.integers(0, 0xFFFF)
U32 = st.integers(0, 0xFFFFFFFF)
PACKET_ID = st.integers(1, 0xFFFF)
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "payload_format_indicator": BIT, "message_expiry_interval": U32, "content_type": TEXT, "response_topic": TEXT,
    "correlation_data": BINARY, "subscription_identifier": st.integers(1, 268_435_455),
    "session_expiry_interval": U32, "assigned_client_identifier": TEXT, "server_keep_alive": U16,
    "authentication_method": TEXT, "authentication_data": BINARY, "request_problem_information": BIT,
    "will_delay_interval": U32, "request_response_information": BIT, "response_information": TEXT,
    "server_reference": TEXT, "reason_string": TEXT, "receive_maximum": st.integers(1, 0xFFFF),
    "topic_alias_maximum": U16, "topic_alias": st.integers(1, 0xFFFF), "maximum_qos": BIT, "retain_available": BIT,
    "user_property": st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3),
    "maximum_packet_size": st.integers(1, 0xFFFFFFFF), "wildcard_subscription_available": BIT,
    "subscription_identifier_available": BIT, "shared_subscription_available": BIT,
}
# the properties each packet may carry (MQTT 5.0 section 2.2.2.2), written out apart from the codec's table
MESSAGE = ["payload_format_indicator", "message_expiry_interval", "content_type", "response_topic",
           "correlation_data", "user_property"]
ALLOWED = {
    "CONNECT": ["session_expiry_interval", "receive_maximum", "maximum_packet_size", "topic_alias_maximum",
                "request_response_information", "request_problem_information", "user_property",
                "authentication_method", "authentication_data"],
    "WILL": ["will_delay_interval", *MESSAGE],
    "CONNACK": ["session_expiry_interval", "assigned_client_identifier", "server_keep_alive",
                "authentication_method", "authentication_data", "response_information", "server_reference",
                "reason_string", "receive_maximum", "topic_alias_maximum", "maximum_qos", "retain_available",
                "user_property", "maximum_packet_size", "wildcard_subscription_available",
                "subscription_identifier_available", "shared_subscription_available"],
    "PUBLISH": ["topic_alias", *MESSAGE],
    "ACK": ["reason_string", "user_property"],
    "SUBSCRIBE": ["subscription_identifier", "user_property"],
    "UNSUBSCRIBE": ["user_property"],
    "DISCONNECT": ["session_expiry_interval", "reason_string", "user_property", "server_reference"],
    "AUTH": ["authentication_method", "authentication_data", "reason_string", "user_property"],
}


def props(v: int, kind: str, **extra: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    if v < 5:
        return st.just({})
    return st.fixed_dictionaries({}, optional={**{n: VALUES[n] for n in ALLOWED[kind]}, **extra})


def reason(v: int) -> st.SearchStrategy[int]:
    return st.integers(0, 255) if v == 5 else st.just(0)


def publishes(v: int, to_client: bool) -> st.SearchStrategy[Publish]:
    extra = {"subscription_identifier": st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3)} \
        if to_client else {}
    return st.integers(0, 2).flatmap(lambda qos: st.builds(
        Publish, TEXT, st.binary(max_size=300), st.just(qos), st.booleans(), st.booleans() if qos else st.just(False),
        PACKET_ID if qos else st.none(), props(v, "PUBLISH", **extra)))


def acks(v: int) -> st.SearchStrategy[Packet]:
    return st.one_of(*(st.builds(kind, PACKET_ID, reason(v), props(v, "ACK"))
                       for kind in (PubAck, PubRec, PubRel, PubComp)))


def connects(v: int) -> st.SearchStrategy[Connect]:
    wills = st.none() | st.builds(Will, TEXT, BINARY, st.integers(0, 2), st.booleans(), props(v, "WILL"))
    users = st.tuples(st.none() | TEXT, st.none() | BINARY).filter(lambda up: v == 5 or up[0] is not None
                                                                    or up[1] is None)
    connect_props = props(v, "CONNECT").filter(  # authentication data needs its method
        lambda p: "authentication_method" in p or "authentication_data" not in p)
    return st.builds(lambda clean, keep, cid, will, up, p: Connect(NAMES[v], v, clean, keep, cid, will, *up, p),
                     st.booleans(), U16, TEXT, wills, users, connect_props)


def sub_options(v: int) -> st.SearchStrategy[SubOptions]:
    if v < 5:
        return st.builds(SubOptions, st.integers(0, 2))
    return st.builds(SubOptions, st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 2))


def from_client(v: int) -> st.SearchStrategy[Packet]:
    topics = st.lists(st.tuples(TEXT, sub_options(v)), min_size=1, max_size=4)
    five = [st.builds(Auth, reason(v), props(v, "AUTH"))] if v == 5 else []
    return st.one_of(
        publishes(v, False), acks(v), st.builds(PingReq),
        st.builds(Subscribe, PACKET_ID, topics, props(v, "SUBSCRIBE")),
        st.builds(Unsubscribe, PACKET_ID, st.lists(TEXT, min_size=1, max_size=4), props(v, "UNSUBSCRIBE")),
        st.builds(Disconnect, reason(v), props(v, "DISCONNECT")), *five)


def from_server(v: int) -> st.SearchStrategy[Packet]:
    sub_reasons = st.integers(0, 255) if v == 5 else st.sampled_from([0, 1, 2, 0x80])
    unsub_reasons = st.lists(st.integers(0, 255), max_size=4) if v == 5 else st.just([])
    five = [st.builds(Disconnect, reason(v), props(v, "DISCONNECT")),
            st.builds(Auth, reason(v), props(v, "AUTH"))] if v == 5 else []
    return st.one_of(
        st.builds(ConnAck, st.booleans() if v > 3 else st.just(False), st.integers(0, 255), props(v, "CONNACK")),
        publishes(v, True), acks(v), st.builds(PingResp),
        st.builds(SubAck, PACKET_ID, st.lists(sub_reasons, min_size=1, max_size=4), props(v, "ACK")),
        st.builds(UnsubAck, PACKET_ID, unsub_reasons, props(v, "ACK")), *five)


@st.composite
def conversations(draw: Callable[..., Any], server: bool) -> tuple[int, list[Packet]]:
    """A level and a valid packet sequence one side sends (a client's starts with its CONNECT)."""
    v = draw(st.sampled_from(VERSIONS))
    if server:
        return v, [draw(connects(v)), *draw(st.lists(from_client(v), max_size=6))]
    return v, draw(st.lists(from_server(v), min_size=1, max_size=6))


def decoder_for(v: int, server: bool) -> Decoder:
    decoder = Decoder(server=server)
    if not server:
        decoder.version = v
    return decoder


def feed_cut(decoder: Decoder, data: bytes, cuts: list[int]) -> list[Packet]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    out: list[Packet] = []
    for start, end in zip(points, points[1:]):
        out += decoder.feed(data[start:end])
    return out


@FUZZ
@given(st.booleans().flatmap(lambda server: st.tuples(st.just(server), conversations(server))),
       st.lists(st.integers(0, 1 << 16), max_size=8))
def test_valid_packets_round_trip_however_cut(case: tuple[bool, tuple[int, list[Packet]]], cuts: list[int]) -> None:
    server, (v, packets) = case
    wire = b"".join(encode(p, v) for p in packets)
    assert feed_cut(decoder_for(v, server), wire, cuts) == packets


@FUZZ
@given(st.sampled_from(VERSIONS), st.booleans(), st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=4))
def test_random_bytes_give_packets_or_an_mqtt_error(v: int, server: bool, data: bytes, cuts: list[int]) -> None:
    decoder = decoder_for(v, server)
    if server:
        decoder.feed(encode(Connect(NAMES[v], v, client_id="fuzz"), v))
    try:
        for packet in feed_cut(decoder, data, cuts):
            assert type(packet) in (Connect, ConnAck, Publish, PubAck, PubRec, PubRel, PubComp, Subscribe, SubAck,
                                    Unsubscribe, UnsubAck, PingReq, PingResp, Disconnect, Auth)
    except MqttError as error:
        assert error.reason in (0x81, 0x82, 0x84, 0x95)


@FUZZ
@given(st.booleans().flatmap(lambda server: st.tuples(st.just(server), conversations(server))),
       st.lists(st.tuples(st.sampled_from(["set", "insert", "delete"]), st.integers(0, 1 << 16), st.integers(0, 255)),
                min_size=1, max_size=4),
       st.integers(0, 1 << 16), st.lists(st.integers(0, 1 << 16), max_size=4))
def test_mutated_packets_give_packets_or_an_mqtt_error(case: tuple[bool, tuple[int, list[Packet]]],
                                                       mutations: list[tuple[str, int, int]], truncate: int,
                                                       cuts: list[int]) -> None:
    server, (v, packets) = case
    wire = bytearray(b"".join(encode(p, v) for p in packets))
    for how, where, byte in mutations:
        at = where % (len(wire) + 1)
        if how == "insert" or at == len(wire):
            wire.insert(at, byte)
        elif how == "set":
            wire[at] = byte
        else:
            del wire[at]
    data = bytes(wire[:max(1, truncate % (len(wire) + 1))])
    decoder = Decoder(max_packet_size=4096, server=server)
    if not server:
        decoder.version = v
    try:
        feed_cut(decoder, data, cuts)
    except MqttError as error:
        assert error.reason in (0x81, 0x82, 0x84, 0x95)
        with pytest.raises(MqttError):
            decoder.feed(b"\xc0\x00")
