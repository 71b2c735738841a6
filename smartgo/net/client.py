"""RemotingClient: one reused connection per "host:port", dialled on first use and again after it
closes. Many coroutines may share it: concurrent first calls wait on one dial.

BlockingRemotingClient wraps it for plain synchronous code (the CLI, scripts, the SDK's blocking
API): the client lives on an event loop in a daemon thread and each call blocks on a future.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from smartgo.net.codes import SerializeType
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import (Connection, Endpoint, EndpointOptions, Listener, Processor,
                                    ResponseCallback)
from smartgo.net.errors import RemotingConnectError, RemotingTimeoutError
from smartgo.net.frame import DEFAULT_MAX_FRAME
from smartgo.net.loop import new_event_loop, wait_within

log = logging.getLogger(__name__)


def split_address(addr: str) -> tuple[str, int]:
    """"host:port" (or "[v6]:port") -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


class RemotingClient(Endpoint):
    def __init__(self, processors: Mapping[int, Processor] | None = None,
                 default_processor: Processor | None = None, *, listeners: Iterable[Listener] = (),
                 max_frame: int = DEFAULT_MAX_FRAME, connect_timeout: float = 3.0,
                 serialize_type: int = SerializeType.MSGPACK, compress_threshold: int = 0,
                 announce: bool = True, idle_timeout: float | None = None,
                 scan_interval: float = 0.1, busy_poll_us: int = 0,
                 request_hook: Callable[[RemotingCommand], None] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        """processors serve requests the server sends on our connections (e.g. the broker's
        NOTIFY_CONSUMER_IDS_CHANGED). serialize_type MSGPACK is used only once the server has shown
        it is SmartGo (JSON until then, and always towards RocketMQ's own servers); announce=False
        makes this client look exactly like a foreign one (JSON/ROCKETMQ only, no compression).
        request_hook sees every request before it is sent (the ACL signature). With ssl_context
        (smartgo.net.tls.client_context) every connection speaks TLS (Java's useTLS)."""
        options = EndpointOptions(
            processors=processors if processors is not None else {},
            default_processor=default_processor, listeners=tuple(listeners), max_frame=max_frame,
            idle_timeout=idle_timeout, compress_threshold=compress_threshold,
            serialize_type=serialize_type if announce or serialize_type != SerializeType.MSGPACK
            else SerializeType.JSON,
            announce=announce, pause_reading_on_backpressure=False,
            busy_poll_us=busy_poll_us, request_hook=request_hook)
        super().__init__(options, scan_interval)
        self.connect_timeout = connect_timeout
        self._ssl = ssl_context
        self._by_address: dict[str, Connection] = {}
        self._dialling: dict[str, asyncio.Future[Connection]] = {}
        self._closing = False

    def connected(self, addr: str) -> bool:
        """Whether the connection to addr is open (False once the peer closed it: it went away)."""
        conn = self._by_address.get(addr)
        return conn is not None and not conn.closed

    async def connection(self, addr: str) -> Connection:
        """The open connection to addr, dialling it if needed."""
        conn = self._by_address.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self._closing:
            raise RemotingConnectError(f"client is closed; not connecting to {addr}")
        dial = self._dialling.get(addr)
        if dial is None:
            dial = asyncio.get_running_loop().create_future()
            self._dialling[addr] = dial
            try:
                conn = await self._dial(addr)
            except BaseException as exc:
                dial.set_exception(exc)
                dial.exception()  # retrieved: only waiters re-raise it
                raise
            else:
                self._by_address[addr] = conn
                dial.set_result(conn)
                return conn
            finally:
                del self._dialling[addr]
        return await asyncio.shield(dial)

    async def _dial(self, addr: str) -> Connection:
        host, port = split_address(addr)
        loop = asyncio.get_running_loop()
        try:
            _transport, conn = await wait_within(
                loop.create_connection(lambda: Connection(self, dialled=True), host, port,
                                       family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                       ssl=self._ssl, server_hostname=host if self._ssl is not None else None),
                self.connect_timeout)
        except asyncio.TimeoutError:
            raise RemotingConnectError(f"connect to {addr} timed out after {self.connect_timeout:g} s") from None
        except OSError as exc:
            raise RemotingConnectError(f"connect to {addr} failed: {exc}") from None
        self._start_housekeeping()
        return conn

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        """Send cmd to addr and wait for its response (at most `timeout` seconds, dialling included)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        conn = await self.connection(addr)
        if conn._write_paused:
            await conn.drain()
        left = timeout - (loop.time() - start)
        if left <= 0:
            raise RemotingTimeoutError(f"invoke to {addr} timed out while connecting ({timeout:g} s)")
        try:
            return await conn.invoke(cmd, left)
        except RemotingTimeoutError:
            raise RemotingTimeoutError(f"no response from {addr} to code {cmd.code} (opaque {cmd.opaque}) "
                                       f"within {timeout:g} s") from None

    async def invoke_async(self, addr: str, cmd: RemotingCommand, timeout: float,
                           callback: ResponseCallback) -> None:
        """Send cmd; callback(response, None) or callback(None, error) runs on the loop later.
        Returns once the request is queued (connection errors are raised here)."""
        conn = await self.connection(addr)
        if conn._write_paused:
            await conn.drain()
        conn.invoke_async(cmd, timeout, callback)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        conn = await self.connection(addr)
        if conn._write_paused:
            await conn.drain()
        conn.invoke_oneway(cmd)

    def close_connection(self, addr: str) -> None:
        conn = self._by_address.pop(addr, None)
        if conn is not None:
            conn.close("closed by client")

    async def close(self, timeout: float = 5.0) -> None:
        self._closing = True
        self._by_address.clear()
        await self._close_all("client closing", timeout)

    async def __aenter__(self) -> RemotingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class BlockingRemotingClient:
    """A RemotingClient on a private event loop thread, for synchronous callers. Thread-safe.

    Processors and callbacks run on that loop's thread.
    """

    def __init__(self, **client_options: Any) -> None:
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="smartgo-remoting",
                                        daemon=True)
        self._thread.start()
        self._client: RemotingClient = self._call(self._make(client_options), None)

    @staticmethod
    async def _make(options: dict) -> RemotingClient:
        return RemotingClient(**options)

    def _call(self, coro: Any, timeout: float | None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RemotingTimeoutError(f"blocking call timed out after {timeout:g} s") from None

    @property
    def client(self) -> RemotingClient:
        """The wrapped client (use only from coroutines submitted to `loop`)."""
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        # The inner invoke enforces `timeout`; the outer wait only guards against a stuck loop.
        return self._call(self._client.invoke(addr, cmd, timeout), timeout + 5.0)

    def invoke_async(self, addr: str, cmd: RemotingCommand, timeout: float,
                     callback: ResponseCallback) -> None:
        self._call(self._client.invoke_async(addr, cmd, timeout, callback), timeout + 5.0)

    def invoke_oneway(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> None:
        self._call(self._client.invoke_oneway(addr, cmd), timeout + 5.0)

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                self._call(self._client.close(), 10.0)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10.0)
                self._loop.close()

    def __enter__(self) -> BlockingRemotingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
