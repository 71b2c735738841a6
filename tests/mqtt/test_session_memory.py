"""What an idle session holds: a node keeps a million, so the empty queue, the empty set of QoS 2
packet ids awaiting PUBREL, the empty table of messages in flight and equal subscription options are
one shared object each, not a deque, a set, a dict and an options object per session - also once a session has queued, delivered and received
messages and is idle again."""

from __future__ import annotations

from smartgo.mqtt import codec as c
from smartgo.mqtt.auth import Authenticator
from smartgo.mqtt.bridge import Delivery
from smartgo.mqtt.engine import Connection, Engine, Limits
from smartgo.mqtt.session import Session
from tests.support.engine import Store, Wire


def _client(engine: Engine, client_id: str, port: int, clean: bool) -> tuple[Connection, Wire]:
    conn = Connection(engine, "tcp")
    wire = Wire(("127.0.0.1", port))
    conn.connection_made(wire)
    conn.data_received(c.encode(c.Connect(protocol_level=5, clean_start=clean, keep_alive=30, client_id=client_id,
                                          properties={"session_expiry_interval": 3600}), 5))
    return conn, wire


def _packets(wire: Wire) -> list:
    decoder = c.Decoder(server=False)
    decoder.version = 5
    return decoder.feed(bytes(wire.out))


def _busy_then_idle(engine: Engine, client_id: str, port: int) -> Session:
    """Subscribe, go away while QoS 1 messages queue, come back for them, publish QoS 2 and release it."""
    conn, wire = _client(engine, client_id, port, clean=True)
    conn.data_received(c.encode(c.Subscribe(1, [(f"devices/{client_id}/cmd", c.SubOptions(1))], {}), 5))
    conn.data_received(c.encode(c.Disconnect(), 5))
    for n in range(3):
        engine.deliver(Delivery(f"devices/{client_id}/cmd", b"cmd %d" % n, 1, False, "app", {}))
    session = engine.sessions[client_id]
    assert len(session.queue) == 3                     # queued while away
    conn, wire = _client(engine, client_id, port, clean=False)
    conn.flush()
    sent = [p for p in _packets(wire) if isinstance(p, c.Publish)]
    assert [p.payload for p in sent] == [b"cmd 0", b"cmd 1", b"cmd 2"]
    wire.out.clear()
    conn.data_received(b"".join(c.encode(c.PubAck(p.packet_id), 5) for p in sent))
    conn.data_received(c.encode(c.Publish(f"devices/{client_id}/up", b"t", 2, False, False, 7, {}), 5))
    assert 7 in session.inbound                        # PUBREL awaited
    conn.data_received(c.encode(c.PubRel(7), 5))
    conn.flush()
    kinds = [type(p) for p in _packets(wire)]
    assert kinds == [c.PubRec, c.PubComp]
    assert not session.queue and not session.inflight and not session.inbound
    return session


def test_idle_sessions_share_their_empty_queue_and_inbound_set():
    engine = Engine(Limits(), Store(), Authenticator())
    one = _busy_then_idle(engine, "d1", 5001)
    two = _busy_then_idle(engine, "d2", 5002)
    never_busy = engine.sessions.setdefault("d3", Session("d3"))
    assert one.queue is two.queue is never_busy.queue
    assert one.inbound is two.inbound is never_busy.inbound
    assert one.inflight is two.inflight is never_busy.inflight
    assert one.subscriptions["devices/d1/cmd"].options is two.subscriptions["devices/d2/cmd"].options
