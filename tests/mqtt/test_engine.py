"""The engine alone (no actor, no store): what a subscription made while this actor's own publishes are
on their way through the store gets of them."""

from __future__ import annotations

from smartgo.mqtt import codec as c
from smartgo.mqtt.auth import Authenticator
from smartgo.mqtt.bridge import Delivery
from smartgo.mqtt.engine import Engine, Limits
from tests.support.engine import Store, connect

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
