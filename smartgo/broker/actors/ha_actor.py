"""The ha actor: replication between a master and its slaves (../shared/ARCHITECTURE.md, the ha row).

On a master it serves slaves (smartgo.broker.ha.ha_service) and publishes commitlog.slave_acked;
on a slave it is the only writer of the CommitLog, fed by the master (smartgo.broker.ha.ha_client).
"""

from __future__ import annotations

from smartgo.actors.actor import Actor, ActorContext
from smartgo.broker.ha.ha_client import HAClient
from smartgo.broker.ha.ha_service import HAService
from smartgo.broker.settings import is_slave, store_config
from smartgo.store import StoreLock


class HAActor(Actor):
    def __init__(self, ctx: ActorContext, *, nets: list[str]) -> None:
        super().__init__(ctx)
        self.nets = nets
        self.service: HAService | None = None
        self.client: HAClient | None = None

    async def start(self) -> None:
        self.store = store_config(self.config)
        if is_slave(self.config):
            self._lock = StoreLock(self.store.store_path).acquire()      # the CommitLog writer holds the lock
            self.client = HAClient(self)
            self.spawn(self.client.run(), "replicate")
        else:
            self.service = HAService(self)
            await self.service.start()

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
        if self.client is not None:
            self.client.close()
            self._lock.release()
