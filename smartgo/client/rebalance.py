"""What a balancing consumer does besides consuming (Java's RebalanceImpl and the shared parts of
its consumer impls), shared by the push and the lite pull consumer: who else is in the group,
which of a topic's queues are this client's, where a queue newly taken starts, the loop that
re-asks every 20 s or at once when a broker says the group changed, and BalancedConsumer, their
common base (settings, joining, routes, one pull, closing)."""

from __future__ import annotations

import abc
import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from smartgo.client import api
from smartgo.client.allocate import STRATEGIES, AllocateStrategy
from smartgo.client.config import ClientConfig
from smartgo.client.errors import BrokerError, NoRouteError
from smartgo.client.instance import ClientInstance
from smartgo.client.message import ConsumeFromWhere, MessageModel, MessageQueue, PullResult
from smartgo.client.offset_store import LocalOffsetStore, OffsetStore, RemoteOffsetStore
from smartgo.client.process_queue import ProcessQueue
from smartgo.client.pull import SUSPEND_MS, SUSPEND_TIMEOUT, pull
from smartgo.client.route import TopicRouteData
from smartgo.client.subscription import SubscriptionData
from smartgo.client.trace import TraceDispatcher
from smartgo.filter import is_tag_type
from smartgo.net.codes import RETRY_GROUP_TOPIC_PREFIX, RequestCode, ResponseCode
from smartgo.net.errors import RemotingConnectError
from smartgo.net.loop import wait_within

log = logging.getLogger(__name__)

#: Pause before pulling again after an error (Java PULL_TIME_DELAY_MILLS_WHEN_EXCEPTION).
PULL_DELAY_ON_ERROR = 3.0
#: s before a rebalance that failed somewhere runs again (doubling up to the rebalance interval).
RETRY_FIRST = 1.0
#: Pause while flow control holds a queue (PULL_TIME_DELAY_MILLS_WHEN_FLOW_CONTROL).
PULL_DELAY_ON_FLOW_CONTROL = 0.05

C = TypeVar("C", bound="BalancedConsumer")


async def queue_offset(instance: ClientInstance, code: int, mq: MessageQueue, timestamp: int | None = None) -> int:
    """GET_MIN_OFFSET, GET_MAX_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP or GET_EARLIEST_MSG_STORETIME of
    a queue, at its master."""
    addr = await instance.master_addr(mq.broker_name, mq.topic)
    resp = await instance.invoke(addr, api.offset_request(code, mq.topic, mq.queue_id, timestamp))
    field = "timestamp" if code == RequestCode.GET_EARLIEST_MSG_STORETIME else "offset"
    return api.ext_long(resp, field, addr, f"{RequestCode(code).name} of {mq}")


@dataclass
class Balance:
    instance: ClientInstance
    group: str
    clustering: bool
    allocate: AllocateStrategy
    consume_from: ConsumeFromWhere
    consume_timestamp_ms: int
    offsets: OffsetStore

    async def consumer_ids(self, topic: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP at one broker of the topic (any knows the whole group:
        consumers heartbeat to slaves too), its master first, then its slaves."""
        route = await self.instance.route(topic)
        brokers = [b for b in route.broker_datas if b.broker_addrs]
        if not brokers:
            raise NoRouteError(topic, "no broker address in its route")
        b = random.choice(brokers)
        refused: RemotingConnectError | None = None
        for _, addr in sorted(b.broker_addrs.items()):          # brokerId 0, the master, first
            try:
                resp = await self.instance.invoke(addr, api.consumer_list_request(self.group))
            except RemotingConnectError as exc:
                refused = exc
                continue
            if resp.code == ResponseCode.SYSTEM_ERROR:     # "no consumer for this group": it restarted
                await self.instance.greet(addr)
                resp = await self.instance.invoke(addr, api.consumer_list_request(self.group))
            return api.decode_consumer_list(resp, addr)
        assert refused is not None
        raise refused

    async def mine(self, topic: str, mqs: Iterable[MessageQueue]) -> set[MessageQueue]:
        """This client's share of the topic's queues: all of them when broadcasting."""
        if not self.clustering:
            return set(mqs)
        cids = await self.consumer_ids(topic)
        client_id = self.instance.client_id
        if cids and client_id not in cids:
            log.info("%s: %s is not yet among the group's consumers %s", self.group, client_id, cids)
        return set(self.allocate(self.group, client_id, sorted(mqs), sorted(cids)))

    async def pull_from(self, mq: MessageQueue) -> int:
        """The stored offset, else (a new group) where consume_from says (computePullFromWhere)."""
        last = await self.offsets.read(mq)
        if last >= 0:
            return last
        is_retry = mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        if self.consume_from is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET or (
                is_retry and self.consume_from is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET):
            return 0
        if self.consume_from is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET or is_retry:
            return await queue_offset(self.instance, RequestCode.GET_MAX_OFFSET, mq)
        return await queue_offset(self.instance, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, self.consume_timestamp_ms)

    async def check_in_brokers(self, subscriptions: Iterable[SubscriptionData]) -> None:
        """checkClientInBroker: every broker of a SQL92 subscription's topic must accept its
        expression (CHECK_CLIENT_CONFIG), or start() fails with the broker's reason."""
        for sub in subscriptions:
            if is_tag_type(sub.expression_type):
                continue
            try:
                route = await self.instance.route(sub.topic)
            except Exception as exc:
                log.warning("%s: cannot check %s's SQL92 subscription in its brokers yet: %s", self.group,
                            sub.topic, exc)
                continue
            for broker in route.broker_datas:
                addr = self.instance.broker_addr(broker.broker_name)
                if addr is not None:
                    cmd = api.check_client_config_request(self.instance.client_id, self.group, sub.to_json())
                    api.check(await self.instance.invoke(addr, cmd), addr, f"{sub.expression_type} subscription "
                              f"{sub.sub_string!r:.100} of {sub.topic}")


class RebalanceLoop:
    """Runs the consumer's rebalance every `interval` seconds, and at once after soon(). A round
    that failed somewhere (the job returns False: a broker away, say) runs again after RETRY_FIRST
    seconds, doubling up to `interval`: Java waits the whole interval (20 s)."""

    def __init__(self, job: Callable[[], Awaitable[bool]], interval: float, group: str) -> None:
        self.job = job
        self.interval = interval
        self.group = group
        self._now: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._wait = interval               # until the next round unless soon()

    def start(self) -> None:
        self._now = asyncio.Event()
        self._now.set()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def soon(self) -> None:
        if self._now is not None:
            self._now.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        assert self._now is not None
        while True:
            try:
                await wait_within(self._now.wait(), self._wait)
            except asyncio.TimeoutError:
                pass
            self._now.clear()
            try:
                done = await self.job()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("%s: rebalance failed: %s", self.group, exc)
                done = False
            retrying = self._wait < self.interval
            self._wait = self.interval if done else min(self.interval, self._wait * 2 if retrying else RETRY_FIRST)


def check_range(name: str, value: float, low: float, high: float) -> None:
    """Java's checkConfig: a setting outside its range is refused at construction."""
    if not low <= value <= high:
        raise ValueError(f"{name} out of range [{low}, {high}]: {value}")


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """The settings the push and the lite pull consumer share, under their constructors' keyword
    names (each constructor keeps its own defaults); checked as Java's checkConfig does."""

    group: str
    registry: str | list[str]
    model: MessageModel | str
    consume_from: ConsumeFromWhere | str
    consume_timestamp_ms: int | None
    allocate: AllocateStrategy | str
    pull_batch_size: int
    pull_threshold_for_queue: int
    pull_threshold_size_mb: int
    max_span: int
    rebalance_interval: float
    offset_store_dir: str | Path
    config: ClientConfig | None
    enable_msg_trace: bool
    trace_topic: str | None
    config_options: dict[str, object]      # ClientConfig fields given as keywords (used when config is None)

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> ConsumerOptions:
        """The options among a consumer constructor's arguments (its locals(): the same names)."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls)})

    def __post_init__(self) -> None:
        if not self.group:
            raise ValueError("a consumer needs a group name")
        for name, high in (("pull_batch_size", 1024), ("pull_threshold_for_queue", 65535),
                           ("pull_threshold_size_mb", 1024), ("max_span", 65535)):
            check_range(name, getattr(self, name), 1, high)


class BalancedConsumer(abc.ABC):
    """What the push and the lite pull consumer share: their common settings and offset store,
    joining the group at start, following routes, a topic's queues, one pull with its error
    handling, and stopping the pulls and committing at close."""

    def __init__(self, options: ConsumerOptions) -> None:
        o = options
        group = self.group = o.group
        self.config = o.config or ClientConfig.make(o.registry, **o.config_options)
        self.model = MessageModel(o.model)
        self.consume_from = ConsumeFromWhere(o.consume_from)
        self.consume_timestamp_ms = (int(time.time() * 1000) - 30 * 60 * 1000 if o.consume_timestamp_ms is None
                                     else o.consume_timestamp_ms)
        self.allocate: AllocateStrategy = STRATEGIES[o.allocate] if isinstance(o.allocate, str) else o.allocate
        self.pull_batch_size = o.pull_batch_size
        self.pull_threshold_for_queue = o.pull_threshold_for_queue
        self.pull_threshold_size = o.pull_threshold_size_mb * 1024 * 1024
        self.max_span = o.max_span
        self.instance = ClientInstance(self.config)
        self.offsets: OffsetStore = (
            RemoteOffsetStore(self.instance, group) if self.clustering
            else LocalOffsetStore(Path(o.offset_store_dir), self.config.instance_name or "DEFAULT", group))
        self.balance = Balance(self.instance, group, self.clustering, self.allocate, self.consume_from,
                               self.consume_timestamp_ms, self.offsets)
        self.subscriptions: dict[str, SubscriptionData] = {}
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self._sub_queues: dict[str, list[MessageQueue]] = {}
        self._route_addrs: dict[str, dict[str, dict[int, str]]] = {}     # topic -> broker -> id -> address
        self._rebalancer = RebalanceLoop(self.rebalance, o.rebalance_interval, group)
        self._rebalancing = asyncio.Lock()
        self._running = False
        self._started_ms = 0
        #: Message trace (trace.py): SubBefore and SubAfter records of what is consumed.
        self.tracer = TraceDispatcher(self.config, o.trace_topic) if o.enable_msg_trace else None

    @property
    def clustering(self) -> bool:
        return self.model is MessageModel.CLUSTERING

    @property
    def client_id(self) -> str:
        return self.instance.client_id

    @abc.abstractmethod
    async def rebalance(self) -> bool:
        """Take this consumer's queues and let go of the others; False if a topic failed."""

    def rebalance_soon(self) -> None:
        self._rebalancer.soon()

    # -- member of the client instance ----------------------------------------------------------

    def topics(self) -> set[str]:
        return set(self.subscriptions)

    def on_route(self, topic: str, route: TopicRouteData) -> None:
        self._sub_queues[topic] = route.subscribe_queues(topic)
        addrs = {b.broker_name: dict(b.broker_addrs) for b in route.broker_datas}
        if self._route_addrs.get(topic, addrs) != addrs:
            self.rebalance_soon()             # a broker came or went (a master died: read on at its slave)
        self._route_addrs[topic] = addrs

    def held_offsets(self, topic: str) -> dict[MessageQueue, int]:
        """The offsets this consumer holds for topic (GET_CONSUMER_STATUS_FROM_CLIENT)."""
        return self.offsets.offsets_of(topic)

    # -- lifecycle ------------------------------------------------------------------------------

    async def _attach(self) -> None:
        await self.instance.start()
        self.instance.members.append(self)  # type: ignore[arg-type]  # a member, as instance.Member says
        self.instance.on_consumer_ids_changed.append(lambda group: self.rebalance_soon())
        self._started_ms = int(time.time() * 1000)
        if self.tracer is not None:
            await self.tracer.start()

    async def _join(self) -> None:
        """Fetch the routes, have the brokers check SQL92 subscriptions (a refusal closes the
        consumer and raises), heartbeat, and start the periodic jobs."""
        for topic in self.topics():
            try:
                await self.instance.update_route(topic)
            except Exception as exc:
                log.warning("%s: no route for %s yet (%s); rebalancing retries", self.group, topic, exc)
        try:
            await self.balance.check_in_brokers(self.subscriptions.values())
        except Exception:
            await self.close()
            raise
        await self.instance.heartbeat_all()
        self.instance.start_route_and_heartbeat()
        self.instance.every(self.config.persist_offset_interval, self.persist_offsets, "persist offsets")

    @abc.abstractmethod
    async def start(self: C) -> C:
        """Join the group and start pulling."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop pulling, commit, leave the group and close the connections."""

    async def __aenter__(self: C) -> C:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _stop_pulling(self) -> None:
        self._running = False
        await self._rebalancer.stop()
        pulls = [pq.pull_task for pq in self.process_queues.values() if pq.pull_task is not None]
        for task in pulls:
            task.cancel()
        await asyncio.gather(*pulls, return_exceptions=True)

    async def _commit_held(self) -> None:
        try:
            await self.offsets.persist(list(self.process_queues), acked=True)
        except Exception as exc:
            log.error("%s: committing offsets at close failed (they will be consumed again): %s", self.group, exc)

    async def _release(self) -> None:
        """The end of close: the queues dropped, the trace records sent, the connections closed."""
        for pq in self.process_queues.values():
            pq.dropped = True
        if self.tracer is not None:
            await self.tracer.close()
        await self.instance.close()

    async def persist_offsets(self) -> None:
        await self.offsets.persist(list(self.process_queues))

    # -- pulling --------------------------------------------------------------------------------

    def _detach(self, mq: MessageQueue) -> ProcessQueue | None:
        """Stop pulling mq; what is consumed of it from now on is not committed."""
        pq = self.process_queues.pop(mq, None)
        if pq is not None:
            pq.dropped = True
            if pq.pull_task is not None:
                pq.pull_task.cancel()
        return pq

    async def _queues_of(self, topic: str) -> list[MessageQueue]:
        mqs = self._sub_queues.get(topic)
        if mqs is None:
            if await self.instance.update_route(topic) is None:
                raise NoRouteError(topic, "not created yet?")
            mqs = self._sub_queues.get(topic, [])
        return mqs

    async def _pull_once(self, mq: MessageQueue, pq: ProcessQueue, sub: SubscriptionData, flag: int,
                         commit_offset: int = 0, suspend_ms: int = SUSPEND_MS,
                         timeout: float = SUSPEND_TIMEOUT) -> PullResult | None:
        """One pull from where pq is (first, if pq has no position yet, from where the group
        starts); None after a failure, logged and waited out (PULL_DELAY_ON_ERROR) or when pq
        was dropped meanwhile."""
        pq.last_pull_ms = int(time.time() * 1000)
        try:
            if pq.next_offset < 0:
                pq.next_offset = await self.balance.pull_from(mq)
            result = await pull(self.instance, self.group, mq, sub, pq.next_offset, self.pull_batch_size, flag,
                                commit_offset, suspend_ms, timeout, pq.suggested_broker_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: pull from %s failed: %s", self.group, mq, exc)
            if isinstance(exc, BrokerError) and exc.code == ResponseCode.SUBSCRIPTION_NOT_EXIST:
                await self.instance.greet(exc.addr)      # a broker restarted since our last heartbeat
            await asyncio.sleep(PULL_DELAY_ON_ERROR)
            return None
        if pq.dropped:
            return None
        pq.suggested_broker_id = result.suggest_which_broker_id
        return result

    def _queue_full(self, pq: ProcessQueue, span_counts: bool = True) -> bool:
        """Flow control per queue: too many messages or bytes cached, or too wide an offset span."""
        return (pq.count >= self.pull_threshold_for_queue or pq.msg_size >= self.pull_threshold_size
                or (span_counts and pq.span > self.max_span))
