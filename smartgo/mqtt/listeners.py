"""Where device connections come from: the MQTT ports of a node (TCP, WebSocket, TLS), shared by
its MQTT actors through SO_REUSEPORT, and the WebSocket framing in front of the MQTT stream."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Any

from smartgo.config import ConfigError, NodeConfig
from smartgo.mqtt import websocket as ws
from smartgo.mqtt.engine import Connection, Engine
from smartgo.net.limits import actors_for

log = logging.getLogger(__name__)

MQTT_PREFIX = "mqtt-"
BACKLOG = 4096


def mqtt_actor_count(config: NodeConfig) -> int:
    """--mqtt-actors, or more when --mqtt-connections needs more descriptors than they have."""
    return max(1, config.mqtt_actors, actors_for(config.mqtt_connections))


def mqtt_names(config: NodeConfig) -> list[str]:
    return [f"{MQTT_PREFIX}{i}" for i in range(mqtt_actor_count(config))]


def mqtt_ports(config: NodeConfig) -> list[tuple[str, int]]:
    """The node's MQTT listeners that are on, as (name, port)."""
    ports = [("mqtt", config.mqtt_port), ("mqtt-ws", config.mqtt_ws_port), ("mqtt-tls", config.mqtt_tls_port)]
    return [(what, port) for what, port in ports if port]


def _flag(what: str) -> str:
    name = what.replace("-", "_") + "_port"
    return f"{name} (--{name.replace('_', '-')})"


def check_ports_free(config: NodeConfig) -> None:
    """A port another program holds is a settings error naming the flag, before any actor starts
    (one that a node of ours shares with SO_REUSEPORT is caught by the supervisor's port claims)."""
    if config.mqtt_tls_port and not (config.tls_cert_file and config.tls_key_file):
        raise ConfigError("mqtt_tls_port needs tls_cert_file and tls_key_file (the node's certificate)")
    for what, port in mqtt_ports(config):
        try:
            listening_socket(config.listen_host, port, what).close()
        except OSError as exc:
            raise ConfigError(exc.strerror or str(exc)) from None


def listening_socket(host: str, port: int, what: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        why = "address already in use by another program" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise OSError(exc.errno, f"{_flag(what)} {port}: {why}; choose another port, or 0 to turn it off") \
            from None
    sock.setblocking(False)
    return sock


class _FramedTransport:
    """What the MQTT connection writes to on a WebSocket: each write one binary message."""

    __slots__ = ("raw",)

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def write(self, data: bytes) -> None:
        self.raw.write(ws.encode_frame(ws.BINARY, data))

    def close(self) -> None:
        if not self.raw.is_closing():
            self.raw.write(ws.close_frame(ws.CLOSE_NORMAL))
            self.raw.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.raw.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return bool(self.raw.is_closing())


class WebSocketConnection(asyncio.Protocol):
    """The RFC 6455 handshake, then binary messages carrying the MQTT stream (MQTT 5.0 section 6)."""

    __slots__ = ("mqtt", "raw", "head", "frames")

    def __init__(self, engine: Engine, listener: str) -> None:
        self.mqtt = Connection(engine, listener)
        self.raw: Any = None
        self.head: bytearray | None = bytearray()
        self.frames = ws.FrameDecoder(engine.limits.max_packet_size + 16)

    def connection_made(self, transport: Any) -> None:
        self.raw = transport
        self.mqtt.connection_made(_FramedTransport(transport))     # the CONNECT deadline runs from here

    def data_received(self, data: bytes) -> None:
        try:
            if self.head is not None:
                self.head += data
                shake, used = ws.parse_handshake(self.head)
                if shake is None:
                    return
                data, self.head = bytes(self.head[used:]), None
                self.raw.write(ws.handshake_response(shake))
                if not data:
                    return
            for frame in self.frames.feed(data):
                if frame.opcode == ws.BINARY:
                    self.mqtt.data_received(frame.payload)
                elif frame.opcode == ws.TEXT:
                    raise ws.WebSocketError(ws.CLOSE_UNSUPPORTED_DATA, "MQTT goes in binary messages")
                else:
                    reply = ws.control_reply(frame)
                    if reply is not None:
                        self.raw.write(reply)
                    if frame.opcode == ws.CLOSE:
                        self.raw.close()
                        return
        except ws.WebSocketError as exc:
            log.warning("mqtt websocket %s: %s; closing", self.mqtt.peer, exc.message)
            self.mqtt.engine.stats.bad_packets += 1
            if self.head is not None:
                self.raw.write(ws.error_response(exc.code, exc.message))
            else:
                self.raw.write(ws.close_frame(exc.code, exc.message))
            self.raw.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.mqtt.connection_lost(exc)
