"""Registration with the registries (RocketMQ's BrokerOuterAPI.registerBrokerAll / unregisterBrokerAll).

REGISTER_BROKER (103) goes to every registry at once, each on its own connection: at start, on
every topic change and every register_interval (30 s); and every second to a registry that did
not take the latest registration or whose connection closed since (it restarted and forgot this
broker), so that a registry back from a restart has the broker's routes within a second, not
after up to 30 s as with 4.x. The body is RegisterBrokerBody JSON
(reference C) with the whole topic table; bodyCrc32 is UtilAll.crc32 of it. UNREGISTER_BROKER
(104) at a clean stop. A slave learns its master's addresses from the answers (masterAddr,
haServerAddr), as 4.x's registerBrokerAll does.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass

from smartgo.actors.logs import Repeats, gist
from smartgo.broker.managers.topics import TopicSnapshot
from smartgo.net import fastjson
from smartgo.net.client import RemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import RemotingError

log = logging.getLogger(__name__)

TIMEOUT = 3.0


@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    cluster: str
    name: str
    addr: str              # broker_ip:listen_port
    ha_addr: str
    broker_id: int = 0


def register_body(snapshot: TopicSnapshot) -> bytes:
    return fastjson.dumps({"filterServerList": [], "topicConfigSerializeWrapper": snapshot.wrapper_json()})


class Registrar:
    def __init__(self, identity: BrokerIdentity, registries: list[str], client: RemotingClient) -> None:
        """client: signed with the node's account (acl.node_client), for registries with an ACL."""
        self.identity = identity
        self.registries = registries
        self.client = client
        self.registered: set[str] = set()      # registries that accepted the latest registration
        self.master_addr: str | None = None     # a slave's master, as the registries last answered
        self.master_ha_addr: str | None = None
        self.extra: Callable[[], dict[str, str]] = dict   # more header fields, as they stand (automatic failover's)
        self.failover: dict[str, str] | None = None  # the failover registry's answer of the latest round
        self._failures: dict[str, Repeats] = {}

    def _header(self) -> dict[str, str]:
        i = self.identity
        return {"brokerName": i.name, "brokerAddr": i.addr, "clusterName": i.cluster, "brokerId": str(i.broker_id)}

    async def register(self, snapshot: TopicSnapshot, only: Collection[str] | None = None) -> int:
        """Register with every registry at once (or those in `only`: a catch-up, which does not
        clear the failover answer of the latest full round); returns how many accepted."""
        body = register_body(snapshot)
        if only is None:
            self.failover = None
        targets = [addr for addr in self.registries if only is None or addr in only]
        ext = {**self._header(), **self.extra(), "haServerAddr": self.identity.ha_addr, "compressed": "false",
               "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)}
        results = await asyncio.gather(*(self._call(addr, RemotingCommand(RequestCode.REGISTER_BROKER,
                                                                            ext_fields=dict(ext), body=body))
                                         for addr in targets))
        accepted = {addr for addr, ok in zip(targets, results) if ok}
        self.registered = accepted if only is None else (self.registered - set(targets)) | accepted
        return len(accepted)

    def lost(self) -> list[str]:
        """Registries that did not take the latest registration, or whose connection closed since."""
        return [addr for addr in self.registries if addr not in self.registered or not self.client.connected(addr)]

    async def unregister(self) -> None:
        await asyncio.gather(*(self._call(addr, RemotingCommand(RequestCode.UNREGISTER_BROKER,
                                                                  ext_fields=self._header()))
                               for addr in self.registries))

    async def _call(self, addr: str, cmd: RemotingCommand) -> bool:
        try:
            response = await self.client.invoke(addr, cmd, TIMEOUT)
        except RemotingError as exc:
            why = f"registry {addr}: code {cmd.code} failed: {exc}"
            # a registry that is down: once a minute, not every second
            self._failures.setdefault(addr, Repeats()).log(log, logging.WARNING, why, gist(why))
            return False
        if response.ext_fields and "failoverEpoch" in response.ext_fields:
            self.failover = response.ext_fields
        if response.code != ResponseCode.SUCCESS:
            log.warning("registry %s refused code %d: %s %s", addr, cmd.code, response.code, response.remark)
            return False
        ext = response.ext_fields or {}
        if self.identity.broker_id and ext.get("masterAddr"):
            self.master_addr, self.master_ha_addr = ext["masterAddr"], ext.get("haServerAddr") or None
        return True

    async def close(self) -> None:
        await self.client.close()
