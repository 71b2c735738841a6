"""One remoting connection as an asyncio Protocol, shared by the server and the client side.

Either side may send requests on a connection (the broker notifies consumers on the client's own
connection), so both sides get the same machinery: a processor table for incoming requests, a
pending table keyed by opaque for outgoing ones, batched writes, back-pressure and events.

Requests run as tasks, so a long-polling processor never holds up the requests behind it; replies
go out as they complete and the opaque correlates them. Everything written during one loop
iteration leaves in one transport.writelines.

SmartGo negotiation: a SmartGo client sets FLAG_SMARTGO on its frames; a SmartGo server that sees
it sets it on its own frames from then on, and both sides may then use the MSGPACK header type
for their own requests and compress large bodies (FLAG_COMPRESSED). Foreign peers never send the
flag, so they only ever see RocketMQ's own encodings.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections import deque
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from smartgo.net.budget import TurnBudget
from smartgo.net.busy_poll import poller_for
from smartgo.net.codes import (FLAG_ONEWAY, FLAG_RESPONSE, FLAG_SMARTGO, ResponseCode,
                               SerializeType)
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import (ConnectionClosedError, FrameError, RemotingError,
                                RemotingTimeoutError)
from smartgo.net.frame import DEFAULT_MAX_FRAME, FrameDecoder, encode_command
from smartgo.net.wheel import TimingWheel

log = logging.getLogger(__name__)

Processor = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]
ResponseCallback = Callable[[RemotingCommand | None, BaseException | None], None]


class ConnectionEvent(enum.Enum):
    """Connection events (the seed's Net chapter 4.3, plus Idle as in Netty's IdleStateHandler).

    Every connection ends with exactly one of CLOSED (this side closed it: close(), a frame error,
    idleness, shutdown) or DISCONNECT (the peer closed it or the transport failed). ERROR precedes
    the end when something went wrong; IDLE precedes the CLOSED of an idle connection. A server
    connection accepted past max_connections gets REFUSED alone.
    """

    ACTIVE = "active"          # accepted by a server
    CONNECT = "connect"        # dialled by a client
    DISCONNECT = "disconnect"
    CLOSED = "closed"
    ERROR = "error"
    IDLE = "idle"
    REFUSED = "refused"        # accepted past the server's max_connections and closed at once: the only event


Listener = Callable[[ConnectionEvent, "Connection", "str | None"], None]
P = TypeVar("P", bound=Callable[..., Any])
T = TypeVar("T")

#: Buffers (about two per frame) gathered before a write even inside one batch, so that on a
#: pipelined connection both ends work at once instead of taking turns.
FLUSH_BUFFERS = 64

_opaques = itertools.count(1)
_connection_ids = itertools.count(1)

# What an idle connection points at instead of containers of its own (a net actor holds tens of
# thousands of idle connections): each is replaced by a real one when first needed.
_NO_TASKS: frozenset[asyncio.Task] = frozenset()
_NOTHING: tuple = ()


@dataclass(slots=True)
class EndpointOptions:
    """Settings shared by every connection of one server or client."""

    processors: Mapping[int, Processor] = field(default_factory=dict)
    default_processor: Processor | None = None
    listeners: Sequence[Listener] = ()
    max_frame: int = DEFAULT_MAX_FRAME
    #: Requests processed at once on one connection before reading pauses (memory bound).
    max_inflight: int = 4096
    idle_timeout: float | None = None
    #: Compress bodies at least this large towards SmartGo peers (0: never).
    compress_threshold: int = 0
    #: Header type for requests this side sends; MSGPACK is used only once the peer is known SmartGo.
    serialize_type: int = SerializeType.JSON
    #: Set FLAG_SMARTGO from the first frame (clients); a server answers in kind.
    announce: bool = False
    #: Pause reading while the transport's write buffer is over its high-water mark (servers).
    pause_reading_on_backpressure: bool = True
    #: Keep the loop polling this long after a read or a sent request (smartgo.net.busy_poll; 0: off).
    busy_poll_us: int = 0
    #: Called with every request this side sends, before it is encoded (RocketMQ's
    #: RPCHook.doBeforeRequest: the ACL signature).
    request_hook: Callable[[RemotingCommand], None] | None = None
    #: Shared by the endpoint's connections: requests run while the loop turn's budget lasts, the
    #: rest wait (reading paused) for the next turn (smartgo.net.budget). None: no bound.
    budget: TurnBudget | None = None


class Endpoint:
    """What a server and a client share: options, live connections, events and a housekeeping tick
    that fails timed-out requests and closes idle connections. A tick visits only the connections
    with requests outstanding and those whose idle deadline fell due (a timing wheel), so its cost
    does not grow with the connections held."""

    def __init__(self, options: EndpointOptions, scan_interval: float) -> None:
        self.options = options
        self.connections: dict[int, Connection] = {}
        self.waiting: set[Connection] = set()       # connections with requests outstanding
        self.capacity: int | None = None            # a server's max_connections
        idle = options.idle_timeout
        # connection ids, so a closed connection is not kept until its deadline
        self.idle: TimingWheel[int] | None = None if idle is None else TimingWheel(min(idle / 4, 1.0))
        self._scan_interval = scan_interval
        self._housekeeper: asyncio.Task | None = None

    def _emit(self, event: ConnectionEvent, conn: Connection, reason: str | None) -> None:
        for listener in self.options.listeners:
            try:
                listener(event, conn, reason)
            except Exception:
                log.exception("connection listener %r failed on %s for %s", listener, event.name, conn)

    def _start_housekeeping(self) -> None:
        if self._housekeeper is None:
            self._housekeeper = asyncio.get_running_loop().create_task(self._housekeep())

    async def _housekeep(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._scan_interval
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for conn in list(self.waiting):
                conn._expire(now)
            if self.idle is not None:
                self._close_idle(self.idle, now)

    def _close_idle(self, wheel: TimingWheel[int], now: float) -> None:
        """Close the connections silent for idle_timeout; one heard from since goes back in."""
        idle = self.options.idle_timeout or 0.0
        for conn_id in wheel.due(now):
            conn = self.connections.get(conn_id)
            if conn is None or conn.closed:
                continue
            if now - conn.last_active < idle:
                wheel.add(conn.last_active + idle, conn_id)
                continue
            log.info("closing %s: idle for %.0f s", conn, now - conn.last_active)
            self._emit(ConnectionEvent.IDLE, conn, f"idle for {idle:g} s")
            conn.close(f"idle for {idle:g} s")

    async def _close_all(self, reason: str, timeout: float = 5.0) -> None:
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            self._housekeeper = None
        conns = list(self.connections.values())
        for conn in conns:
            conn.close(reason)
        if conns:
            await asyncio.wait([asyncio.ensure_future(c.wait_closed()) for c in conns], timeout=timeout)


class Connection(asyncio.Protocol):
    """A live connection: `send`, `invoke`, `invoke_async`, `invoke_oneway`, `close`.

    `id` is unique in the process and stable for the connection's life; `remote_address` is
    "host:port" as RocketMQ prints it.
    """

    __slots__ = ("id", "remote_address", "last_active", "_endpoint", "_dialled", "_processors",
                 "_default_processor", "_max_inflight", "_request_hook", "_decoder", "_loop", "_transport",
                 "_pending", "_tasks", "_oneway", "_backlog", "_budget", "_deferred", "_out", "_flush_scheduled",
                 "_receiving", "_peer_smartgo", "_extra_flags", "_compress", "_request_type", "_write_paused",
                 "_inflight_paused", "_read_paused", "_drain_waiters", "_close_reason", "_lost", "_closed",
                 "_gatherer", "_kick")

    def __init__(self, endpoint: Endpoint, dialled: bool) -> None:
        opts = endpoint.options
        self.id = next(_connection_ids)
        self.remote_address = "?"
        self.last_active = 0.0
        self._endpoint = endpoint
        self._dialled = dialled
        self._processors = opts.processors
        self._default_processor = opts.default_processor
        self._max_inflight = opts.max_inflight
        self._request_hook = opts.request_hook
        self._decoder = FrameDecoder(opts.max_frame)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        # opaque -> (deadline, code, timeout, future or None, callback or None); the containers
        # below start as shared empty ones (_NOTHING, _NO_TASKS) and become their own when used
        self._pending: dict[int, tuple[float, int, float, asyncio.Future | None, ResponseCallback | None]] | None = None
        self._tasks: set[asyncio.Task] | frozenset[asyncio.Task] = _NO_TASKS
        # of _tasks: oneway requests', which outlive the connection
        self._oneway: set[asyncio.Task] | frozenset[asyncio.Task] = _NO_TASKS
        self._backlog: deque[RemotingCommand] | tuple = _NOTHING
        self._budget = opts.budget
        self._deferred = False      # the turn's budget ran out: the backlog goes on next turn
        self._out: list | tuple = _NOTHING
        self._flush_scheduled = False
        self._receiving = False
        self._peer_smartgo = False
        self._extra_flags = FLAG_SMARTGO if opts.announce else 0
        self._compress = 0
        self._request_type = SerializeType.JSON if opts.serialize_type == SerializeType.MSGPACK \
            else opts.serialize_type
        self._write_paused = False
        self._inflight_paused = False
        self._read_paused = False
        self._drain_waiters: list[asyncio.Future] | tuple = _NOTHING
        self._close_reason: str | None = None
        self._lost = False
        self._closed: asyncio.Future | None = None      # made for the first wait_closed()
        self._gatherer = _gatherer_for(self._loop)
        poller = poller_for(opts.busy_poll_us, self._loop)
        self._kick = poller.kick if poller is not None else None

    def __repr__(self) -> str:
        return f"<Connection #{self.id} {self.remote_address}>"

    # -- public API -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._transport is None or self._close_reason is not None

    @property
    def peer_is_smartgo(self) -> bool:
        return self._peer_smartgo

    @property
    def pending_count(self) -> int:
        return len(self._pending or _NOTHING)

    @property
    def local_address(self) -> str:
        transport = self._transport
        return "?" if transport is None else _address(transport.get_extra_info("sockname"))

    @property
    def inflight_count(self) -> int:
        return len(self._tasks)

    def send(self, cmd: RemotingCommand) -> bool:
        """Queue cmd for the next batched write; False if the connection is already closed."""
        if self._transport is None or self._close_reason is not None:
            log.debug("dropping code %d opaque %d for closed %s", cmd.code, cmd.opaque, self)
            return False
        out = self._out
        if out is _NOTHING:
            out = self._out = []
        out += encode_command(cmd, self._extra_flags, self._compress)  # type: ignore[operator]  # a list now
        if len(out) >= FLUSH_BUFFERS:
            self._flush()     # long batch: let the peer start on it while we build the rest
            return True
        if self._receiving or self._flush_scheduled:
            return True   # data_received flushes on return, or a flush is already due
        # The first write of a loop iteration goes out at once (no added latency for a lone
        # request); whatever else this iteration writes is gathered into one write after it.
        self._flush()
        self._flush_scheduled = True
        self._gatherer.add(self)
        return True

    def invoke(self, cmd: RemotingCommand, timeout: float) -> asyncio.Future[RemotingCommand]:
        """Send a request; the returned future resolves to the response, or fails with
        RemotingTimeoutError / ConnectionClosedError. Sets cmd.opaque and cmd.serialize_type."""
        fut = self._loop.create_future()
        if self.closed:
            fut.set_exception(self._closed_error())
        else:
            self._request(cmd, timeout, fut, None)
        return fut

    def invoke_async(self, cmd: RemotingCommand, timeout: float, callback: ResponseCallback) -> None:
        """Send a request; later callback(response, None) or callback(None, error) runs on the loop
        (no future: the cheapest way to keep many requests in flight)."""
        if self.closed:
            raise self._closed_error()
        self._request(cmd, timeout, None, callback)

    def _request(self, cmd: RemotingCommand, timeout: float, fut: asyncio.Future | None,
                 callback: ResponseCallback | None) -> None:
        opaque = next(_opaques) & 0x7FFFFFFF
        cmd.opaque = opaque
        cmd.flag &= ~(FLAG_RESPONSE | FLAG_ONEWAY)
        cmd.serialize_type = self._request_type
        if self._request_hook is not None:
            self._request_hook(cmd)
        pending = self._pending
        if pending is None:
            pending = self._pending = {}
        if not pending:
            self._endpoint.waiting.add(self)
        pending[opaque] = (self._loop.time() + timeout, cmd.code, timeout, fut, callback)
        try:
            self.send(cmd)
        except BaseException:
            self._settled(opaque)
            raise
        if self._kick is not None:
            self._kick()              # the answer may come back before a sleep would end

    def _closed_error(self) -> ConnectionClosedError:
        return ConnectionClosedError(f"{self} is closed ({self._close_reason or 'lost'})")

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        """Send a request that gets no reply; raises ConnectionClosedError if closed."""
        if self.closed:
            raise self._closed_error()
        cmd.opaque = next(_opaques) & 0x7FFFFFFF
        cmd.flag = (cmd.flag & ~FLAG_RESPONSE) | FLAG_ONEWAY
        cmd.serialize_type = self._request_type
        if self._request_hook is not None:
            self._request_hook(cmd)
        self.send(cmd)

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below its high-water mark."""
        if self._write_paused and self._transport is not None:
            waiter = self._loop.create_future()
            if self._drain_waiters is _NOTHING:
                self._drain_waiters = []
            self._drain_waiters.append(waiter)  # type: ignore[union-attr]  # a list now
            await waiter

    def close(self, reason: str = "closed by this side") -> None:
        """Flush what is queued and close; the CLOSED event follows."""
        if self._transport is None or self._close_reason is not None:
            return
        self._close_reason = reason
        self._flush()
        self._transport.close()

    async def wait_closed(self) -> None:
        if self._lost:
            return
        if self._closed is None:
            self._closed = self._loop.create_future()
        await asyncio.shield(self._closed)

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport
        self.last_active = self._loop.time()
        self.remote_address = _address(transport.get_extra_info("peername"))
        endpoint = self._endpoint
        if endpoint.capacity is not None and len(endpoint.connections) >= endpoint.capacity:
            self._transport = None                # never live: no CLOSED or DISCONNECT follows
            self._lost = True
            transport.close()
            endpoint._emit(ConnectionEvent.REFUSED, self, f"{len(endpoint.connections)} connections, the most "
                                                          "this process takes (its open-files limit)")
            return
        endpoint.connections[self.id] = self
        if endpoint.idle is not None:
            endpoint.idle.add(self.last_active + (endpoint.options.idle_timeout or 0.0), self.id)
        self._endpoint._emit(ConnectionEvent.CONNECT if self._dialled else ConnectionEvent.ACTIVE, self, None)

    def data_received(self, data: bytes) -> None:
        self.last_active = self._loop.time()
        try:
            commands = self._decoder.feed(data)
        except FrameError as exc:
            log.warning("closing %s: %s", self, exc.reason)
            self._endpoint._emit(ConnectionEvent.ERROR, self, exc.reason)
            self.close(f"frame error: {exc.reason}")
            return
        self._receiving = True
        try:
            for cmd in commands:
                if cmd.flag & FLAG_SMARTGO and not self._peer_smartgo:
                    self._on_smartgo_peer()
                if cmd.flag & FLAG_RESPONSE:
                    self._on_response(cmd)
                elif self._inflight_paused or self._deferred:
                    self._hold(cmd)   # over max_inflight, or the turn's budget is spent: wait
                elif self._budget is not None and not self._budget.take(cmd.code):
                    self._hold(cmd)
                    self._defer()
                else:
                    self._on_request(cmd)
        finally:
            self._receiving = False
        if self._out:  # replies of eager processors: one write for the whole batch
            self._flush()
        if self._kick is not None:
            self._kick()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:                              # refused at connection_made
            return
        self._transport = None
        self._lost = True
        self._out = _NOTHING
        self._endpoint.connections.pop(self.id, None)
        self._endpoint.waiting.discard(self)
        reason = self._close_reason
        if reason is not None:
            self._endpoint._emit(ConnectionEvent.CLOSED, self, reason)
        else:
            reason = "closed by peer"
            if exc is not None:
                reason = f"transport error: {exc}"
                self._endpoint._emit(ConnectionEvent.ERROR, self, reason)
            self._endpoint._emit(ConnectionEvent.DISCONNECT, self, reason)
        pending, self._pending = self._pending or {}, None
        for entry in pending.values():
            _resolve(entry, None, ConnectionClosedError(
                f"{self} closed ({reason}) before the response to code {entry[1]} arrived"))
        self._backlog = _NOTHING
        for task in list(self._tasks):
            if task not in self._oneway:    # a oneway request is carried out all the same, as in 4.x
                task.cancel()
        waiters, self._drain_waiters = self._drain_waiters, _NOTHING
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()
        waiters, self._drain_waiters = self._drain_waiters, _NOTHING
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- internals ------------------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if out and self._transport is not None:
            self._out = _NOTHING
            self._transport.writelines(out)
            self.last_active = self._loop.time()

    def _update_reading(self) -> None:
        paused = self._inflight_paused or self._deferred or (
            self._write_paused and self._endpoint.options.pause_reading_on_backpressure)
        transport = self._transport
        if paused != self._read_paused and transport is not None and not transport.is_closing():
            self._read_paused = paused
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _on_smartgo_peer(self) -> None:
        opts = self._endpoint.options
        self._peer_smartgo = True
        self._extra_flags = FLAG_SMARTGO
        self._compress = opts.compress_threshold
        self._request_type = opts.serialize_type

    def _on_response(self, cmd: RemotingCommand) -> None:
        entry = self._settled(cmd.opaque)
        if entry is None:
            log.debug("%s: response opaque %d matches no request (timed out?)", self, cmd.opaque)
            return
        _resolve(entry, cmd, None)

    def _settled(self, opaque: int) -> tuple | None:
        """Take a request off the pending table (None if it is not there: timed out, or unknown);
        the last one leaves the endpoint's waiting set."""
        pending = self._pending
        entry = None if pending is None else pending.pop(opaque, None)
        if entry is not None and not pending:
            self._endpoint.waiting.discard(self)
        return entry

    def _hold(self, cmd: RemotingCommand) -> None:
        if self._backlog is _NOTHING:
            self._backlog = deque()
        self._backlog.append(cmd)  # type: ignore[union-attr]  # a deque now

    def _on_request(self, cmd: RemotingCommand) -> None:
        processor = self._processors.get(cmd.code, self._default_processor)
        if processor is None:
            log.debug("%s: request code %d not supported", self, cmd.code)
            self._reply(cmd, cmd.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                               f" request type {cmd.code} not supported"))
            return
        resumed = None
        if getattr(processor, "smartgo_eager", False):
            try:
                coro = processor(self, cmd)
                first = coro.send(None)  # type: ignore[attr-defined]  # smartgo_eager marks coroutine functions
            except StopIteration as done:
                self._reply(cmd, done.value)
                return
            except Exception as exc:
                self._reply(cmd, self._error_response(cmd, exc))
                return
            resumed = _Resumed(coro, first)
        task = self._loop.create_task(self._process(cmd, processor, resumed))
        if self._tasks is _NO_TASKS:
            self._tasks = set()
        self._tasks.add(task)  # type: ignore[union-attr]  # a set now
        if cmd.flag & FLAG_ONEWAY:
            if self._oneway is _NO_TASKS:
                self._oneway = set()
            self._oneway.add(task)  # type: ignore[union-attr]  # a set now
        task.add_done_callback(self._task_done)
        if len(self._tasks) >= self._max_inflight and not self._inflight_paused:
            self._inflight_paused = True
            self._update_reading()

    def _task_done(self, task: asyncio.Task) -> None:
        tasks = self._tasks
        tasks.discard(task)  # type: ignore[union-attr]  # it holds task, so a set
        if not tasks:
            self._tasks = _NO_TASKS
        if self._oneway:
            self._oneway.discard(task)  # type: ignore[union-attr]  # not empty, so a set
            if not self._oneway:
                self._oneway = _NO_TASKS
        if not self._inflight_paused or len(tasks) > self._max_inflight // 2:
            return
        self._inflight_paused = False
        if not self._deferred:          # else the budget's next turn goes on with the backlog
            self._run_backlog()

    def _defer(self) -> None:
        """The turn's budget is spent: stop reading, go on with the backlog next turn."""
        self._deferred = True
        self._update_reading()
        self._budget.defer(self._resume)  # type: ignore[union-attr]  # only a budgeted one defers

    def _resume(self) -> None:
        self._deferred = False
        self._run_backlog()

    def _run_backlog(self) -> None:
        """Run the requests held back, in order, while max_inflight and the turn's budget allow."""
        backlog, budget = self._backlog, self._budget
        self._receiving = True
        try:
            while backlog and not self._inflight_paused and self._transport is not None:
                if budget is not None and not budget.take(backlog[0].code):
                    self._defer()
                    break
                self._on_request(backlog.popleft())  # type: ignore[union-attr]  # not empty, so a deque
        finally:
            self._receiving = False
        if self._out:
            self._flush()
        self._update_reading()

    async def _process(self, cmd: RemotingCommand, processor: Processor, resumed: _Resumed | None) -> None:
        try:
            response = await (processor(self, cmd) if resumed is None else resumed)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            response = self._error_response(cmd, exc)
        self._reply(cmd, response)

    def _reply(self, cmd: RemotingCommand, response: object) -> None:
        if response is None or cmd.flag & FLAG_ONEWAY:
            return
        if not isinstance(response, RemotingCommand):
            response = cmd.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"processor returned {type(response).__name__}, not a command")
        response.opaque = cmd.opaque
        response.flag |= FLAG_RESPONSE
        response.serialize_type = cmd.serialize_type
        try:
            self.send(response)
        except Exception as exc:  # the response itself does not encode
            self.send(self._error_response(cmd, exc))

    def _error_response(self, cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
        if isinstance(exc, RemotingError):
            remark = str(exc)
            log.warning("%s: request code %d failed: %s", self, cmd.code, remark)
        else:
            remark = f"{type(exc).__name__}: {exc}"
            log.error("%s: processor for code %d raised", self, cmd.code, exc_info=exc)
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, remark)

    def _expire(self, now: float) -> None:
        expired = [(opaque, entry) for opaque, entry in (self._pending or {}).items() if entry[0] <= now]
        for opaque, entry in expired:
            self._settled(opaque)
            _resolve(entry, None, RemotingTimeoutError(
                f"no response from {self.remote_address} to code {entry[1]} (opaque {opaque}) "
                f"within {entry[2]:g} s"))


class _WriteGatherer:
    """The end-of-iteration flush of every connection of one loop: a connection that wrote at once
    comes back here for whatever else it queues in the same iteration, and the whole loop pays one
    callback per iteration rather than one per connection (16 sync producers, or a net actor
    answering a commit batch across many connections)."""

    __slots__ = ("_loop", "_conns", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._conns: list[Connection] = []
        self._scheduled = False

    def add(self, conn: Connection) -> None:
        self._conns.append(conn)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        conns, self._conns = self._conns, []
        for conn in conns:
            conn._flush()


_gatherers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _WriteGatherer] = weakref.WeakKeyDictionary()


def _gatherer_for(loop: asyncio.AbstractEventLoop) -> _WriteGatherer:
    g = _gatherers.get(loop)
    if g is None:
        g = _gatherers[loop] = _WriteGatherer(loop)
    return g


def _resolve(entry: tuple, response: RemotingCommand | None, error: BaseException | None) -> None:
    """Complete one pending request: its future, or its callback (whose errors are only logged)."""
    fut, callback = entry[3], entry[4]
    if callback is None:
        if not fut.done():
            if error is None:
                fut.set_result(response)
            else:
                fut.set_exception(error)
        return
    try:
        callback(response, error)
    except Exception:
        log.exception("response callback %r failed", callback)


class _Resumed:
    """Awaitable that continues a processor coroutine whose first step already ran eagerly:
    it hands the awaiting task the future the coroutine yielded, then delegates to the coroutine."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Any, first: object) -> None:
        self._coro = coro
        self._first: object = first

    def __await__(self) -> _Resumed:
        return self

    def __iter__(self) -> _Resumed:
        return self

    def __next__(self) -> object:
        return self.send(None)

    def send(self, value: object) -> object:
        first = self._first
        if first is not _CONSUMED:
            self._first = _CONSUMED
            return first
        return self._coro.send(value)

    def throw(self, *exc: Any) -> object:
        self._first = _CONSUMED
        return self._coro.throw(*exc)

    def close(self) -> None:
        self._coro.close()


_CONSUMED = object()


def eager(processor: P) -> P:
    """Mark a processor to run its first step inside data_received, without a task.

    A processor that finishes without suspending (most do: registry lookups, offset queries)
    then costs no task and no extra loop iteration, and its reply leaves in the same write as
    the other replies of that read. One that suspends continues in a task as usual. The catch:
    before its first `await` that suspends there is no current task, so it must not use
    asyncio.current_task(), asyncio.timeout() or (from Python 3.12, which builds it on
    asyncio.timeout) asyncio.wait_for there: `loop.wait_within` is the one to use.
    For a class instance, set the class attribute `smartgo_eager = True` instead.
    """
    processor.smartgo_eager = True  # type: ignore[attr-defined]  # a marker attribute
    return processor


def _address(name: object) -> str:
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{name[0]}:{name[1]}"
    return str(name)
