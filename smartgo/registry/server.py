"""RegistryServer: the name server role. Route tables in memory, KV config on disk, one port.

Registries never talk to each other; every broker registers with each of them every 30 s and a
broker goes away when its connection closes or when it has not registered for broker_expiry
seconds (checked every scan_interval seconds). The actor runtime wraps this class; it needs only
start() and stop().

With an ACL (acl_enable; 4.x's name server has none) the registry checks what changes its tables,
through the broker's AclGuard: the writes an operator makes (KV config, wiping a broker's write
permission, deleting a topic, a switchover) need an admin account, and a registration
(`guard_registrations`) any account's signature; both pass for the global white list. Reads stay
open: a client without an account must find its routes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from smartgo.common.acl_check import ADMIN_CODES
from smartgo.common.acl_guard import CHECK_INTERVAL, AclGuard
from smartgo.net.client import RemotingClient
from smartgo.net.codes import RequestCode
from smartgo.net.connection import Connection, ConnectionEvent
from smartgo.net.server import RemotingServer
from smartgo.registry.controller import FailoverController
from smartgo.registry.kv_config import KVConfigManager
from smartgo.registry.processor import RegistryProcessors
from smartgo.registry.registry_config import RegistryConfig
from smartgo.registry.route_info import RouteInfoManager

log = logging.getLogger(__name__)

DEFAULT_PORT = 9876
DEFAULT_STORE_DIR = Path.home() / "namesrv"
_GONE = (ConnectionEvent.CLOSED, ConnectionEvent.DISCONNECT)
REGISTRATIONS = frozenset({RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER})


class RegistryServer:
    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, store_dir: Path = DEFAULT_STORE_DIR, *,
                 clock: Callable[[], float] = time.time, scan_interval: float = 10.0,
                 broker_expiry: float = 120.0, tls: dict | None = None, failover_delay: float | None = None,
                 failover_client: RemotingClient | None = None, failover_unclean: bool = False,
                 acl: AclGuard | None = None, guard_registrations: bool = True) -> None:
        self.host = host
        self.requested_port = port
        self.store_dir = Path(store_dir)
        self.scan_interval = scan_interval
        self.broker_expiry = broker_expiry
        self.routes = RouteInfoManager(clock)
        self.kv = KVConfigManager(self.store_dir)
        # failover_delay: this registry decides automatic failover (smartgo.registry.controller)
        self.controller = (FailoverController(self.routes, self.store_dir, failover_delay, client=failover_client,
                                              unclean=failover_unclean)
                           if failover_delay is not None else None)
        self.config = RegistryConfig(self.store_dir)
        self.processors = RegistryProcessors(self.routes, self.kv, self.controller, self.config)
        self._remoting: RemotingServer | None = None
        self._tls = tls or {}                           # RemotingServer's TLS options (smartgo.net.tls)
        self.acl = acl
        self._guard_registrations = guard_registrations
        self._tasks: list[asyncio.Task] = []

    @property
    def port(self) -> int:
        """The bound port (differs from the requested one when that was 0)."""
        if self._remoting is None or not self._remoting.ports:
            raise RuntimeError("registry server is not started")
        return self._remoting.port

    async def start(self) -> None:
        self.kv.load()
        self.config.load()
        if self.controller is not None:
            self.controller.load()
        processors = self.processors.table()
        if self.acl is not None:        # the writes acl.ADMIN_CODES lists, and registrations
            guarded = ADMIN_CODES | REGISTRATIONS if self._guard_registrations else ADMIN_CODES
            processors = self.acl.guard(processors, guarded)
        self._remoting = RemotingServer(self.host, [self.requested_port], processors,
                                        listeners=[self._on_connection_event], **self._tls)
        await self._remoting.start()
        self.config.fixed = {
            "listenHost": self.host, "listenPort": str(self.port), "kvConfigPath": str(self.kv.path),
            "configStorePath": str(self.config.file.path), "brokerExpirySeconds": f"{self.broker_expiry:g}",
            "scanNotActiveBrokerSeconds": f"{self.scan_interval:g}", "aclEnable": str(self.acl is not None).lower(),
            "failoverEnable": str(self.controller is not None).lower()}
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._scan_forever())]
        if self.acl is not None:
            self._tasks.append(loop.create_task(self._follow_acl(self.acl)))
        if self.controller is not None:
            self._tasks.append(loop.create_task(self.controller.run()))
        log.info("registry listening on %s:%d, KV config in %s", self.host, self.port, self.kv.path)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        if self.controller is not None:
            await self.controller.close()
        if self._remoting is not None:
            await self._remoting.stop()
            self._remoting = None
        log.info("registry stopped")

    def scan_not_active_brokers(self) -> list[str]:
        """Drop brokers silent for longer than broker_expiry and close their connections."""
        expired = self.routes.scan_not_active_brokers(self.broker_expiry)
        for _addr, channel in expired:
            if isinstance(channel, Connection):
                channel.close("broker registration expired")
        return [addr for addr, _ in expired]

    async def _scan_forever(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval)
            try:
                self.scan_not_active_brokers()
            except Exception:
                log.exception("broker expiry scan failed")

    @staticmethod
    async def _follow_acl(acl: AclGuard) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            acl.reload_if_changed(time.monotonic())

    def _on_connection_event(self, event: ConnectionEvent, conn: Connection, reason: str | None) -> None:
        if event in _GONE:
            addr = self.routes.on_channel_destroy(conn)
            if addr is not None:
                log.warning("broker %s removed: its connection %s closed (%s)", addr, conn.remote_address, reason)
