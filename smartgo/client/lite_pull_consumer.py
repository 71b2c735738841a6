"""AsyncLitePullConsumer (Java's DefaultLitePullConsumer, RocketMQ 4.6+): the application calls
poll() and the consumer does the rest. Each queue it holds has a long-polling pull loop that
fills a local cache; the group's queues are balanced among its consumers (subscribe) or chosen
by the application (assign); seek, pause and resume work per queue.

A queue's offset advances when poll hands its messages out. A commit stores the advanced
offsets: automatically at the first poll after auto_commit_interval (and at close), or with
commit(). A message polled but not committed is read again after a crash or when its queue
moves to another consumer: at least once, as in Java (and Kafka's consumer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from smartgo.client import api
from smartgo.client.allocate import AllocateStrategy, allocate_averagely
from smartgo.client.config import ClientConfig
from smartgo.client.errors import ClientStateError
from smartgo.client.message import ConsumeFromWhere, MessageModel, MessageQueue, PullStatus
from smartgo.client.process_queue import ProcessQueue
from smartgo.client.pull import pull_sys_flag
from smartgo.client.pull_consumer import BLOCK_SUSPEND_MS
from smartgo.client.rebalance import PULL_DELAY_ON_FLOW_CONTROL, BalancedConsumer, ConsumerOptions, queue_offset
from smartgo.client.route import TopicRouteData
from smartgo.client.running_info import CONSUME_ACTIVELY, PROP_CONSUME_TYPE, PROP_CONSUMER_START_TIMESTAMP, RunningInfo
from smartgo.client.subscription import MessageSelector, SubscriptionData, build_subscription
from smartgo.client.trace import trace_polled
from smartgo.net.codes import RequestCode
from smartgo.net.loop import wait_within
from smartgo.store.record import MessageExt

log = logging.getLogger(__name__)

#: Java's consumerTimeoutMillisWhenSuspend: a held pull's answer is awaited this long.
SUSPENDED_PULL_TIMEOUT = 30.0

_Batch = tuple[MessageQueue, ProcessQueue, list[MessageExt]]
#: Called with a topic and its readable queues when they change (a queue added, a broker gone).
QueuesChanged = Callable[[str, set[MessageQueue]], None]
#: Java's MessageQueueListener: a topic, all its readable queues, and those this consumer now
#: reads, after a rebalance changed them.
QueuesAssigned = Callable[[str, set[MessageQueue], set[MessageQueue]], None]


class AsyncLitePullConsumer(BalancedConsumer):
    def __init__(self, group: str, registry: str | list[str], *, model: MessageModel | str = MessageModel.CLUSTERING,
                 consume_from: ConsumeFromWhere | str = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 consume_timestamp_ms: int | None = None, allocate: AllocateStrategy | str = allocate_averagely,
                 auto_commit: bool = True, auto_commit_interval: float = 5.0, pull_batch_size: int = 10,
                 pull_threshold_for_all: int = 10000, pull_threshold_for_queue: int = 1000,
                 pull_threshold_size_mb: int = 100, max_span: int = 2000, poll_timeout: float = 5.0,
                 rebalance_interval: float = 20.0, offset_store_dir: str | Path = "~/.smartgo_offsets",
                 config: ClientConfig | None = None, enable_msg_trace: bool = False, trace_topic: str | None = None,
                 **config_options: object) -> None:
        super().__init__(ConsumerOptions.of(locals()))
        self.auto_commit = auto_commit
        self.auto_commit_interval = auto_commit_interval
        self.pull_threshold_for_all = pull_threshold_for_all
        self.poll_timeout = poll_timeout
        #: Assign mode: the queues and their subscriptions (subscribe mode: `subscriptions`).
        self._assigned: dict[MessageQueue, SubscriptionData] | None = None
        #: Where poll has got to in each queue: what the next commit stores.
        self._polled: dict[MessageQueue, int] = {}
        self._paused: dict[MessageQueue, asyncio.Event] = {}      # set by resume()
        self._parked: dict[MessageQueue, list[_Batch]] = {}       # pulled while paused, polled after resume
        self._cache: asyncio.Queue[_Batch | None] = asyncio.Queue()
        self._next_auto_commit = 0.0
        self._heartbeat_due = False     # a subscription changed while running: tell the brokers first
        #: registerTopicMessageQueueChangeListener: topic -> (callback, the queues it last saw).
        self._queue_listeners: dict[str, tuple[QueuesChanged, frozenset[MessageQueue]]] = {}
        self._assign_listeners: dict[str, QueuesAssigned] = {}      # subscribe(..., listener)
        self._assign_expressions: dict[str, SubscriptionData] = {}  # setSubExpressionForAssign

    # -- what to read ---------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str | MessageSelector = "*",
                  listener: QueuesAssigned | None = None) -> None:
        """Read topic's messages whose tag the expression names (or that a MessageSelector.by_sql
        selects), from the queues the group's balancing gives this consumer. listener (Java's
        MessageQueueListener) is called on the client's loop with the topic, all its queues and
        this consumer's share, whenever a rebalance changed that share."""
        if self._assigned is not None:
            raise ClientStateError("subscribe and assign are mutually exclusive")
        self.subscriptions[topic] = build_subscription(topic, expression)
        if listener is not None:
            self._assign_listeners[topic] = listener
        else:
            self._assign_listeners.pop(topic, None)
        self._heartbeat_due = True
        self.rebalance_soon()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        self._assign_listeners.pop(topic, None)
        self._heartbeat_due = True
        self.rebalance_soon()

    async def assign(self, queues: Iterable[MessageQueue], expression: str | MessageSelector | None = None) -> None:
        """Read exactly these queues (no balancing); queues held before and not listed are let go.
        They are filtered by expression, or else by their topic's set_sub_expression_for_assign,
        or else not at all."""
        if self.subscriptions:
            raise ClientStateError("subscribe and assign are mutually exclusive")
        subs: dict[str, SubscriptionData] = {}
        assigned = {}
        for mq in queues:
            if mq.topic not in subs:
                subs[mq.topic] = (build_subscription(mq.topic, expression) if expression is not None else
                                  self._assign_expressions.get(mq.topic) or build_subscription(mq.topic, "*"))
            assigned[mq] = subs[mq.topic]
        self._assigned = assigned
        if self._running:
            await self.rebalance()

    def set_sub_expression_for_assign(self, topic: str, expression: str | MessageSelector) -> None:
        """setSubExpressionForAssign: how `assign` filters topic's queues when its call names no
        expression; queues of topic already assigned use it from their next pull."""
        sub = self._assign_expressions[topic] = build_subscription(topic, expression)
        for mq in self._assigned or ():
            if mq.topic == topic:
                self._assigned[mq] = sub  # type: ignore[index]  # iterated above

    def assignment(self) -> set[MessageQueue]:
        """The queues this consumer reads now."""
        return set(self.process_queues)

    async def on_queues_changed(self, topic: str, callback: QueuesChanged) -> None:
        """registerTopicMessageQueueChangeListener: callback(topic, queues) on the client's loop
        whenever the topic's readable queues change (checked at each route refresh, every
        poll_registry_interval), so an assigning application can assign the new set."""
        self._check_running()
        self._queue_listeners[topic] = (callback, frozenset(await self.fetch_queues(topic)))

    def topics(self) -> set[str]:
        return set(self.subscriptions) | set(self._queue_listeners) | {mq.topic for mq in self._assigned or ()}

    def on_route(self, topic: str, route: TopicRouteData) -> None:
        super().on_route(topic, route)
        listener = self._queue_listeners.get(topic)
        if listener is None:
            return
        callback, seen = listener
        queues = frozenset(self._sub_queues[topic])
        if queues != seen:
            self._queue_listeners[topic] = (callback, queues)
            try:
                callback(topic, set(queues))
            except Exception:
                log.exception("%s: the queue change listener of %s raised", self.group, topic)

    # -- member of the client instance ----------------------------------------------------------

    def heartbeat_entry(self) -> tuple[str, dict | None]:
        """An assigning consumer lists no subscriptions, as Java's does: it takes no part in the
        group's balancing."""
        return "consumer", api.consumer_data(self.group, CONSUME_ACTIVELY, self.model.value, self.consume_from.value,
                                             [s.to_json() for s in self.subscriptions.values()])

    def running_info(self) -> RunningInfo:
        """DefaultLitePullConsumer's settings under Java's names, the subscriptions, and each
        queue held with its committed offset and cache."""
        props: dict[str, object] = {"consumerGroup": self.group, "messageModel": self.model.value,
                 "consumeFromWhere": self.consume_from.value, "autoCommit": str(self.auto_commit).lower(),
                 "autoCommitIntervalMillis": int(self.auto_commit_interval * 1000),
                 "pullBatchSize": self.pull_batch_size, "pullThresholdForAll": self.pull_threshold_for_all,
                 "pullThresholdForQueue": self.pull_threshold_for_queue,
                 "pullThresholdSizeForQueue": self.pull_threshold_size // (1024 * 1024),
                 "consumeMaxSpan": self.max_span, "pollTimeoutMillis": int(self.poll_timeout * 1000),
                 PROP_CONSUME_TYPE: CONSUME_ACTIVELY, PROP_CONSUMER_START_TIMESTAMP: self._started_ms}
        subs = self.subscriptions or {s.topic: s for s in (self._assigned or {}).values()}
        queues = {mq: pq.info(self.offsets.memory_offset(mq)) for mq, pq in list(self.process_queues.items())}
        return RunningInfo(props, [s.to_json() for s in subs.values()], queues)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> AsyncLitePullConsumer:
        if not self.subscriptions and self._assigned is None:
            raise ClientStateError("subscribe to a topic or assign queues before start()")
        await self._attach()
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval
        self._running = True
        await self._join()
        self._rebalancer.start()
        if self._assigned is not None:
            await self.rebalance()        # assigned queues are read as start() returns
        return self

    async def close(self) -> None:
        """Stop pulling, commit (with auto_commit: where poll has got to), leave the group and
        close the connections. A poll waiting meanwhile returns nothing."""
        if not self._running:
            await self.instance.close()
            return
        await self._stop_pulling()
        self._cache.put_nowait(None)
        try:
            if self.auto_commit:
                self._commit_polled()
            await self._commit_held()
            await self.instance.unregister(None, self.group)
        finally:
            await self._release()

    def _check_running(self) -> None:
        if not self._running:
            raise ClientStateError("the consumer is not running")

    # -- polling --------------------------------------------------------------------------------

    async def poll(self, timeout: float | None = None) -> list[MessageExt]:
        """The next batch pulled from one queue (at most pull_batch_size messages, in offset
        order), waiting up to `timeout` seconds (default poll_timeout) for one; [] if none came."""
        self._check_running()
        if timeout is None:
            timeout = self.poll_timeout
        if timeout < 0:
            raise ValueError("timeout must be >= 0")
        if self.auto_commit and time.monotonic() >= self._next_auto_commit:
            self._commit_polled()
            self._next_auto_commit = time.monotonic() + self.auto_commit_interval
        cache = self._cache
        deadline = time.monotonic() + timeout
        while True:
            try:
                batch = cache.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                try:
                    batch = await wait_within(cache.get(), remaining)
                except asyncio.TimeoutError:
                    return []
            if batch is None:                       # closed: wake any other poller too
                cache.put_nowait(None)
                return []
            mq, pq, msgs = batch
            if pq.dropped:
                continue                            # sought or rebalanced away meanwhile
            if mq in self._paused:
                self._parked.setdefault(mq, []).append(batch)
                continue
            offset = pq.remove(msgs)
            if offset >= 0:
                self._polled[mq] = offset
            if self.tracer is not None:
                trace_polled(self.group, msgs, self.tracer.append)
            return msgs

    # -- positions ------------------------------------------------------------------------------

    async def seek(self, queue: MessageQueue, offset: int) -> None:
        """Read queue from offset on (between its min and max offset); the next commit stores
        it. What was pulled from the queue and not polled yet is discarded."""
        self._check_running()
        self._held(queue)
        low, high = await asyncio.gather(self.min_offset(queue), self.max_offset(queue))
        if not low <= offset <= high:
            raise ValueError(f"seek offset {offset} of {queue} is outside [{low}, {high}]")
        self._held(queue)                           # a rebalance may have taken it meanwhile
        self._restart(queue, offset)
        self._polled[queue] = offset

    async def seek_to_begin(self, queue: MessageQueue) -> None:
        await self.seek(queue, await self.min_offset(queue))

    async def seek_to_end(self, queue: MessageQueue) -> None:
        await self.seek(queue, await self.max_offset(queue))

    def _held(self, queue: MessageQueue) -> None:
        if queue not in self.process_queues:
            raise ClientStateError(f"{queue} is not assigned to this consumer (rebalancing?)")

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """poll returns nothing of these queues, and they are not pulled, until resume(). What
        was pulled already is kept for then (Kafka's pause; Java's only stops the pulls)."""
        for mq in queues:
            self._paused.setdefault(mq, asyncio.Event())

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        for mq in queues:
            event = self._paused.pop(mq, None)
            if event is not None:
                event.set()
            for batch in self._parked.pop(mq, ()):
                self._cache.put_nowait(batch)

    async def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """commitSync: store at the broker (or, broadcasting, in the local file) where poll has
        got to in every queue held, or the given offsets; waits for the acknowledgement. Queues
        not held (taken by a rebalance meanwhile) are skipped with a log line, as in Java."""
        self._check_running()
        if offsets is None:
            queues = self._commit_polled()
        else:
            queues = []
            for mq, offset in offsets.items():
                if mq in self.process_queues:
                    self.offsets.update(mq, offset)
                    queues.append(mq)
                else:
                    log.warning("%s: not committing %s, a queue this consumer does not hold", self.group, mq)
        await self.offsets.persist(queues, acked=True)

    def _commit_polled(self) -> list[MessageQueue]:
        """Where poll has got to, into the offset store (persisted every 5 s and at close)."""
        queues = [mq for mq in self._polled if mq in self.process_queues]
        for mq in queues:
            self.offsets.update(mq, self._polled[mq])
        return queues

    async def committed(self, queue: MessageQueue) -> int:
        """The group's committed offset of queue (-1 when none)."""
        offset = self.offsets.memory_offset(queue)
        return offset if offset >= 0 else await self.offsets.read(queue)

    # -- queues and offsets at the broker -------------------------------------------------------

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted (for assign)."""
        route = await self.instance.update_route(topic) or await self.instance.route(topic)
        return route.subscribe_queues(topic)

    async def min_offset(self, queue: MessageQueue) -> int:
        return await queue_offset(self.instance, RequestCode.GET_MIN_OFFSET, queue)

    async def max_offset(self, queue: MessageQueue) -> int:
        return await queue_offset(self.instance, RequestCode.GET_MAX_OFFSET, queue)

    async def offset_for_timestamp(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset whose message was stored at or after timestamp_ms."""
        return await queue_offset(self.instance, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, queue, int(timestamp_ms))

    async def reset_offset(self, topic: str, table: dict[MessageQueue, int]) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET (mqadmin resetOffsetByTime): the queues held are read
        again from the table's offsets, and the whole table is committed (every consumer of the
        group gets it: the same values, whoever holds a queue). Java's lite consumer ignores it."""
        async with self._rebalancing:
            for mq, offset in table.items():
                if mq in self.process_queues:
                    self._restart(mq, offset)
                    self._polled[mq] = offset
                self.offsets.update(mq, offset)
            await self.offsets.persist(list(table), acked=True)

    # -- balancing ------------------------------------------------------------------------------

    async def rebalance(self) -> bool:
        """Subscribe mode: take this consumer's share of each topic's queues; assign mode: the
        assigned queues (one that could not be taken is tried again here every 20 s)."""
        async with self._rebalancing:
            if not self._running:
                return True
            if self._assigned is not None:
                await self._hold(set(self._assigned), lambda mq: True)
                return True
            done = True
            if self._heartbeat_due:
                self._heartbeat_due = False
                await self.instance.heartbeat_all()
            for topic in list(self.subscriptions):
                try:
                    queues = await self._queues_of(topic)
                    mine = await self.balance.mine(topic, queues)
                    if await self._hold(mine, lambda mq, t=topic: mq.topic == t):  # type: ignore[misc]  # t: str
                        self._assigned_to(topic, set(queues), mine)
                except Exception as exc:
                    log.warning("%s: rebalancing %s failed: %s", self.group, topic, exc)
                    done = False
            await self._hold(set(), lambda mq: mq.topic not in self.subscriptions)
        return done

    def _assigned_to(self, topic: str, queues: set[MessageQueue], mine: set[MessageQueue]) -> None:
        listener = self._assign_listeners.get(topic)
        if listener is not None:
            try:
                listener(topic, queues, set(mine))
            except Exception:
                log.exception("%s: the queue listener of %s raised", self.group, topic)

    async def _hold(self, wanted: set[MessageQueue], scope: Callable[[MessageQueue], bool]) -> bool:
        """Let go of the queues in scope that are not wanted, and start reading the wanted ones
        not held yet; whether that changed anything."""
        gone = [mq for mq in self.process_queues if scope(mq) and mq not in wanted]
        for mq in gone:
            self._detach(mq)
            try:
                await self.offsets.persist([mq], acked=True)
            except Exception as exc:
                log.warning("%s: committing %s on release failed: %s", self.group, mq, exc)
            self.offsets.remove(mq)
        new = sorted(wanted - set(self.process_queues))
        for mq in new:
            self.offsets.remove(mq)
            self._restart(mq, -1)
        if gone or new:
            log.info("%s: now reading %s", self.group, sorted(self.process_queues))
        return bool(gone or new)

    def _detach(self, mq: MessageQueue) -> ProcessQueue | None:
        self._polled.pop(mq, None)
        self._parked.pop(mq, None)
        return super()._detach(mq)

    def _restart(self, mq: MessageQueue, offset: int) -> None:
        """Read mq from offset (-1: from the committed offset or consume_from) with a fresh
        cache; batches of the old one still queued for poll are skipped."""
        self._detach(mq)
        pq = self.process_queues[mq] = ProcessQueue(offset)
        pq.pull_task = asyncio.get_running_loop().create_task(self._pull_loop(mq, pq))

    # -- pulling --------------------------------------------------------------------------------

    def _held_back(self, pq: ProcessQueue) -> bool:
        """Flow control: too much cached in this queue, or in all of them (counted as Java does:
        batches waiting for poll times the batch size)."""
        return self._queue_full(pq) or self._cache.qsize() * self.pull_batch_size >= self.pull_threshold_for_all

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        flag = pull_sys_flag(False, True, True)
        while not pq.dropped:
            resumed = self._paused.get(mq)
            if resumed is not None:
                await resumed.wait()
                continue
            if self._held_back(pq):
                await asyncio.sleep(PULL_DELAY_ON_FLOW_CONTROL)
                continue
            sub = self.subscriptions.get(mq.topic) if self._assigned is None else self._assigned.get(mq)
            if sub is None:
                return
            result = await self._pull_once(mq, pq, sub, flag, 0, BLOCK_SUSPEND_MS, SUSPENDED_PULL_TIMEOUT)
            if result is None:
                continue
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning("%s: offset %d of %s is illegal; moving to %d", self.group, pq.next_offset, mq,
                            result.next_begin_offset)
            pq.next_offset = result.next_begin_offset
            if result.messages:
                pq.put(result.messages)
                self._cache.put_nowait((mq, pq, result.messages))
            elif not pq.count:
                self._polled[mq] = pq.next_offset   # nothing cached: offsets the tag filter skipped are done
