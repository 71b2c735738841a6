"""The registry role's only actor: the name server (smartgo.registry) on the node's port.

A broker node without --registry runs one too (kwargs port and subdir): an embedded registry,
so that one command gives a working single node. With acl_enable it checks the node's ACL file;
an embedded one leaves registrations open when the node has no account of its own
(acl_access_key) to sign its broker's with.
"""

from __future__ import annotations

from smartgo.actors.actor import Actor, ActorContext
from smartgo.broker.ha import failover
from smartgo.broker.acl.acl_guard import node_guard
from smartgo.common.acl_sign import node_client
from smartgo.net.tls import node_server_options
from smartgo.registry.server import RegistryServer


class RegistryActor(Actor):
    def __init__(self, ctx: ActorContext, port: int = 0, subdir: str = "") -> None:
        super().__init__(ctx)
        store = self.config.store_path / subdir if subdir else self.config.store_path
        cfg = self.config
        # A broker's embedded registry never decides failover: it goes down with its master.
        decides = failover.enabled(cfg) and cfg.role == "registry"
        self.server = RegistryServer(
            cfg.listen_host, port or cfg.listen_port, store, tls=node_server_options(cfg.server_tls, "registry"),
            failover_delay=cfg.failover_delay if decides else None,
            failover_client=node_client(cfg) if decides else None,
            failover_unclean=cfg.failover_unclean_enable,
            acl=node_guard(cfg, "registry"), guard_registrations=cfg.role == "registry" or bool(cfg.acl_access_key))

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()
