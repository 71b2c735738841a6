"""The MQTT actors of one node hand sessions to each other over UNIX sockets (local.py: `<actor>.peer`).

The kernel spreads connections over the actors (SO_REUSEPORT), so a device that reconnects may land
on another actor than the one holding its session. The new one asks its peers to `take` the
session: the holder closes the old connection (session taken over), lets the session go and answers
with its record (sessions.py), which the asker restores. One msgpack map per request and per
answer, each preceded by its length.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from pathlib import Path

import msgpack

from smartgo.mqtt.local import connected, listening, local_address, shown

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
MAX_FRAME = 256 << 20
#: op -> handler(request) -> answer
Handler = Callable[[dict], dict]


def peer_path(run_path: Path, actor: str) -> str:
    return local_address(run_path, actor, "peer")


async def _read(reader: asyncio.StreamReader) -> dict:
    size = _LEN.unpack(await reader.readexactly(_LEN.size))[0]
    if size > MAX_FRAME:
        raise ValueError(f"a peer frame of {size} bytes")
    doc = msgpack.unpackb(await reader.readexactly(size), raw=False)
    if not isinstance(doc, dict):
        raise ValueError("a peer frame that is not a map")
    return doc


def _frame(doc: dict) -> bytes:
    body = msgpack.packb(doc, use_bin_type=True)
    return _LEN.pack(len(body)) + body


class PeerServer:
    def __init__(self, path: str, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._serve, sock=listening(self.path))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read(reader)
                try:
                    answer = self.handler(request)
                except (KeyError, ValueError, TypeError) as exc:
                    answer = {"error": str(exc)}
                writer.write(_frame(answer))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except ValueError as exc:
            log.warning("mqtt peer channel %s: %s; closing it", shown(self.path), exc)
        finally:
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def ask(path: str, request: dict, timeout: float = 3.0) -> dict | None:
    """One request to a peer; None when it is not there (restarting, or never started)."""
    async def go() -> dict:
        reader, writer = await asyncio.open_unix_connection(sock=connected(path, timeout))
        try:
            writer.write(_frame(request))
            await writer.drain()
            return await _read(reader)
        finally:
            writer.close()
    try:
        return await asyncio.wait_for(go(), timeout)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        log.info("mqtt peer %s did not answer %s: %s", shown(path), request.get("op"), exc)
        return None
