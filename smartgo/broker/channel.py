"""The request channel between the net actors and the broker actor (the control plane's way in).

Two rings per net actor carry msgpack maps: ctl.<net> (net -> broker) and ctlr.<net> (broker ->
net). The kinds of traffic:

- calls: `await link.call(op, **args)` in a net actor runs the broker's `calls[op](net, args)`
  and returns its value (auto-creating a topic, for one);
- forwarded requests: a remoting request with a code in the broker's processor table is handed
  over whole; the broker's processor returns a RemotingCommand, which goes back to the very
  connection it came from (`ClientRef` names it: net actor, connection id, remote address);
  `link.forward_nowait` hands one over and drops the answer (heartbeats replayed to a
  restarted broker actor);
- events, net -> broker: `link.event(op, **args)` runs the broker's `events[op](net, args)`
  (conn_closed, stats, ...); consumer offsets go as `link.commit_offset(...)`, coalesced: every
  commit of one loop iteration leaves as one "offsets" event (the latest offset per queue);
- events, broker -> net: `server.send(net, op, **args)` / `server.broadcast(op, **args)` run the
  net actor's `link.events[op](args)` in ring order (group states, settings). They carry a
  sequence number per net actor; a net actor that sees a gap (a record dropped by a full ring,
  or a restarted broker actor) calls `link.on_gap()` to ask for everything again;
- pushes: the broker sends a request to a client connection (`server.push(client, cmd)`, e.g.
  NOTIFY_CONSUMER_IDS_CHANGED);
- invocations: `await server.invoke(client, cmd, timeout)` sends a request to a client connection
  and returns the client's response (Broker2Client.callClient: GET_CONSUMER_RUNNING_INFO,
  CONSUME_MESSAGE_DIRECTLY). The net actor holding the connection sends it with an opaque of its
  own and hands the response back; InvokeError says why there is none (timeout, closed
  connection).

Records written during one loop iteration leave as one ring batch. The broker actor handles
records in ring order and runs a handler that returns a value (not an awaitable) at once, so
an event, a forwarded heartbeat and a call from one net actor take effect in the order the net
actor sent them. A call whose answer does not come within its timeout fails with ChannelError
(the broker may be restarting); a restarted broker never answers its predecessor's calls.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from smartgo.actors.ring import Ring, wait_any
from smartgo.broker.rings import Batcher
from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.loop import wait_within

log = logging.getLogger(__name__)

INVOKE_MARGIN = 1.0        # s the broker waits for an invocation's answer beyond the client's timeout

_CALL, _FORWARD, _EVENT, _REPLY, _PUSH = "call", "fwd", "evt", "re", "push"
_INVOKE, _ANSWER = "inv", "ans"        # broker -> net: a request to a client; net -> broker: its response


class ChannelError(Exception):
    """A call the broker actor did not answer (timeout, full ring) or answered with an error."""


class InvokeError(Exception):
    """A request to a client got no response; `timeout` tells a timeout from any other failure."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


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
    """Control records (msgpack maps), one ring batch per loop iteration; consumer offsets
    committed during the iteration become one record, ahead of anything put after them."""

    def __init__(self, ring: Ring) -> None:
        super().__init__(ring)
        self.offsets: dict[tuple[str, str, int], int] = {}

    def put(self, obj: dict) -> None:  # type: ignore[override]  # takes dicts only, unlike the base
        if self.offsets:
            self._put_offsets()
        super().put(_packb(obj))

    def offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.offsets[(group, topic, queue_id)] = offset
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _put_offsets(self) -> None:
        items = [[g, t, q, o] for (g, t, q), o in self.offsets.items()]
        self.offsets.clear()
        self._batch.append(_packb({"t": _EVENT, "op": "offsets", "a": {"o": items}}))

    def _flush(self) -> None:
        if self.offsets:
            self._put_offsets()
        super()._flush()


class BrokerLink:
    """The net actor's end: calls, forwarded requests, events; replies and pushes come in through
    on_records (the net actor drains ctlr.<net> with its other inbound rings)."""

    def __init__(self, out: Ring, push: Callable[[int, RemotingCommand], None],
                 invoke: Callable[[int, RemotingCommand, float], Awaitable[RemotingCommand]]) -> None:
        self._out = _Writer(out)
        self._push = push
        self._invoke = invoke
        self._invocations: set[asyncio.Task] = set()
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self.events: dict[str, Callable[[dict], None]] = {}
        self.on_gap: Callable[[], None] = lambda: None
        self._seq = 0

    def call(self, op: str, timeout: float = 3.0, **args: Any) -> Awaitable[Any]:
        return self._request({"t": _CALL, "op": op, "a": args}, timeout)

    def forward(self, client: ClientRef, request: RemotingCommand, timeout: float = 3.0) -> Awaitable[Any]:
        return self._request({"t": _FORWARD, "conn": client.conn, "addr": client.addr,
                              "cmd": pack_command(request)}, timeout)

    def forward_nowait(self, client: ClientRef, request: RemotingCommand) -> None:
        """Hand a request over and let its answer fall (id 0 is never waited for)."""
        self._out.put({"t": _FORWARD, "id": 0, "conn": client.conn, "addr": client.addr,
                       "cmd": pack_command(request)})

    def event(self, op: str, **args: Any) -> None:
        self._out.put({"t": _EVENT, "op": op, "a": args})

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._out.offset(group, topic, queue_id, offset)

    async def _request(self, msg: dict, timeout: float) -> Any:
        rid = next(self._ids)
        msg["id"] = rid
        fut = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        self._out.put(msg)
        try:
            return await wait_within(fut, timeout)
        except asyncio.TimeoutError:
            raise ChannelError(f"the broker actor did not answer {msg.get('op') or 'a forwarded request'} "
                               f"within {timeout:g}s") from None
        finally:
            self._waiting.pop(rid, None)

    async def settle(self, timeout: float) -> None:
        """Wait (at most timeout) for the answers to the requests handed over so far: a request
        that makes the broker actor restart the node (a role change) is answered on the way out."""
        if self._waiting:
            await asyncio.wait(list(self._waiting.values()), timeout=timeout)
            await asyncio.sleep(0)                  # their processors write the answers

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
                elif kind == _INVOKE:
                    task = asyncio.get_running_loop().create_task(self._answer(msg))
                    self._invocations.add(task)
                    task.add_done_callback(self._invocations.discard)
                elif kind == _EVENT:
                    self._on_event(msg)
                else:
                    log.error("unexpected control record kind %r", kind)
            except Exception:
                log.exception("bad control record from the broker actor")

    async def _answer(self, msg: dict) -> None:
        """Run an invocation on our client connection; its response (or why none) goes back."""
        answer: dict[str, Any] = {"t": _ANSWER, "id": msg["id"]}
        try:
            response = await self._invoke(msg["conn"], unpack_command(msg["cmd"]), msg["to"])
            answer["cmd"] = pack_command(response)
        except InvokeError as exc:
            answer.update(err=str(exc), timeout=exc.timeout)
        except Exception as exc:
            log.exception("invoking a client for the broker actor failed")
            answer.update(err=f"{type(exc).__name__}: {exc}", timeout=False)
        self._out.put(answer)

    def _on_event(self, msg: dict) -> None:
        seq, last = msg["s"], self._seq
        self._seq = seq
        handler = self.events.get(msg["op"])
        if handler is None:
            log.debug("broker event %s: no handler", msg["op"])
        else:
            handler(msg["a"])
        if last and seq != last + 1:
            log.info("broker events after #%d missed (got #%d: broker restarted or ring full); asking for its "
                     "state again", last, seq)
            self.on_gap()


Call = Callable[[str, dict], Any]
Processor = Callable[[ClientRef, RemotingCommand], "RemotingCommand | None | Awaitable[RemotingCommand | None]"]
Event = Callable[[str, dict], None]


def handlers(processor: Any) -> dict[int, Processor]:
    """A broker actor processor's table: its class's CODES (request code -> method name), bound.
    The net actors forward exactly these codes (smartgo.broker.actors.broker_actor.FORWARDED_CODES)."""
    return {code: getattr(processor, name) for code, name in processor.CODES.items()}


class ChannelServer:
    """The broker actor's end: serves every net actor's calls, forwarded requests and events."""

    def __init__(self, inbound: dict[str, Ring], outbound: dict[str, Ring]) -> None:
        self.inbound = inbound
        self._out = {net: _Writer(ring) for net, ring in outbound.items()}
        self._seq = dict.fromkeys(outbound, 0)
        self.calls: dict[str, Call] = {}
        self.processors: dict[int, Processor] = {}
        self.events: dict[str, Event] = {}
        self._tasks: set[asyncio.Task] = set()
        self._ids = itertools.count(1)
        self._invoking: dict[int, asyncio.Future] = {}

    def push(self, client: ClientRef, cmd: RemotingCommand) -> None:
        """Send a request (usually oneway) to a client's connection through its net actor."""
        out = self._out.get(client.net)
        if out is not None:
            out.put({"t": _PUSH, "conn": client.conn, "cmd": pack_command(cmd)})

    async def invoke(self, client: ClientRef, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request to a client's connection and return its response; InvokeError if none
        came within timeout (the net actor times the client out; a little more is allowed here
        for the rings), or the net actor could not send it."""
        out = self._out.get(client.net)
        if out is None:
            raise InvokeError(f"no net actor {client.net}")
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._invoking[rid] = fut
        out.put({"t": _INVOKE, "id": rid, "conn": client.conn, "to": timeout, "cmd": pack_command(cmd)})
        try:
            return await wait_within(fut, timeout + INVOKE_MARGIN)
        except asyncio.TimeoutError:
            raise InvokeError(f"no response from {client.addr} through {client.net} within {timeout:g}s",
                              timeout=True) from None
        finally:
            self._invoking.pop(rid, None)

    def _on_answer(self, msg: dict) -> None:
        fut = self._invoking.get(msg["id"])
        if fut is None or fut.done():
            return                          # timed out here already
        if "cmd" in msg:
            fut.set_result(unpack_command(msg["cmd"]))
        else:
            fut.set_exception(InvokeError(msg["err"], msg.get("timeout", False)))

    @property
    def nets(self) -> list[str]:
        return list(self._out)

    def send(self, net: str, op: str, **args: Any) -> None:
        """An event to one net actor (its link.events[op](args))."""
        self._seq[net] += 1
        self._out[net].put({"t": _EVENT, "op": op, "a": args, "s": self._seq[net]})

    def broadcast(self, op: str, **args: Any) -> None:
        for net in self._out:
            self.send(net, op, **args)

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
        if kind == _ANSWER:
            try:
                self._on_answer(msg)
            except Exception:
                log.exception("bad invocation answer from %s", net)
            return
        rid = msg.get("id")
        try:
            if kind == _CALL:
                handler = self.calls.get(msg["op"])
                if handler is None:
                    raise ChannelError(f"unknown broker call {msg['op']!r}")
                value = handler(net, msg["a"])
            elif kind == _FORWARD:
                request = unpack_command(msg["cmd"])
                processor = self.processors.get(request.code)
                if processor is None:
                    raise ChannelError(f"the broker actor has no processor for code {request.code}")
                value = processor(ClientRef(net, msg["conn"], msg["addr"]), request)
            else:
                raise ChannelError(f"unknown control record kind {kind!r}")
        except Exception as exc:
            self._fail(net, rid, kind, msg, exc)
            return
        if inspect.isawaitable(value):
            task = asyncio.get_running_loop().create_task(self._finish(net, rid, kind, msg, value))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._reply(net, rid, kind, value)

    async def _finish(self, net: str, rid: int, kind: str, msg: dict, pending: Awaitable[Any]) -> None:
        try:
            value = await pending
        except Exception as exc:
            self._fail(net, rid, kind, msg, exc)
            return
        self._reply(net, rid, kind, value)

    def _reply(self, net: str, rid: int, kind: str, value: Any) -> None:
        if kind == _FORWARD and value is not None:
            value = pack_command(value)
        if rid:
            self._out[net].put({"t": _REPLY, "id": rid, "ok": True, "v": value})

    def _fail(self, net: str, rid: int, kind: str, msg: dict, exc: Exception) -> None:
        """A call fails with ChannelError at the caller; a forwarded request that raised is
        answered SYSTEM_ERROR with the error as the remark (bad input - a ValueError such as a
        malformed body or header field - is logged as a warning, anything else with its trace)."""
        if kind == _FORWARD and not isinstance(exc, ChannelError):
            request = unpack_command(msg["cmd"])
            if isinstance(exc, ValueError):
                log.warning("request code %d from %s refused: %s", request.code, msg.get("addr"), exc)
                remark = str(exc)
            else:
                log.error("processor for code %d failed", request.code, exc_info=exc)
                remark = f"{type(exc).__name__}: {exc}"
            self._reply(net, rid, kind, request.make_response(ResponseCode.SYSTEM_ERROR, remark))
            return
        if not isinstance(exc, ChannelError):
            log.exception("broker %s %s failed", kind, msg.get("op"), exc_info=exc)
        if rid:
            self._out[net].put({"t": _REPLY, "id": rid, "ok": False,
                                "v": str(exc) if isinstance(exc, ChannelError) else f"{type(exc).__name__}: {exc}"})

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
