"""The registry role's only actor: the name server (smartgo.registry) on the node's port."""

from __future__ import annotations

from smartgo.actors.actor import Actor, ActorContext
from smartgo.registry.server import RegistryServer


class RegistryActor(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self.server = RegistryServer(self.config.listen_host, self.config.listen_port, self.config.store_path)

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()
