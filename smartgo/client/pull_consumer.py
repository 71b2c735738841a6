"""AsyncPullConsumer: the application pulls from queues it chooses and owns the offsets (Java's
DefaultMQPullConsumer). No rebalancing and no automatic commits; the broker-side offset helpers
are there for applications that want the broker to remember progress."""

from __future__ import annotations

import time

from smartgo.client import api
from smartgo.client.config import ClientConfig
from smartgo.client.instance import ClientInstance, MemberClient
from smartgo.client.message import MessageQueue, PullResult
from smartgo.client.offset_store import RemoteOffsetStore
from smartgo.client.pull import pull, pull_sys_flag
from smartgo.client.rebalance import queue_offset
from smartgo.client.route import TopicRouteData
from smartgo.client.running_info import (CONSUME_ACTIVELY, PROP_CONSUME_TYPE, PROP_CONSUMER_START_TIMESTAMP,
                                         RunningInfo)
from smartgo.client.subscription import MessageSelector, SubscriptionData, build_subscription
from smartgo.net.codes import RequestCode

#: Java's DefaultMQPullConsumer: brokerSuspendMaxTimeMillis 20 s, consumerPullTimeoutMillis 10 s.
BLOCK_SUSPEND_MS = 20000
PULL_TIMEOUT = 10.0


class AsyncPullConsumer(MemberClient):
    role = "consumer"

    def __init__(self, group: str, registry: str | list[str], *, config: ClientConfig | None = None,
                 **config_options: object) -> None:
        if not group:
            raise ValueError("a consumer needs a group name")
        self.group = group
        self.config = config or ClientConfig.make(registry, **config_options)
        self.instance = ClientInstance(self.config)
        self._topics: set[str] = set()
        self._subs: dict[tuple[str, str | MessageSelector], SubscriptionData] = {}
        self._broker_ids: dict[MessageQueue, int] = {}
        self._offsets = RemoteOffsetStore(self.instance, group)
        self._started_ms = 0

    async def start(self) -> AsyncPullConsumer:
        self._started_ms = int(time.time() * 1000)
        return await super().start()

    # -- member -----------------------------------------------------------------------------------

    def topics(self) -> set[str]:
        return set(self._topics)

    def on_route(self, topic: str, route: TopicRouteData) -> None:
        pass

    def _subscriptions(self) -> list[dict]:
        return [build_subscription(t, "*", 0).to_json() for t in sorted(self._topics)]

    def heartbeat_entry(self) -> tuple[str, dict | None]:
        return "consumer", api.consumer_data(self.group, CONSUME_ACTIVELY, "CLUSTERING",
                                             "CONSUME_FROM_LAST_OFFSET", self._subscriptions())

    def held_offsets(self, topic: str) -> dict[MessageQueue, int]:
        """The offsets update_consume_offset stored for topic (GET_CONSUMER_STATUS_FROM_CLIENT)."""
        return self._offsets.offsets_of(topic)

    def running_info(self) -> RunningInfo:
        """DefaultMQPullConsumerImpl.consumerRunningInfo: the group, the start time and the topics
        pulled; no queues (the application holds them)."""
        return RunningInfo({"consumerGroup": self.group, "messageModel": "CLUSTERING",
                            PROP_CONSUME_TYPE: CONSUME_ACTIVELY, PROP_CONSUMER_START_TIMESTAMP: self._started_ms},
                           self._subscriptions())

    # -- queues and pulls -------------------------------------------------------------------------

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted."""
        self._topics.add(topic)
        route = await self.instance.update_route(topic) or await self.instance.route(topic)
        return route.subscribe_queues(topic)

    def _sub(self, topic: str, expression: str | MessageSelector) -> SubscriptionData:
        key = (topic, expression)
        sub = self._subs.get(key)
        if sub is None:
            sub = self._subs[key] = build_subscription(topic, expression)
        return sub

    async def pull(self, queue: MessageQueue, expression: str | MessageSelector = "*", offset: int = 0,
                   max_nums: int = 32, timeout: float = PULL_TIMEOUT) -> PullResult:
        """Messages from offset on (at most max_nums; the tags the expression names, or what a
        MessageSelector.by_sql selects), without waiting."""
        return await self._pull(queue, expression, offset, max_nums, False, timeout)

    async def pull_blocking(self, queue: MessageQueue, expression: str | MessageSelector = "*", offset: int = 0,
                            max_nums: int = 32, suspend: float = BLOCK_SUSPEND_MS / 1000) -> PullResult:
        """Like pull, but the broker holds the request (long polling) up to `suspend` seconds
        until a message arrives."""
        return await self._pull(queue, expression, offset, max_nums, True, suspend + PULL_TIMEOUT,
                                int(suspend * 1000))

    async def _pull(self, queue: MessageQueue, expression: str | MessageSelector, offset: int, max_nums: int,
                    block: bool, timeout: float, suspend_ms: int = BLOCK_SUSPEND_MS) -> PullResult:
        if offset < 0:
            raise ValueError("offset must be >= 0")
        if max_nums <= 0:
            raise ValueError("max_nums must be > 0")
        self._topics.add(queue.topic)
        result = await pull(self.instance, self.group, queue, self._sub(queue.topic, expression), offset, max_nums,
                            pull_sys_flag(False, block, True), 0, suspend_ms, timeout,
                            self._broker_ids.get(queue, 0))
        self._broker_ids[queue] = result.suggest_which_broker_id
        return result

    # -- offsets ----------------------------------------------------------------------------------

    async def min_offset(self, queue: MessageQueue) -> int:
        return await queue_offset(self.instance, RequestCode.GET_MIN_OFFSET, queue)

    async def max_offset(self, queue: MessageQueue) -> int:
        """The next offset to be written (one past the last message)."""
        return await queue_offset(self.instance, RequestCode.GET_MAX_OFFSET, queue)

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int | float | None = None) -> int:
        """The first offset whose message was stored at or after timestamp_ms (default: now)."""
        ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        return await queue_offset(self.instance, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, queue, ts)

    async def earliest_msg_store_time(self, queue: MessageQueue) -> int:
        return await queue_offset(self.instance, RequestCode.GET_EARLIEST_MSG_STORETIME, queue)

    async def fetch_consume_offset(self, queue: MessageQueue) -> int:
        """The group's offset the broker keeps for queue (-1 when none)."""
        return await self._offsets.read(queue)

    async def update_consume_offset(self, queue: MessageQueue, offset: int) -> None:
        """Store the group's offset for queue at the broker (acknowledged)."""
        self._offsets.update(queue, offset)
        await self._offsets.persist([queue], acked=True)
