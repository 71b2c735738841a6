"""An MQTT engine with no actor around it, for tests: a transport that keeps what was written, a store
side that stores everything at once, and a client connected by real packets."""

from __future__ import annotations

from collections.abc import Callable

from smartgo.mqtt import codec as c
from smartgo.mqtt.engine import Connection, Engine
from smartgo.mqtt.session import Session


class Wire:
    """A connection's transport: what the engine wrote, and whether it closed it."""

    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer
        self.out = bytearray()
        self.closed = False

    def get_extra_info(self, name: str) -> object:
        return self.peer if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True


class Store:
    """The engine's store side (engine.StoreSide) of one node alone: every publish stored at once."""

    def store(self, publish: c.Publish, client_id: str, done: Callable[[int], None]) -> None:
        done(c.SUCCESS)

    def session_changed(self, session: Session) -> None:
        pass

    def session_ended(self, client_id: str) -> None:
        pass

    def when_persisted(self, session: Session, then: Callable[[], None]) -> None:
        then()

    def claim(self, session: Session) -> None:
        pass

    def forgotten(self, client_id: str) -> None:
        pass

    def unfed(self) -> dict[str, int]:
        return {}                        # the feed has offered everything stored

    def find_session(self, client_id: str, *args: object) -> None:
        then = args[-1]                  # after the clean flag: (client_id, clean, then)
        assert callable(then)
        then(None)                       # no other actor or node holds it


def connect(engine: Engine, client_id: str, port: int, version: int = 5, expiry: int = 0,
            filters: tuple[str, ...] = ()) -> tuple[Connection, Wire]:
    conn = Connection(engine, "tcp")
    wire = Wire(("127.0.0.1", port))
    conn.connection_made(wire)
    props = {"session_expiry_interval": expiry} if version == 5 and expiry else {}
    data = c.encode(c.Connect(protocol_level=version, clean_start=True, keep_alive=30, client_id=client_id,
                              properties=props), version)
    if filters:
        data += c.encode(c.Subscribe(1, [(f, c.SubOptions(1, no_local=version == 5)) for f in filters], {}), version)
    conn.data_received(data)
    assert not wire.closed and conn.session is not None
    return conn, wire
