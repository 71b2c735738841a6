"""RemotingServer: listens on one or more ports with one processor table (the broker serves 10911
and the old clients' VIP port 10909 alike), optionally with SO_REUSEPORT so that several net actor
processes share a port and the kernel spreads connections across them, and optionally with TLS
(smartgo.net.tls: permissive or enforcing)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Iterable, Mapping
from typing import Any

from smartgo.net.budget import TurnBudget
from smartgo.net.codes import SerializeType
from smartgo.net.connection import Connection, Endpoint, EndpointOptions, Listener, Processor
from smartgo.net.frame import DEFAULT_MAX_FRAME
from smartgo.net.tls import serve_permissive

log = logging.getLogger(__name__)


class RemotingServer(Endpoint):
    def __init__(self, host: str, ports: Iterable[int], processors: Mapping[int, Processor] | None = None,
                 default_processor: Processor | None = None, *, reuse_port: bool = False,
                 idle_timeout: float | None = 120.0, max_frame: int = DEFAULT_MAX_FRAME,
                 listeners: Iterable[Listener] = (), max_inflight: int = 4096,
                 compress_threshold: int = 0, serialize_type: int = SerializeType.MSGPACK,
                 scan_interval: float = 0.1, backlog: int = 1024, busy_poll_us: int = 0,
                 tls_mode: str = "disabled", ssl_context: ssl.SSLContext | None = None,
                 handshake_timeout: float = 10.0, budget: TurnBudget | None = None,
                 max_connections: int | None = None) -> None:
        """ports may contain 0 (the kernel picks; see `ports` after start). `processors` is kept by
        reference, so codes registered later (register()) are served too. serialize_type is the
        header type of requests this server sends to clients that announced themselves as SmartGo.
        tls_mode "permissive" or "enforcing" needs ssl_context (smartgo.net.tls.server_context).
        budget bounds the requests run per loop turn (smartgo.net.budget). A connection accepted
        past max_connections is closed at once, with a REFUSED event (smartgo.net.limits)."""
        if tls_mode != "disabled" and ssl_context is None:
            raise ValueError(f"TLS mode {tls_mode} needs a certificate")
        options = EndpointOptions(
            processors=processors if processors is not None else {},
            default_processor=default_processor, listeners=tuple(listeners), max_frame=max_frame,
            max_inflight=max_inflight, idle_timeout=idle_timeout, compress_threshold=compress_threshold,
            serialize_type=serialize_type, announce=False, pause_reading_on_backpressure=True,
            busy_poll_us=busy_poll_us, budget=budget)
        super().__init__(options, scan_interval)
        self.capacity = max_connections
        self.host = host
        self._requested_ports = list(ports)
        self._reuse_port = reuse_port
        self._backlog = backlog
        self._tls_mode = tls_mode
        self._ssl = ssl_context
        self._handshake_timeout = handshake_timeout
        self._servers: list[asyncio.base_events.Server] = []
        self._sniffing: list[asyncio.Task] = []         # permissive TLS: our own accept loops
        self.ports: list[int] = []

    def register(self, code: int, processor: Processor) -> None:
        self.options.processors[code] = processor  # type: ignore[index]  # a dict, made by the server

    @property
    def port(self) -> int:
        """The first bound port."""
        return self.ports[0]

    async def start(self) -> None:
        if self._servers:
            raise RuntimeError("server already started")
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {"ssl": self._ssl, "ssl_handshake_timeout": self._handshake_timeout} \
            if self._tls_mode == "enforcing" else {}
        try:
            for port in self._requested_ports:
                if self._tls_mode == "permissive":
                    self._listen_permissive(port)
                    continue
                server = await loop.create_server(
                    lambda: Connection(self, dialled=False), self.host, port,
                    family=socket.AF_INET if ":" not in self.host else socket.AF_INET6,
                    reuse_address=True, reuse_port=self._reuse_port or None, backlog=self._backlog, **tls)
                self._servers.append(server)
                self.ports.append(server.sockets[0].getsockname()[1])
        except BaseException:
            await self.stop()
            raise
        self._start_housekeeping()
        log.info("remoting server listening on %s ports %s%s", self.host, self.ports,
                 "" if self._tls_mode == "disabled" else f" (TLS {self._tls_mode})")

    def _listen_permissive(self, port: int) -> None:
        sock = socket.create_server((self.host, port), family=socket.AF_INET6 if ":" in self.host else socket.AF_INET,
                                    backlog=self._backlog, reuse_port=self._reuse_port)
        sock.setblocking(False)

        def accepted() -> Connection:
            return Connection(self, dialled=False)

        accepting = serve_permissive(sock, accepted, self._ssl,  # type: ignore[arg-type]  # Connection: a Protocol
                                     self._handshake_timeout)
        task = asyncio.get_running_loop().create_task(accepting)
        task.add_done_callback(lambda _: sock.close())  # once the loop has let go of it
        self._sniffing.append(task)
        self.ports.append(sock.getsockname()[1])

    def stop_listening(self) -> None:
        """Accept no new connections; the open ones keep being served (a graceful drain)."""
        for server in self._servers:
            server.close()
        self._stop_sniffing()

    def _stop_sniffing(self) -> list[asyncio.Task]:
        sniffing, self._sniffing = self._sniffing, []
        for task in sniffing:
            task.cancel()
        return sniffing

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop listening and close every connection (CLOSED events are delivered)."""
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        await asyncio.gather(*self._stop_sniffing(), return_exceptions=True)
        await self._close_all("server stopping", timeout)
        for server in servers:
            await server.wait_closed()
        self.ports = []

    async def __aenter__(self) -> RemotingServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
