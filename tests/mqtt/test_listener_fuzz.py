"""Bad input on a live MQTT listener: garbage, a remaining length over the limit, a packet before CONNECT, a
CONNECT that never comes, an invalid UTF-8 topic, wildcards in a PUBLISH topic, a second CONNECT; then
hypothesis sending random bytes and mutated valid packets. Each bad connection is closed (5.0: after a
DISCONNECT with the reason MQTT 5.0 4.13 prescribes, once the connection is known to be 5.0), the node log
has a warning naming the connection, and a well-behaved paho client on the same node keeps publishing and
receiving throughout; the MQTT actor is never restarted."""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smartgo.mqtt import codec as c
from tests.support.mqtt import Broker, Client, start_smartgo, unique
from tests.support.wire import Raw

MAX_PACKET = 64 << 10
CONNECT_TIMEOUT = 1.0


class Canary:
    """A paho client publishing QoS 1 to its own subscription on a thread, every message acknowledged and
    received back, until stop(); stop() fails the test if it was ever disconnected or lost one."""

    def __init__(self, broker: Broker) -> None:
        self.client = Client(broker, version=5)
        self.client.connect()
        self.topic = unique("canary")
        assert self.client.subscribe(self.topic, qos=1) == [1]
        self.sent = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                assert self.client.publish(self.topic, str(self.sent).encode(), qos=1) == 0
                self.sent += 1
                if self.stopping.wait(0.05):
                    return
        except BaseException as exc:          # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        assert self.error is None, f"the well-behaved client failed: {self.error}"
        assert not self.client.disconnected.is_set(), "the well-behaved client was disconnected"
        want = [str(i).encode() for i in range(self.sent)]
        got = self.client.messages.wait_for(lambda ms: len(ms) >= len(want), what=f"{len(want)} canary messages")
        assert [m.payload for m in got] == want
        self.client.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_smartgo(tmp_path_factory.mktemp("fuzz") / "node",
                      {"mqtt_connect_timeout": CONNECT_TIMEOUT, "mqtt_max_packet_size": MAX_PACKET})
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def canary(broker: Broker) -> Iterator[Canary]:
    """The well-behaved client, checked after the test; the MQTT actor not restarted by it."""
    restarts = broker.node.actor("mqtt-0")["restarts"]
    bird = Canary(broker)
    yield bird
    bird.stop()
    assert broker.node.actor("mqtt-0")["restarts"] == restarts, "the MQTT actor was restarted"


def peer(conn: Raw) -> str:
    return "127.0.0.1:%d" % conn.sock.getsockname()[1]


def closed_with(conn: Raw, version: int, reason: int) -> None:
    """The connection closes, after DISCONNECT(reason) for 5.0 and nothing more for 3.1.1."""
    got = conn.until_closed()
    if version == 5:
        assert [(type(p), getattr(p, "reason", None)) for p in got] == [(c.Disconnect, reason)], got
    else:
        assert got == []


#: a remaining length as MQTT writes it (the codec's own encoder)
varint = c._vbi_bytes


def connected(broker: Broker, version: int) -> tuple[Raw, str]:
    conn = Raw(broker.port, version)
    client_id = unique("bad")
    assert conn.connect(client_id).reason == c.SUCCESS
    return conn, client_id


@pytest.mark.timeout(60)
@pytest.mark.parametrize("data", [pytest.param(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
                                  pytest.param(b"\xc0\x00", id="pingreq-before-connect"),
                                  pytest.param(b"\x82\x06\x00\x01\x00\x01a\x00", id="subscribe-before-connect"),
                                  pytest.param(b"\x10\xff\xff\xff\xff\x7f", id="five-byte-length")])
def test_garbage_or_a_packet_before_connect_is_closed(broker, canary, data):
    conn = Raw(broker.port)
    conn.send_bytes(data)
    assert conn.until_closed() == []              # no CONNACK, no DISCONNECT: not an MQTT connection yet
    broker.node.logged(f"mqtt - ({peer(conn)}): ")
    conn.close()


@pytest.mark.timeout(60)
def test_a_connect_that_never_comes(broker, canary):
    silent = Raw(broker.port)
    assert silent.until_closed(timeout=CONNECT_TIMEOUT + 10) == []
    broker.node.logged(f"mqtt {peer(silent)}: no CONNECT within {CONNECT_TIMEOUT:g}s")
    silent.close()


def _bad_utf8_publish(version: int) -> bytes:
    body = struct.pack(">H", 2) + b"\xff\xfe" + (b"\x00" if version == 5 else b"") + b"payload"
    return b"\x30" + varint(len(body)) + body


CASES = {
    "oversize": (lambda v: b"\x30" + varint(200_000_000), c.PACKET_TOO_LARGE),
    "over-max-packet-size": (lambda v: b"\x30" + varint(MAX_PACKET + 1), c.PACKET_TOO_LARGE),
    "invalid-utf8-topic": (_bad_utf8_publish, c.MALFORMED_PACKET),
    "wildcard-topic": (lambda v: c.encode_publish("a/+/b", b"x", version=v), c.TOPIC_NAME_INVALID),
    "hash-topic": (lambda v: c.encode_publish("a/#", b"x", 1, packet_id=1, version=v), c.TOPIC_NAME_INVALID),
    "second-connect": (lambda v: c.encode(c.Connect("MQTT", v, True, 60, "again"), v), c.PROTOCOL_ERROR),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_packet_after_connect(broker, canary, case, version):
    make, reason = CASES[case]
    conn, client_id = connected(broker, version)
    conn.send_bytes(make(version))
    closed_with(conn, version, reason)
    broker.node.logged(f"mqtt {client_id} ({peer(conn)}): ", f"disconnecting (reason 0x{reason:02X})")
    conn.close()


def _session(version: int) -> tuple[bytes, list[bytes]]:
    """A CONNECT of this version, and packets a client of it may send next."""
    connect = c.encode(c.Connect("MQTT", version, True, 60, f"fuzz{version}", None, "u" if version == 5 else None,
                                 b"p" if version == 5 else None, {"session_expiry_interval": 5} if version == 5
                                 else {}), version)
    after = [c.encode_publish("fuzz/t", b"x" * 20, 1, packet_id=7, version=version),
             c.encode_publish("fuzz/t", b"y", 2, packet_id=8, version=version),
             c.encode(c.Subscribe(3, [("fuzz/#", c.SubOptions(1))], {}), version),
             c.encode(c.Unsubscribe(4, ["fuzz/#"], {}), version), c.encode(c.PingReq(), version),
             c.encode(c.PubRel(9), version), c.encode(c.PubAck(10), version), c.encode(c.Disconnect(0, {}), version)]
    return connect, after


SESSIONS = {v: _session(v) for v in (3, 4, 5)}


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """Valid packets of one version (a CONNECT first, mostly) with bytes flipped, cut, inserted or repeated."""
    connect, after = SESSIONS[draw(st.sampled_from([3, 4, 5]))]
    data = bytearray(connect if draw(st.integers(0, 3)) else b"")
    data += b"".join(draw(st.lists(st.sampled_from(after), max_size=4)))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(["flip", "cut", "insert", "repeat"]))
        if how == "flip":
            data[at] = draw(st.integers(0, 255))
        elif how == "cut":
            del data[at:]
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            data += data[at:]
    return bytes(data)


@pytest.mark.timeout(240)
def test_random_and_mutated_input(broker, canary):
    """Whatever comes in, what goes out is valid MQTT (decodable), and the node stays up for everyone else."""
    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.one_of(st.binary(max_size=300), mutated()))
    def one(data: bytes) -> None:
        conn = Raw(broker.port, version=5 if b"\x04MQTT\x05" in data else 4)
        try:
            try:
                conn.send_bytes(data)
                conn.until_closed(timeout=0.3)
            except AssertionError:
                pass                               # still open: waiting for the rest of a packet, or a session
            except (ConnectionResetError, BrokenPipeError):
                pass
            except c.MqttError as exc:
                raise AssertionError(f"the server sent malformed MQTT after {data!r}: {exc}") from None
            assert not conn.partial(), f"the server sent part of a packet after {data!r}: {conn.got}"
        finally:
            conn.close()
    one()
