"""The server's side of the flows a test client library hides: Receive Maximum, the client's Maximum
Packet Size, subscription identifiers, an assigned client id, keep-alive enforcement, Will Delay and
the bounded queue of an absent session. A raw socket speaks MQTT 5.0 through smartgo.mqtt.codec."""

from __future__ import annotations

import socket
import time

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from smartgo.mqtt import codec as c
from smartgo.mqtt.admin import ask_blocking, socket_path
from tests.support.broker import start_broker
from tests.support.mqtt import Broker, Client, unique
from tests.support.nodes import Node
from tests.support.waits import LOOPBACK, free_ports, wait_for_port, wait_until


class Raw:
    """A blocking MQTT 5.0 client on a socket: what it sends and reads is exactly what the test says."""

    def __init__(self, port: int, client_id: str, **props: object) -> None:
        self.sock = socket.create_connection((LOOPBACK, port), timeout=10)
        self.decoder = c.Decoder(server=False)
        self.decoder.version = 5
        self.pending: list = []
        self.send(c.Connect("MQTT", 5, True, 60, client_id, None, None, None, dict(props)))
        self.connack = self.read()
        assert isinstance(self.connack, c.ConnAck) and self.connack.reason == 0, self.connack

    def send(self, packet: object) -> None:
        self.sock.sendall(c.encode(packet, 5))

    def read(self, timeout: float = 10.0) -> object:
        self.sock.settimeout(timeout)
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.pending += self.decoder.feed(data)
        return self.pending.pop(0)

    def quiet(self, seconds: float) -> bool:
        """True when nothing comes for that long."""
        try:
            self.read(seconds)
        except TimeoutError:
            return True
        return False

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Node:
    port, = free_ports(1)
    started = start_broker(tmp_path_factory.mktemp("flows") / "node",
                           {"mqtt_port": port, "mqtt_ws_port": 0, "mqtt_max_queued_messages": 3})
    started.mqtt_port = port  # type: ignore[attr-defined]  # the test's MQTT port
    wait_for_port(port, timeout=30)
    yield started
    started.reap()


def broker(node: Node) -> Broker:
    return Broker("smartgo", node.mqtt_port, 0, node.reap, node=node)


@pytest.mark.timeout(90)
def test_receive_maximum_bounds_what_is_in_flight_to_the_client(node):
    topic = unique("flow")
    raw = Raw(node.mqtt_port, unique("slow"), receive_maximum=2)
    raw.send(c.Subscribe(1, [(topic, c.SubOptions(1))], {"subscription_identifier": [7]}))
    assert isinstance(raw.read(), c.SubAck)
    publisher = Client(broker(node))
    publisher.connect()
    for i in range(5):
        assert publisher.publish(topic, f"m{i}".encode(), qos=1) == 0
    first = [raw.read(), raw.read()]
    assert [p.payload for p in first] == [b"m0", b"m1"]
    assert all(p.properties["subscription_identifier"] == [7] for p in first)
    assert raw.quiet(1.0)                                  # two unacknowledged: the third waits
    raw.send(c.PubAck(first[0].packet_id))
    assert raw.read().payload == b"m2"
    assert raw.quiet(1.0)
    raw.close()
    publisher.disconnect()


@pytest.mark.timeout(90)
def test_a_message_over_the_clients_maximum_packet_size_is_not_sent(node):
    topic = unique("small")
    raw = Raw(node.mqtt_port, unique("tiny"), maximum_packet_size=200)
    raw.send(c.Subscribe(1, [(topic, c.SubOptions(0))], {}))
    assert isinstance(raw.read(), c.SubAck)
    publisher = Client(broker(node))
    publisher.connect()
    publisher.publish(topic, b"x" * 500, qos=1)
    publisher.publish(topic, b"fits", qos=1)
    assert raw.read().payload == b"fits"                  # the big one was dropped as if sent
    raw.close()
    publisher.disconnect()


@pytest.mark.timeout(60)
def test_a_zero_length_client_id_is_assigned_one(node):
    raw = Raw(node.mqtt_port, "")
    assigned = raw.connack.properties["assigned_client_identifier"]
    assert assigned.startswith("auto-") and len(assigned) > 10
    raw.close()


@pytest.mark.timeout(60)
def test_a_silent_client_is_closed_after_one_and_a_half_keep_alives_and_its_will_published(node):
    topic = unique("lastwill")
    watcher = Client(broker(node))
    watcher.connect()
    watcher.subscribe(topic, qos=1)
    sock = socket.create_connection((LOOPBACK, node.mqtt_port), timeout=10)
    sock.sendall(c.encode(c.Connect("MQTT", 5, True, 1, unique("mute"), c.Will(topic, b"gone", 1, False, {}),
                                    None, None, {}), 5))
    decoder = c.Decoder(server=False)
    decoder.version = 5
    started = time.monotonic()
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    elapsed = time.monotonic() - started
    packets = decoder.feed(got)
    assert isinstance(packets[0], c.ConnAck)
    assert isinstance(packets[-1], c.Disconnect) and packets[-1].reason == c.KEEP_ALIVE_TIMEOUT
    assert 1.4 <= elapsed <= 4.0, elapsed                 # 1.5 x 1 s, checked by a one-second wheel
    assert watcher.messages.until(b"gone")[-1].topic == topic
    watcher.disconnect()


@pytest.mark.timeout(90)
def test_will_delay_waits_and_a_reconnect_within_it_cancels_the_will(node):
    topic = unique("delayed")
    watcher = Client(broker(node))
    watcher.connect()
    watcher.subscribe(topic, qos=1)
    device = unique("flaky")

    def vanish(payload: bytes) -> None:           # connect with a 2 s will delay, then drop the socket
        sock = socket.create_connection((LOOPBACK, node.mqtt_port), timeout=10)
        will = c.Will(topic, payload, 1, False, {"will_delay_interval": 2})
        sock.sendall(c.encode(c.Connect("MQTT", 5, False, 60, device, will, None, None,
                                        {"session_expiry_interval": 60}), 5))
        assert sock.recv(64)[:1] == b"\x20"
        sock.close()

    vanish(b"first")
    back = Raw(node.mqtt_port, device)         # clean start: the session (and its will) are taken over
    back.close()
    vanish(b"second")
    dropped = time.monotonic()
    got = watcher.messages.until(b"second", timeout=20)
    assert time.monotonic() - dropped >= 1.9
    assert b"first" not in [m.payload for m in got]
    watcher.disconnect()


@pytest.mark.timeout(90)
def test_an_absent_sessions_queue_is_bounded_and_what_it_drops_is_counted(node):
    topic, device = unique("bounded"), unique("away")
    away = Client(broker(node), device, version=4, clean=False)
    away.connect()
    away.subscribe(topic, qos=1)
    away.disconnect()
    publisher = Client(broker(node))
    publisher.connect()
    for i in range(5):
        assert publisher.publish(topic, f"q{i}".encode(), qos=1) == 0
    node.logged(f"mqtt {device}: its queue is full (3 messages", "a message dropped, 1 so far")

    def dropped() -> int:
        rows = ask_blocking(socket_path(node.store / "run", "mqtt-0"), {"op": "sessions", "client": device})
        return rows["items"][0]["dropped"] if rows["items"] else -1
    wait_until(lambda: dropped() == 2, 20, 0.1, "2 dropped in the session's count")
    back = Client(broker(node), device, version=4, clean=False)
    back.connect()
    assert [m.payload for m in back.messages.take(3)] == [b"q0", b"q1", b"q2"]
    assert publisher.publish(topic, b"after", qos=1) == 0
    assert [m.payload for m in back.messages.until(b"after")] == [b"q0", b"q1", b"q2", b"after"]
    back.disconnect()
    publisher.disconnect()


@pytest.mark.timeout(90)
def test_no_local_retain_handling_and_retain_as_published(node):
    topic = unique("opts")
    me, other = Client(broker(node)), Client(broker(node))
    me.connect()
    other.connect()
    me.subscribe(topic, options=SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True))
    me.publish(topic, b"mine", qos=1, retain=True)              # no local: not back to me
    other.publish(topic, b"theirs", qos=1, retain=True)
    got = me.messages.until(b"theirs")
    assert [m.payload for m in got] == [b"theirs"]
    assert got[-1].retain                                     # retain as published: the flag kept
    plain = Client(broker(node))
    plain.connect()
    plain.subscribe(topic, qos=1)                             # handling 0: the retained message at once
    assert [(m.payload, m.retain) for m in plain.messages.take(1)] == [(b"theirs", True)]
    other.publish(topic, b"live", qos=1, retain=True)
    assert plain.messages.until(b"live")[-1].retain is False  # not as published: a live message is not retained
    for handling, wanted in ((2, []), (1, [b"live"])):
        late = Client(broker(node))
        late.connect()
        late.subscribe(topic, options=SubscribeOptions(qos=1, retainHandling=handling))
        if handling == 1:                                      # again: the subscription exists, nothing sent
            late.subscribe(topic, options=SubscribeOptions(qos=1, retainHandling=1))
        other.publish(topic, b"marker", qos=1)
        assert [m.payload for m in late.messages.until(b"marker")][:-1] == wanted, handling
        late.disconnect()
    for client in (me, other, plain):
        client.disconnect()
