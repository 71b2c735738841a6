"""The engine alone (no actor, no store): what a subscription made while this actor's own publishes are
on their way through the store gets of them."""

from __future__ import annotations

from smartgo.mqtt import codec as c
from smartgo.mqtt.auth import Authenticator
from smartgo.mqtt.bridge import Delivery
from smartgo.mqtt.engine import Connection, Engine, Limits
from tests.support.engine import Store, Wire, connect

SRC = "broker-a/MQTT/3"


class Unfed(Store):
    """This actor stored up to offset 5 of one queue; its feed has not offered those yet."""

    def unfed(self) -> dict[str, int]:
        return {SRC: 5}


def publishes(wire_out: bytes) -> list[bytes]:
    decoder = c.Decoder(server=False)
    decoder.version = 5
    return [p.payload for p in decoder.feed(bytes(wire_out)) if isinstance(p, c.Publish)]


def test_a_new_subscription_skips_what_was_stored_before_it_but_not_fed_yet():
    engine = Engine(Limits(), Unfed(), Authenticator())
    conn, wire = connect(engine, "late", 5001, filters=("t/#",))
    engine.deliver(Delivery("t/1", b"before", 1, True, "pub", {}), SRC, 5)      # stored before the SUBSCRIBE
    engine.deliver(Delivery("t/1", b"after", 1, False, "pub", {}), SRC, 6)
    engine.deliver(Delivery("t/1", b"other queue", 1, False, "pub", {}), "broker-a/MQTT/4", 2)
    conn.flush()
    assert publishes(wire.out) == [b"after", b"other queue"]


class Slow(Store):
    """A session lookup that has not answered yet (another node's holder is slow to hand it over)."""

    def __init__(self) -> None:
        self.waiting: list = []

    def find_session(self, client_id: str, *args: object) -> None:
        self.waiting.append(args[-1])


def test_a_connect_whose_session_is_being_looked_up_is_not_closed_for_want_of_a_connect():
    clock = [1000.0]
    store = Slow()
    engine = Engine(Limits(connect_timeout=10.0), store, Authenticator(), now=lambda: clock[0])
    conn = Connection(engine, "tcp")
    wire = Wire(("127.0.0.1", 5003))
    conn.connection_made(wire)
    conn.data_received(c.encode(c.Connect(protocol_level=4, clean_start=False, keep_alive=60, client_id="slow"), 4))
    assert store.waiting                                # looked up, not answered
    clock[0] += 25.0
    engine.tick()
    assert not wire.closed and engine.stats.connect_timeouts == 0
    store.waiting[0](None)                              # the lookup answers: nothing held elsewhere
    conn.flush()
    assert bytes(wire.out) == b"\x20\x02\x00\x00" and conn.session is not None


def test_a_connection_that_sends_no_connect_is_closed_at_its_deadline():
    clock = [1000.0]
    engine = Engine(Limits(connect_timeout=10.0), Store(), Authenticator(), now=lambda: clock[0])
    conn = Connection(engine, "tcp")
    wire = Wire(("127.0.0.1", 5004))
    conn.connection_made(wire)
    clock[0] += 11.0
    engine.tick()
    assert wire.closed and engine.stats.connect_timeouts == 1
