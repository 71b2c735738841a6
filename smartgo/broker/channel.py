"""The request channel between the net actors and the broker actor (the control plane's way in).

Two rings per net actor carry msgpack maps: ctl.<net> (net -> broker) and ctlr.<net> (broker ->
net). Three kinds of traffic:

- calls: `await link.call(op, **args)` in a net actor runs the broker's `calls[op](client, args)`
  and returns its value (auto-creating a topic, for one);
- forwarded requests: a remoting request with a code in the broker's processor table is handed
  over whole; the broker's processor returns a RemotingCommand, which goes back to the very
  connection it came from (`ClientRef` names it: net actor, connection id, remote address);
- pushes and events: the broker sends a request to a client connection (`server.push(client,
  cmd)`, e.g. NOTIFY_CONSUMER_IDS_CHANGED), and net actors report connection events
  (`link.event("conn_closed", ...)`) to the broker's `events[op]`.

Records written during one loop iteration leave as one ring batch. A call whose answer does not
come within its timeout fails with ChannelError (the broker may be restarting); a restarted
broker never answers its predecessor's calls.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from smartgo.actors.ring import Ring, wait_any
from smartgo.broker.rings import Batcher
from smartgo.net.command import RemotingCommand

log = logging.getLogger("smartgo.broker.channel")

_CALL, _FORWARD, _EVENT, _REPLY, _PUSH = "call", "fwd", "evt", "re", "push"


class ChannelError(Exception):
    """A call the broker actor did not answer (timeout, full ring) or answered with an error."""


@dataclass(frozen=True, slots=True)
class ClientRef:
    """One client connection, node-wide: which net actor holds it, its id there, its address."""
    net: str
    conn: int
    addr: str


def pack_command(cmd: RemotingCommand) -> list:
    body = cmd.body_bytes() if cmd.body is not None else None
    return [cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields, body,
            cmd.serialize_type]


def unpack_command(raw: list) -> RemotingCommand:
    code, language, version, opaque, flag, remark, ext, body, st = raw
    return RemotingCommand(code, language, version, opaque, flag, remark, ext, body, st)


def _packb(obj: dict) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


class _Writer(Batcher):
    """Control records (msgpack maps), one ring batch per loop iteration."""

    def put(self, obj: dict) -> None:       # type: ignore[override]
        super().put(_packb(obj))


class BrokerLink:
    """The net actor's end: calls, forwarded requests, events; replies and pushes come in through
    on_records (the net actor drains ctlr.<net> with its other inbound rings)."""

    def __init__(self, out: Ring, push: Callable[[int, RemotingCommand], None]) -> None:
        self._out = _Writer(out)
        self._push = push
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}

    def call(self, op: str, timeout: float = 3.0, **args: Any) -> Awaitable[Any]:
        return self._request({"t": _CALL, "op": op, "a": args}, timeout)

    def forward(self, client: ClientRef, request: RemotingCommand, timeout: float = 3.0) -> Awaitable[Any]:
        return self._request({"t": _FORWARD, "conn": client.conn, "addr": client.addr,
                              "cmd": pack_command(request)}, timeout)

    def event(self, op: str, **args: Any) -> None:
        self._out.put({"t": _EVENT, "op": op, "a": args})

    async def _request(self, msg: dict, timeout: float) -> Any:
        rid = next(self._ids)
        msg["id"] = rid
        fut = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        self._out.put(msg)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise ChannelError(f"the broker actor did not answer {msg.get('op') or 'a forwarded request'} "
                               f"within {timeout:g}s") from None
        finally:
            self._waiting.pop(rid, None)

    def on_records(self, records: list[memoryview]) -> None:
        for raw in records:
            try:
                msg = msgpack.unpackb(raw, raw=False)
                kind = msg["t"]
                if kind == _REPLY:
                    fut = self._waiting.get(msg["id"])
                    if fut is not None and not fut.done():
                        if msg["ok"]:
                            fut.set_result(msg["v"])
                        else:
                            fut.set_exception(ChannelError(msg["v"]))
                elif kind == _PUSH:
                    self._push(msg["conn"], unpack_command(msg["cmd"]))
                else:
                    log.error("unexpected control record kind %r", kind)
            except Exception:
                log.exception("bad control record from the broker actor")


Call = Callable[[str, dict], Awaitable[Any]]
Processor = Callable[[ClientRef, RemotingCommand], Awaitable[RemotingCommand | None]]
Event = Callable[[str, dict], None]


class ChannelServer:
    """The broker actor's end: serves every net actor's calls, forwarded requests and events."""

    def __init__(self, inbound: dict[str, Ring], outbound: dict[str, Ring]) -> None:
        self.inbound = inbound
        self._out = {net: _Writer(ring) for net, ring in outbound.items()}
        self.calls: dict[str, Call] = {}
        self.processors: dict[int, Processor] = {}
        self.events: dict[str, Event] = {}
        self._tasks: set[asyncio.Task] = set()

    def push(self, client: ClientRef, cmd: RemotingCommand) -> None:
        """Send a request (usually oneway) to a client's connection through its net actor."""
        out = self._out.get(client.net)
        if out is not None:
            out.put({"t": _PUSH, "conn": client.conn, "cmd": pack_command(cmd)})

    async def run(self, bell) -> None:
        rings = list(self.inbound.items())
        while True:
            got = False
            for net, ring in rings:
                records = ring.read()
                if records:
                    got = True
                    for raw in records:
                        self._dispatch(net, raw)
                    ring.release()
            if not got:
                await wait_any([r for _, r in rings], bell, 1.0)
            else:
                await asyncio.sleep(0)

    def _dispatch(self, net: str, raw: memoryview) -> None:
        try:
            msg = msgpack.unpackb(raw, raw=False)
            kind = msg["t"]
        except Exception:
            log.exception("bad control record from %s", net)
            return
        if kind == _EVENT:
            handler = self.events.get(msg["op"])
            if handler is None:
                log.debug("event %s from %s: no handler", msg["op"], net)
                return
            try:
                handler(net, msg["a"])
            except Exception:
                log.exception("event handler %s failed", msg["op"])
            return
        task = asyncio.get_running_loop().create_task(self._answer(net, kind, msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, net: str, kind: str, msg: dict) -> None:
        rid = msg.get("id")
        try:
            if kind == _CALL:
                handler = self.calls.get(msg["op"])
                if handler is None:
                    raise ChannelError(f"unknown broker call {msg['op']!r}")
                value = await handler(net, msg["a"])
            elif kind == _FORWARD:
                request = unpack_command(msg["cmd"])
                processor = self.processors.get(request.code)
                if processor is None:
                    raise ChannelError(f"the broker actor has no processor for code {request.code}")
                response = await processor(ClientRef(net, msg["conn"], msg["addr"]), request)
                value = None if response is None else pack_command(response)
            else:
                raise ChannelError(f"unknown control record kind {kind!r}")
            reply = {"t": _REPLY, "id": rid, "ok": True, "v": value}
        except Exception as exc:
            if not isinstance(exc, ChannelError):
                log.exception("broker %s %s failed", kind, msg.get("op") or msg.get("cmd", [None])[0])
            reply = {"t": _REPLY, "id": rid, "ok": False, "v": f"{type(exc).__name__}: {exc}"
                     if not isinstance(exc, ChannelError) else str(exc)}
        self._out[net].put(reply)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
