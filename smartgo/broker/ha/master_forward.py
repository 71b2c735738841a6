"""A slave passes the writes it gets on to its master (slave_forward_writes), in its net actors.

Clients send only to brokerId 0 of a route, so a slave gets writes only from a client whose route
is stale: after a switchover or a failover, the old master's address now holds a slave, and Java
and C++ clients keep sending there until their next route poll (30 s). 4.x's slave refuses them
(SERVICE_NOT_AVAILABLE), and every send of those clients fails for that long. Instead the net
actor relays each such request to the master the registries name (the broker actor sends its
address with the net actors' settings) and the master's answer back: its msgId, queue and offset
are the master's, which is where the message is. What a slave does not know a master for yet,
and a master that does not answer, get 4.x's refusal. A consumer offset a stale route brings
(UPDATE_CONSUMER_OFFSET) goes to the master too, since the slave's next copy of the master's
offsets would overwrite it; when the master does not answer the slave keeps it, as 4.x's does.

The request goes on as it came (code, header fields, body, version), so an ACL signature still
holds at the master, with one field added after the client signed: acl.FORWARDED_FOR, the
client's address, which the master stores as the message's born host (4.x takes it from the
connection, here the slave's) and which keeps it from white-listing the request by the slave's
address (that white list is for the slave's own calls). The slave's own ACL check, when it has
one, came first. Oneway requests (a Java END_TRANSACTION) stay oneway. A request is passed on
once: one that already carries the field (a slave that has not heard of a new master yet,
passing on to the old one, now a slave too) is refused, so that two slaves that each take the
other for the master cannot pass it round.
"""

from __future__ import annotations

import logging
import ssl

from smartgo.actors.logs import Repeats, gist
from smartgo.broker.stats.stats import NetStats
from smartgo.common.acl_sign import FORWARDED_FOR
from smartgo.net.client import RemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, Processor
from smartgo.net.errors import RemotingError

log = logging.getLogger(__name__)

# The writes a client addresses to its broker name's master
FORWARDED = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
             RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.END_TRANSACTION, RequestCode.UPDATE_CONSUMER_OFFSET)
KEPT_WHEN_UNSENT = frozenset({RequestCode.UPDATE_CONSUMER_OFFSET})    # the slave's own processor takes it
TIMEOUT = 2.5               # s: inside a client's default send timeout (3 s), so that it hears why
UNSENT = RemotingCommand(-1)    # _relay: the master did not take it, the slave's own processor does


class MasterForward:
    def __init__(self, ssl_context: ssl.SSLContext | None, stats: NetStats) -> None:
        self.stats = stats                      # smartgo_slave_forwarded_requests_total
        self.master: str | None = None          # the master's broker address, as the registries answer
        self.client = RemotingClient(ssl_context=ssl_context)   # no signing hook: the client's signature stays
        self._failures = Repeats()              # a master that keeps failing: once a minute

    def wrap(self, processors: dict[int, Processor]) -> dict[int, Processor]:
        """The same processors, FORWARDED codes passed on while a master is known."""
        out = dict(processors)
        for code in FORWARDED:
            if code in out:
                out[code] = self._forwarding(out[code])
        return out

    def _forwarding(self, own: Processor) -> Processor:
        async def forward(conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
            master = self.master
            if master is None or (request.ext_fields is not None and FORWARDED_FOR in request.ext_fields):
                return await own(conn, request)
            answer = await self._relay(master, conn, request)
            return await own(conn, request) if answer is UNSENT else answer
        return forward

    async def _relay(self, master: str, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        cmd = RemotingCommand(request.code, request.language, request.version, flag=request.flag,
                              ext_fields={**(request.ext_fields or {}), FORWARDED_FOR: conn.remote_address},
                              body=request.body_bytes() if request.body is not None else None)
        try:
            if request.is_oneway:
                await self.client.invoke_oneway(master, cmd)
                self.stats.relayed(request.code, True)
                return None
            answer = await self.client.invoke(master, cmd, TIMEOUT)
        except RemotingError as exc:
            self.stats.relayed(request.code, False)
            why = f"a write of {conn.remote_address} (code {request.code}) not passed on to the master {master}: {exc}"
            self._failures.log(log, logging.WARNING, why, gist(why.replace(str(conn.remote_address), "")))
            if request.code in KEPT_WHEN_UNSENT:
                return UNSENT
            return None if request.is_oneway else request.make_response(
                ResponseCode.SERVICE_NOT_AVAILABLE, f"service not available now: this broker is a slave and its "
                                                    f"master {master} did not take the message: {exc}")
        self.stats.relayed(request.code, True)
        return request.make_response(answer.code, answer.remark, answer.ext_fields,
                                     answer.body_bytes() if answer.body is not None else None)

    async def close(self) -> None:
        await self.client.close()
