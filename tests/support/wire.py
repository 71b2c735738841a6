"""MQTT over a raw socket, packet by packet (smartgo.mqtt.codec on the client side): for tests that must
send what no well-behaved client sends, or read an answer exactly as it is on the wire (a 3.1.1 CONNACK
return code, which paho turns into a 5.0 reason code)."""

from __future__ import annotations

import socket
import time
from typing import Any

from smartgo.mqtt import codec as c
from tests.support.waits import LOOPBACK

WAIT = 20.0


class Raw:
    """One TCP connection to an MQTT listener; `version` decides how packets are encoded and decoded."""

    def __init__(self, port: int, version: int = 4, timeout: float = WAIT) -> None:
        self.sock = socket.create_connection((LOOPBACK, port), timeout=timeout)
        self.version = version
        self.decoder = c.Decoder(server=False)
        self.decoder.version = version
        self.got: list[Any] = []
        self.closed = False

    def send(self, packet: Any) -> None:
        self.sock.sendall(c.encode(packet, self.version))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, client_id: str, username: str | None = None, password: bytes | None = None,
                clean: bool = True, properties: dict | None = None) -> c.ConnAck:
        self.send(c.Connect("MQTT", self.version, clean, 60, client_id, None, username, password,
                            dict(properties or {})))
        ack = self.next(c.ConnAck)
        assert ack is not None, f"{client_id}: the connection closed with no CONNACK (got {self.got})"
        return ack

    def _read(self, deadline: float) -> bool:
        """One read into got; False once the connection is closed (or reset)."""
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            return False
        self.got += self.decoder.feed(data)
        return True

    def next(self, kind: type, timeout: float = WAIT) -> Any:
        """The first packet of this type not taken yet (None if the connection closed first)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, p in enumerate(self.got):
                if type(p) is kind:
                    return self.got.pop(i)
            if self.closed or not self._read(deadline):
                return None

    def until_closed(self, timeout: float = WAIT) -> list[Any]:
        """Every packet the server sends until it closes the connection (AssertionError if it does not)."""
        deadline = time.monotonic() + timeout
        try:
            while not self.closed and self._read(deadline):
                pass
        except TimeoutError:
            raise AssertionError(f"the server did not close the connection in {timeout}s; got {self.got}") \
                from None
        return self.got

    def partial(self) -> int:
        """Bytes received that do not (yet) make a whole packet: after a close, a packet cut short."""
        return len(self.decoder._tail)  # the codec's buffer: the Decoder offers no public view of it

    def close(self) -> None:
        self.sock.close()


def connect_sent(port: int, client_id: str, clean: bool = True, version: int = 4, keep_alive: int = 60,
                 timeout: float = WAIT) -> socket.socket:
    """A TCP connection to an MQTT listener that has sent its CONNECT, nothing read yet (for tests of
    very many connections, which a Raw each would make slow)."""
    sock = socket.create_connection((LOOPBACK, port), timeout=timeout)
    sock.sendall(c.encode(c.Connect(protocol_level=version, clean_start=clean, keep_alive=keep_alive,
                                    client_id=client_id), version))
    return sock


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the broker has closed a non-blocking socket (what it sent before is read and dropped)."""
    try:
        while sock.recv(4096):
            pass
    except BlockingIOError:
        return False
    except ConnectionResetError:
        pass
    return True
