"""ClientInstance (Java's MQClientInstance): the connections, the registry, the route and broker
tables, and the periodic jobs of one client object - route refresh and heartbeats every 30 s,
offset persistence every 5 s, rebalancing - plus the processors that answer the requests brokers
send on our own connections (NOTIFY_CONSUMER_IDS_CHANGED, PUSH_REPLY_MESSAGE_TO_CLIENT,
CHECK_TRANSACTION_STATE, RESET_CONSUMER_CLIENT_OFFSET, and GET_CONSUMER_RUNNING_INFO and
CONSUME_MESSAGE_DIRECTLY relayed from an operator's tool).

Producers and consumers join an instance as members (Member below) and the instance drives them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine
from typing import Any, Protocol, TypeVar

from smartgo.client import api, bodies
from smartgo.client.config import ClientConfig
from smartgo.client.errors import BrokerError, ClientStateError, NoRouteError, RegistryUnavailableError
from smartgo.client.route import BrokerData, TopicRouteData
from smartgo.client.running_info import (PROP_CLIENT_VERSION, PROP_NAMESERVER_ADDR,
                                         encode_direct_result, encode_running_info, thread_stacks)
from smartgo.common.acl_sign import signer
from smartgo.net import fastjson
from smartgo.net.client import RemotingClient
from smartgo.net.codes import CURRENT_VERSION, MASTER_ID, RequestCode, ResponseCode, SerializeType
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, Processor
from smartgo.net.errors import RemotingConnectError, RemotingError
from smartgo.net.tls import client_context

log = logging.getLogger(__name__)

EARLY_REFRESH_MIN = 1.0     # s between early route refreshes (a refused connection, a broker that takes no sends)
AVOID_REFUSING = 10.0       # s reads and offset requests go to another address of a broker that refused


class Member(Protocol):
    """What a producer or consumer offers its instance."""

    group: str

    def topics(self) -> set[str]:
        """Topics whose routes this member needs refreshed."""

    def on_route(self, topic: str, route: TopicRouteData) -> None:
        """A topic's route was fetched (changed or not)."""

    def heartbeat_entry(self) -> tuple[str, dict | None]:
        """("producer", None) or ("consumer", ConsumerData JSON)."""


M = TypeVar("M", bound="MemberClient")


class MemberClient:
    """Lifecycle of a producer or pull consumer: start joins its instance as a member (routes
    and heartbeats run from then on); close says goodbye to the brokers (UNREGISTER_CLIENT)."""

    group: str
    instance: ClientInstance
    #: "producer" or "consumer": which group field UNREGISTER_CLIENT carries.
    role = "producer"

    async def start(self: M) -> M:
        await self.instance.start()
        self.instance.members.append(self)  # type: ignore[arg-type]  # M is a member
        self.instance.start_route_and_heartbeat()
        return self

    async def close(self) -> None:
        if self.instance.started and not self.instance.closed:
            producer = self.group if self.role == "producer" else None
            await self.instance.unregister(producer, None if producer else self.group)
        await self.instance.close()

    async def __aenter__(self: M) -> M:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def client_id(self) -> str:
        return self.instance.client_id


class ClientInstance:
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.client_id = config.client_id
        self.members: list[Member] = []
        self.routes: dict[str, TopicRouteData] = {}
        self.brokers: dict[str, BrokerData] = {}
        #: PUSH_REPLY_MESSAGE_TO_CLIENT handler (request-reply, issue 9); None answers SYSTEM_ERROR.
        self.reply_handler: Callable[[RemotingCommand], Awaitable[RemotingCommand]] | None = None
        #: CHECK_TRANSACTION_STATE handler (a producer's transaction listener); None ignores checks.
        self.check_handler: Callable[[Connection, RemotingCommand], Awaitable[None]] | None = None
        #: Called (no arguments) when a broker says a group's membership changed.
        self.on_consumer_ids_changed: list[Callable[[str], None]] = []
        self._registry_index = random.randrange(len(config.registry))
        self._remoting: RemotingClient | None = None
        self._connections: dict[str, Connection] = {}
        self._tasks: list[asyncio.Task] = []
        self._route_locks: dict[str, asyncio.Lock] = {}
        self._refresh: asyncio.Task | None = None       # an early route refresh after a broker went away
        self._refreshed_at = 0.0
        self._greeted: dict[str, float] = {}   # broker address -> when greet() last heartbeated it
        self._refused: dict[str, float] = {}            # address -> until when reads avoid it
        self.started = False
        self.closed = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self.closed:
            raise ClientStateError("client is closed; create a new one")
        if self.started:
            return
        processors: dict[int, Processor] = {RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._notify_ids_changed,
                      RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT: self._push_reply,
                      RequestCode.CHECK_TRANSACTION_STATE: self._check_transaction,
                      RequestCode.RESET_CONSUMER_CLIENT_OFFSET: self._reset_offset,
                      RequestCode.GET_CONSUMER_RUNNING_INFO: self._running_info,
                      RequestCode.CONSUME_MESSAGE_DIRECTLY: self._consume_directly,
                      RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT: self._consumer_status}
        self._remoting = RemotingClient(
            processors, connect_timeout=self.config.timeout,
            serialize_type=SerializeType.MSGPACK if self.config.use_msgpack else SerializeType.JSON,
            busy_poll_us=self.config.busy_poll_us,
            request_hook=signer(self.config.access_key, self.config.secret_key, self.config.security_token),
            ssl_context=client_context(self.config.tls_ca_file or None, self.config.tls_cert_file or None,
                                       self.config.tls_key_file or None) if self.config.use_tls else None)
        self.started = True

    def every(self, interval: float, job: Callable[[], Awaitable[object]], name: str,
              first: float | None = None) -> None:
        """Run job every interval seconds (first after `first`, default interval) until close."""
        self._tasks.append(asyncio.get_running_loop().create_task(self._periodic(interval, job, name, first)))

    async def _periodic(self, interval: float, job: Callable[[], Awaitable[object]], name: str,
                        first: float | None) -> None:
        await asyncio.sleep(interval if first is None else first)
        while True:
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a periodic job logs and tries again next time
                log.warning("%s: %s failed: %s", self.client_id, name, exc)
            await asyncio.sleep(interval)

    def spawn(self, job: Coroutine[Any, Any, object]) -> None:
        """Run job in the background until it ends or the instance closes."""
        self._tasks.append(asyncio.get_running_loop().create_task(job))

    def start_route_and_heartbeat(self) -> None:
        self.every(self.config.poll_registry_interval, self.refresh_routes, "route refresh")
        self.every(self.config.heartbeat_interval, self.heartbeat_all, "heartbeat", first=1.0)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._refresh is not None:
            self._tasks.append(self._refresh)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._remoting is not None:
            await self._remoting.close()

    @property
    def remoting(self) -> RemotingClient:
        if self._remoting is None or self.closed:
            raise ClientStateError("client is not started" if self._remoting is None else "client is closed")
        return self._remoting

    # -- calls ------------------------------------------------------------------------------------

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        try:
            return await self.remoting.invoke(addr, cmd, self.config.timeout if timeout is None else timeout)
        except RemotingConnectError:
            self._unreachable(addr)
            raise

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        try:
            await self.remoting.invoke_oneway(addr, cmd)
        except RemotingConnectError:
            self._unreachable(addr)
            raise

    def _unreachable(self, addr: str) -> None:
        """A broker refused the connection (it died): reads and offset requests of its broker
        name go to its other addresses (a slave) for a while, and routes are refreshed early."""
        now = time.monotonic()
        if self._refused.get(addr, 0.0) <= now:
            log.info("%s: %s refused a connection: reads go to its broker's other addresses for %gs",
                     self.client_id, addr, AVOID_REFUSING)
        self._refused[addr] = now + AVOID_REFUSING
        self.refresh_soon()

    def refresh_soon(self) -> None:
        """Every route refreshed now rather than at the next poll (30 s), at most once a second:
        a broker went away, or a send's answer says its route is stale (a slave, or a master
        handing its role over, at the master's address); the registries may lag for a moment."""
        now = time.monotonic()
        if self.closed or (self._refresh is not None and not self._refresh.done()) \
                or now - self._refreshed_at < EARLY_REFRESH_MIN:
            return
        self._refreshed_at = now
        self._refresh = asyncio.get_running_loop().create_task(self.refresh_routes())

    def cached_connection(self, addr: str) -> Connection | None:
        """The open connection to addr if there is one (callback-style sends use it without a
        coroutine); None means `await connect(addr)` first."""
        conn = self._connections.get(addr)
        return conn if conn is not None and not conn.closed else None

    async def connect(self, addr: str) -> Connection:
        try:
            conn = await self.remoting.connection(addr)
        except RemotingConnectError:
            self._unreachable(addr)
            raise
        self._connections[addr] = conn
        return conn

    async def invoke_registry(self, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        """Ask the current registry; on a connection failure or timeout move on to the next."""
        addrs = self.config.registry
        errors = []
        for i in range(len(addrs)):
            index = (self._registry_index + i) % len(addrs)
            try:
                resp = await self.invoke(addrs[index], cmd, timeout)
            except RemotingError as exc:
                errors.append(f"{addrs[index]}: {exc}")
                continue
            self._registry_index = index
            return resp
        raise RegistryUnavailableError("no registry answered (" + "; ".join(errors) + ")")

    # -- routes and brokers ---------------------------------------------------------------------

    async def fetch_route(self, topic: str) -> TopicRouteData | None:
        """The registry's route for topic, or None when it has none (TOPIC_NOT_EXIST)."""
        resp = await self.invoke_registry(api.route_request(topic))
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        api.check(resp, "registry", f"route of {topic}")
        try:
            return TopicRouteData.parse(resp.body_bytes())
        except ValueError as exc:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, str(exc), "registry", f"route of {topic}") from None

    async def update_route(self, topic: str) -> TopicRouteData | None:
        """Fetch topic's route, remember it and its brokers, tell the members. One fetch per topic
        at a time (concurrent callers wait for it)."""
        lock = self._route_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            route = await self.fetch_route(topic)
            if route is None:
                return None
            before = self.routes.get(topic)
            self.remember_route(topic, route)
            if before is not None and (back := route.addrs() - before.addrs()):
                await self.heartbeat_all(back)      # a broker that came (back): it knows us before we rebalance
            for member in self.members:
                if topic in member.topics():
                    member.on_route(topic, route)
            return route

    def remember_route(self, topic: str, route: TopicRouteData) -> None:
        self.routes[topic] = route
        for b in route.broker_datas:
            self.brokers[b.broker_name] = b

    async def route(self, topic: str) -> TopicRouteData:
        route = self.routes.get(topic) or await self.update_route(topic)
        if route is None:
            raise NoRouteError(topic, "the registries have no route (topic does not exist?)")
        return route

    async def refresh_routes(self) -> None:
        topics = set()
        for member in self.members:
            topics |= member.topics()
        for topic in sorted(topics):
            try:
                await self.update_route(topic)
            except Exception as exc:
                log.warning("%s: refreshing the route of %s failed: %s", self.client_id, topic, exc)

    def broker_addr(self, broker_name: str, broker_id: int = MASTER_ID, only_this: bool = False) -> str | None:
        """The address of broker_name's broker_id, else (unless only_this) the master or any,
        passing over an address that refused a connection lately while another one is left."""
        b = self.brokers.get(broker_name)
        if b is None:
            return None
        addr = b.broker_addrs.get(broker_id)
        if only_this:
            return addr
        candidates = [addr] if addr is not None else []
        candidates += [a for _, a in sorted(b.broker_addrs.items()) if a != addr]      # the master (0) first
        now = time.monotonic()
        return next((a for a in candidates if self._refused.get(a, 0.0) <= now), candidates[0] if candidates else None)

    async def master_addr(self, broker_name: str, topic: str | None = None) -> str:
        """findBrokerAddressInPublish: writes, locks and offset searches go to the master only."""
        return await self._addr(broker_name, topic, True)

    async def admin_addr(self, broker_name: str, topic: str | None = None) -> str:
        """findBrokerAddressInAdmin: the master, else a slave (consumer offsets, and pulls, go on
        at a slave while the master is away)."""
        return await self._addr(broker_name, topic, False)

    async def _addr(self, broker_name: str, topic: str | None, only_master: bool) -> str:
        addr = self.broker_addr(broker_name, MASTER_ID, only_this=only_master)
        if addr is None and topic is not None:
            await self.update_route(topic)
            addr = self.broker_addr(broker_name, MASTER_ID, only_this=only_master)
        if addr is None:
            raise NoRouteError(topic or broker_name, f"broker {broker_name} has no "
                                                     f"{'master ' if only_master else ''}address")
        return addr

    # -- heartbeats -------------------------------------------------------------------------------

    def heartbeat_command(self) -> tuple[RemotingCommand, bool]:
        producers: list[str] = []
        consumers: list[dict] = []
        for member in self.members:
            kind, entry = member.heartbeat_entry()
            if kind == "producer":
                producers.append(member.group)
            else:
                consumers.append(entry)  # type: ignore[arg-type]  # a consumer's: its ConsumerData
        if producers:
            producers.append(api.CLIENT_INNER_PRODUCER_GROUP)
        return api.heartbeat_request(self.client_id, producers, consumers), bool(consumers)

    async def heartbeat_all(self, only: Collection[str] | None = None) -> int:
        """HEART_BEAT to every broker we know (masters only when no consumer is a member), or to
        those of them in `only`; returns how many brokers answered SUCCESS."""
        cmd, with_consumers = self.heartbeat_command()
        addrs = sorted({addr for b in self.brokers.values() for bid, addr in b.broker_addrs.items()
                        if (with_consumers or bid == MASTER_ID) and (only is None or addr in only)})
        if not addrs:
            return 0
        body = cmd.body
        beats = (self._heartbeat(addr, body) for addr in addrs)  # type: ignore[arg-type]  # a bytes body
        results = await asyncio.gather(*beats)
        return sum(results)

    async def greet(self, addr: str) -> None:
        """A broker answered that it does not know this client's group (it restarted since our last
        heartbeat, which comes every 30 s): heartbeat it now, at most once a second."""
        now = time.monotonic()
        if now - self._greeted.get(addr, -EARLY_REFRESH_MIN) >= EARLY_REFRESH_MIN:
            self._greeted[addr] = now
            await self.heartbeat_all({addr})

    async def _heartbeat(self, addr: str, body: bytes) -> bool:
        try:
            resp = await self.invoke(addr, RemotingCommand(RequestCode.HEART_BEAT, body=body))
            api.check(resp, addr, "heartbeat")
            return True
        except Exception as exc:
            log.warning("%s: heartbeat to %s failed: %s", self.client_id, addr, exc)
            return False

    async def unregister(self, producer_group: str | None, consumer_group: str | None) -> None:
        """UNREGISTER_CLIENT to every broker we know, so that groups rebalance at once."""
        addrs = sorted({a for b in self.brokers.values() for a in b.broker_addrs.values()})
        cmd_args = (self.client_id, producer_group, consumer_group)

        async def one(addr: str) -> None:
            try:
                await self.invoke(addr, api.unregister_client_request(*cmd_args), 1.0)
            except Exception as exc:
                log.info("%s: unregister at %s failed: %s", self.client_id, addr, exc)
        await asyncio.gather(*(one(a) for a in addrs))

    # -- requests from brokers ------------------------------------------------------------------

    async def _notify_ids_changed(self, conn: Connection, cmd: RemotingCommand) -> None:
        group = (cmd.ext_fields or {}).get("consumerGroup", "")
        log.info("%s: broker %s says the consumers of %s changed", self.client_id, conn.remote_address, group)
        for callback in self.on_consumer_ids_changed:
            callback(group)
        return None

    async def _reset_offset(self, conn: Connection, cmd: RemotingCommand) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET (an operator reset the group's offsets at the broker): the
        group's consumer here moves the topic's queues to the table's offsets."""
        ext = cmd.ext_fields or {}
        group, topic = ext.get("group", ""), ext.get("topic", "")
        try:
            table = bodies.parse_reset_offsets(cmd.body_bytes())
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s: reset offset of %s from %s is malformed: %s", self.client_id, group,
                        conn.remote_address, exc)
            return None
        for member in self._consumers(group, "reset_offset"):
            log.info("%s: broker %s resets %s of %s to %s", self.client_id, conn.remote_address, topic, group,
                     {mq.queue_id: offset for mq, offset in sorted(table.items())})
            await member.reset_offset(topic, table)
        return None

    def _consumers(self, group: str, method: str) -> list[Any]:
        """The members consuming for group that can do `method` (a push consumer can do more than
        a pull consumer)."""
        return [m for m in self.members if getattr(m, "group", None) == group and hasattr(m, method)]

    def _consumer(self, group: str, method: str) -> Any:
        return next(iter(self._consumers(group, method)), None)

    async def _running_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_RUNNING_INFO (ClientRemotingProcessor.getConsumerRunningInfo)."""
        ext = cmd.ext_fields or {}
        group = ext.get("consumerGroup", "")
        member = self._consumer(group, "running_info")
        if member is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR,
                                     f"The Consumer Group <{group}> not exist in this consumer")
        info = member.running_info()
        info.properties.update({PROP_NAMESERVER_ADDR: ";".join(self.config.registry),
                                PROP_CLIENT_VERSION: CURRENT_VERSION.name})
        if ext.get("jstackEnable", "false").lower() == "true":
            info.jstack = thread_stacks()
        return cmd.make_response(ResponseCode.SUCCESS, body=encode_running_info(info))

    async def _consumer_status(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_STATUS_FROM_CLIENT (ClientRemotingProcessor.getConsumeStatus): the offsets the
        group's consumer holds for the topic; an empty table when this client has no such consumer."""
        ext = cmd.ext_fields or {}
        member = self._consumer(ext.get("group", ""), "held_offsets")
        held = member.held_offsets(ext.get("topic", "")) if member is not None else {}
        table = fastjson.dumps_keyed((mq.to_json(), offset) for mq, offset in sorted(held.items()))
        return cmd.make_response(ResponseCode.SUCCESS, body=b'{"consumerTable":{},"messageQueueTable":' + table + b"}")

    async def _consume_directly(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """CONSUME_MESSAGE_DIRECTLY (ClientRemotingProcessor.consumeMessageDirectly): the group's
        push consumer runs its listener on the store record in the body."""
        group = (cmd.ext_fields or {}).get("consumerGroup", "")
        member = self._consumer(group, "consume_message_directly")
        if member is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR,
                                     f"The Consumer Group <{group}> not exist in this consumer")
        try:
            msgs = api.decode_messages(cmd.body_bytes(), conn.remote_address, "consume message directly")
        except BrokerError as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        if len(msgs) != 1:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"expected one message in the body, got {len(msgs)}")
        result, remark, spent_ms = await member.consume_message_directly(msgs[0])
        log.info("%s: consumed %s directly for %s: %s", self.client_id, msgs[0].msg_id, group, result.value)
        return cmd.make_response(ResponseCode.SUCCESS, body=encode_direct_result(
            result, spent_ms, remark, order=getattr(member, "orderly", False)))

    async def _check_transaction(self, conn: Connection, cmd: RemotingCommand) -> None:
        if self.check_handler is not None:
            await self.check_handler(conn, cmd)

    async def _push_reply(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if self.reply_handler is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "this client sent no request awaiting a reply")
        return await self.reply_handler(cmd)
