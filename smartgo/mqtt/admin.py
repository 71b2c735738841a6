"""The admin channel of an MQTT actor: JSON lines on an abstract UNIX socket (local.py: `<actor>.admin`).

The broker actor asks every MQTT actor of its node through it (`smartgo admin mqtt-*`, the
metrics, the stats files) and `smartgo health` reads the counters from it: the sessions live in the
MQTT actors' memory, so only they can tell. One request per line, one answer per line:

    {"op": "clients" | "sessions" | "subscriptions", "limit": 100, "client": "<id prefix>",
     "filter": "<topic filter prefix>"}      -> {"ok": true, "total": N, "items": [...]}
    {"op": "kick", "client": "<client id>"}  -> {"ok": true, "kicked": true | false}
    {"op": "stats"}                          -> {"ok": true, "stats": MqttStats.snapshot()}

Lists are sorted by client id (then filter) and cut at `limit` (at most MAX_LIMIT); `total` counts
every match. A bad request gets {"ok": false, "error": "..."} and the connection stays open.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from smartgo.mqtt.engine import Engine
from smartgo.mqtt.local import connected, listening, local_address, shown
from smartgo.mqtt.session import NEVER, Session

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
LINE_LIMIT = 1 << 16                 # bytes of one request line
ANSWER_LIMIT = 64 << 20              # bytes of one answer line a reader accepts
Item = dict[str, Any]


def socket_path(run_path: Path, actor: str) -> str:
    return local_address(run_path, actor, "admin")


class AdminError(ValueError):
    """A request the channel cannot serve; its text goes back to the asker."""


def _client_row(s: Session) -> Item:
    conn = s.connection
    return {"client_id": s.client_id, "peer": conn.peer, "listener": conn.listener, "version": conn.version,
            "keep_alive": conn.keep_alive, "subscriptions": len(s.subscriptions), "inflight": len(s.inflight),
            "queued": len(s.queue)}


def _session_row(s: Session, now: float) -> Item:
    connected = s.connection is not None
    left = None
    if not connected and s.expiry != NEVER:
        left = max(0, round(s.expiry - (now - s.ended_at)))
    return {"client_id": s.client_id, "connected": connected, "expiry": "never" if s.expiry == NEVER else s.expiry,
            "expires_in": left, "subscriptions": len(s.subscriptions), "queued": len(s.queue),
            "queued_bytes": s.queued_bytes, "inflight": len(s.inflight), "dropped": s.dropped}


def _subscription_rows(sessions: Iterable[Session], prefix: str) -> Iterator[Item]:
    for s in sessions:
        for flt, sub in s.subscriptions.items():
            if flt.startswith(prefix):
                o = sub.options
                yield {"client_id": s.client_id, "filter": flt, "qos": o.qos, "no_local": o.no_local,
                       "retain_as_published": o.retain_as_published, "retain_handling": o.retain_handling,
                       "identifier": sub.identifier}


def request_limit(request: dict) -> int:
    """A list request's limit (AdminError when it is not a whole number >= 0), at most MAX_LIMIT."""
    limit = request.get("limit", DEFAULT_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise AdminError(f"limit must be a whole number >= 0, not {limit!r}")
    return min(limit, MAX_LIMIT)


def _text(request: dict, key: str) -> str:
    value = request.get(key) or ""
    if not isinstance(value, str):
        raise AdminError(f"{key} must be a string, not {value!r}")
    return value


def _first(rows: Iterable[Item], limit: int, key: Callable[[Item], Any]) -> Item:
    """The `limit` smallest rows by key and how many there were, without sorting them all."""
    counted = _Counted(rows)
    items = heapq.nsmallest(limit, counted, key=key)
    return {"ok": True, "total": counted.n, "items": items}


class _Counted:
    __slots__ = ("rows", "n")

    def __init__(self, rows: Iterable[Item]) -> None:
        self.rows = rows
        self.n = 0

    def __iter__(self) -> Iterator[Item]:
        for row in self.rows:
            self.n += 1
            yield row


def _by_client(row: Item) -> str:
    return row["client_id"]


def answer(engine: Engine, request: object, now: Callable[[], float] = time.monotonic) -> Item:
    """The answer to one decoded request (pure but for kick, which disconnects the client)."""
    if not isinstance(request, dict):
        raise AdminError("a request is a JSON object")
    op = request.get("op")
    if op == "stats":
        return {"ok": True, "stats": engine.stats.snapshot()}
    prefix = _text(request, "client")
    if op == "kick":
        if not prefix:
            raise AdminError("kick needs a client id")
        kicked = engine.kick(prefix)
        if kicked:
            log.warning("mqtt %s: disconnected by an administrator", prefix)
        return {"ok": True, "kicked": kicked}
    limit = request_limit(request)
    sessions = (s for s in engine.sessions.values() if s.client_id.startswith(prefix))
    if op == "clients":
        return _first((_client_row(s) for s in sessions if s.connection is not None), limit, _by_client)
    if op == "sessions":
        t = now()
        return _first((_session_row(s, t) for s in sessions), limit, _by_client)
    if op == "subscriptions":
        return _first(_subscription_rows(sessions, _text(request, "filter")), limit,
                      lambda row: (row["client_id"], row["filter"]))
    raise AdminError(f"unknown op {op!r}: clients, sessions, subscriptions, kick or stats")


def handle_line(engine: Engine, line: bytes) -> bytes:
    try:
        reply = answer(engine, json.loads(line))
    except (AdminError, ValueError) as exc:
        reply = {"ok": False, "error": str(exc)}
    return json.dumps(reply, separators=(",", ":"), default=str).encode() + b"\n"


class AdminServer:
    """The actor's end of the channel."""

    def __init__(self, engine: Engine, path: str) -> None:
        self.engine = engine
        self.path = path
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> bool:
        """Listen; False (and a log line) when the socket cannot be made: MQTT goes on without it."""
        try:
            self.server = await asyncio.start_unix_server(self._serve, sock=listening(self.path), limit=LINE_LIMIT)
        except OSError as exc:
            log.error("mqtt admin channel not served at %s: %s", shown(self.path), exc)
            return False
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(handle_line(self.engine, line))
                await writer.drain()
        except (ValueError, ConnectionError) as exc:      # ValueError: a line over LINE_LIMIT
            log.warning("mqtt admin channel: %s; closing that connection", exc)
        finally:
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


def _reply(raw: bytes, path: str) -> Item:
    if not raw.endswith(b"\n"):
        raise OSError(f"{shown(path)}: no answer")
    reply = json.loads(raw)
    if not reply.get("ok"):
        raise AdminError(f"{shown(path)}: {reply.get('error')}")
    return reply


async def ask(path: str, request: dict, timeout: float = 3.0) -> Item:
    """One request to an MQTT actor; OSError when it does not answer, AdminError when it refuses."""
    async def go() -> bytes:
        reader, writer = await asyncio.open_unix_connection(sock=connected(path, timeout), limit=ANSWER_LIMIT)
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            return await reader.readline()
        finally:
            writer.close()
    try:
        raw = await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        raise OSError(f"{shown(path)}: no answer within {timeout:g}s") from None
    return _reply(raw, path)


def ask_blocking(path: str, request: dict, timeout: float = 3.0) -> Item:
    """ask() for a caller without an event loop (`smartgo health` on the node's own machine)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps(request).encode() + b"\n")
        chunks: list[bytes] = []
        while not (chunks and chunks[-1].endswith(b"\n")):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    return _reply(b"".join(chunks), path)


def merge_stats(snapshots: Iterable[dict]) -> dict[str, Any]:
    """Several actors' MqttStats.snapshot() added up (lists, the per-QoS counts, element by element)."""
    total: dict[str, Any] = {}
    for snap in snapshots:
        for key, value in snap.items():
            if isinstance(value, list):
                have = total.setdefault(key, [0] * len(value))
                total[key] = [a + b for a, b in zip(have, value)]
            else:
                total[key] = total.get(key, 0) + value
    return total
