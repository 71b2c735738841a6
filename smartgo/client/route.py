"""Topic routes from the registry (TopicRouteData, facts D) and what the client derives from
them: the write queues a producer picks from (TopicPublishInfo) and the read queues consumers
share (subscribe queues)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from smartgo.client.fault import LatencyFaultTolerance
from smartgo.client.message import MessageQueue
from smartgo.net import fastjson
from smartgo.net.codes import PermName
from smartgo.net.route_data import BrokerData, QueueData
from smartgo.store.java_hash import java_hash


def order_conf(text: str) -> dict[str, int]:
    """An ordered topic's "broker-a:8;broker-b:8" (the registries' ORDER_TOPIC_CONFIG): write
    queues per broker name, in its order; unreadable items are passed over."""
    out = {}
    for item in text.split(";"):
        name, _, nums = item.partition(":")
        if name and nums.strip().isdigit():
            out[name] = int(nums)
    return out


@dataclass(slots=True)
class TopicRouteData:
    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    order_topic_conf: str | None = None
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, body: bytes | str) -> TopicRouteData:
        """Parse a route body (standard JSON or fastjson's unquoted integer keys). ValueError on
        anything that is not a route."""
        obj = fastjson.loads(body)
        try:
            queues = [QueueData.from_json(q) for q in obj.get("queueDatas") or []]
            brokers = [BrokerData.from_json(b) for b in obj.get("brokerDatas") or []]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed topic route data: {exc!r}") from None
        return cls(queues, brokers, obj.get("orderTopicConf"), obj)

    def to_json(self) -> dict:
        return {"brokerDatas": [b.to_json() for b in self.broker_datas],
                "queueDatas": [q.to_json() for q in self.queue_datas],
                **({"orderTopicConf": self.order_topic_conf} if self.order_topic_conf else {})}

    def addrs(self) -> set[str]:
        """Every broker address the route names, masters and slaves."""
        return {addr for b in self.broker_datas for addr in b.broker_addrs.values()}

    def broker(self, name: str) -> BrokerData | None:
        for b in self.broker_datas:
            if b.broker_name == name:
                return b
        return None

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """Writable queues on brokers with a master (topicRouteData2TopicPublishInfo). An ordered
        topic's "broker:n;broker:n" config wins over the queue data."""
        if self.order_topic_conf:
            return [MessageQueue(topic, name, i) for name, nums in order_conf(self.order_topic_conf).items()
                    for i in range(nums)]
        out = []
        for q in sorted(self.queue_datas, key=lambda q: q.broker_name):
            b = self.broker(q.broker_name)
            if q.perm & PermName.WRITE and b is not None and b.master_addr:
                out += [MessageQueue(topic, q.broker_name, i) for i in range(q.write_queue_nums)]
        return out

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues (topicRouteData2TopicSubscribeInfo), sorted."""
        return sorted(MessageQueue(topic, q.broker_name, i) for q in self.queue_datas
                      if q.perm & PermName.READ for i in range(q.read_queue_nums))

    def as_default_route(self, queue_nums: int) -> TopicRouteData:
        """TBW102's route trimmed for a topic the broker will auto-create: every queue count
        becomes min(queue_nums, the template's read queues)."""
        queues = [QueueData(q.broker_name, min(queue_nums, q.read_queue_nums), min(queue_nums, q.read_queue_nums),
                            q.perm, q.topic_sys_flag) for q in self.queue_datas]
        return TopicRouteData(queues, self.broker_datas, None, {})


class TopicPublishInfo:
    """A topic's write queues and the producer's queue choice over them."""

    __slots__ = ("topic", "route", "queues", "from_default", "_index")

    def __init__(self, topic: str, route: TopicRouteData, from_default: bool = False) -> None:
        self.topic = topic
        self.route = route
        self.queues = route.publish_queues(topic)
        self.from_default = from_default
        self._index = random.randrange(1 << 16)

    @property
    def ok(self) -> bool:
        return bool(self.queues)

    def _next(self) -> int:
        self._index += 1
        return self._index

    def select(self, last_broker: str | None = None, fault: LatencyFaultTolerance | None = None) -> MessageQueue:
        """The next queue round-robin, avoiding the broker that just failed (last_broker) and,
        with fault tolerance, brokers still being avoided (MQFaultStrategy.selectOneMessageQueue)."""
        queues = self.queues
        n = len(queues)
        if fault is not None and fault.enabled:
            start = self._next()
            fallback = None
            for i in range(n):
                mq = queues[(start + i) % n]
                if fault.is_available(mq.broker_name):
                    if mq.broker_name != last_broker:
                        return mq
                    fallback = fallback or mq
            if fallback is not None and len({q.broker_name for q in queues}) == 1:
                return fallback
            worst_best = fault.pick_one_at_least()
            if worst_best is not None and worst_best != last_broker:
                nums = sum(1 for q in queues if q.broker_name == worst_best)
                if nums:
                    return MessageQueue(self.topic, worst_best, self._next() % nums)
                fault.remove(worst_best)
        start = self._next()
        for i in range(n):
            mq = queues[(start + i) % n]
            if mq.broker_name != last_broker:
                return mq
        return queues[start % n]


QueueSelector = Callable[[Sequence[MessageQueue], object], MessageQueue]


def select_by_hash(queues: Sequence[MessageQueue], key: object) -> MessageQueue:
    """SelectMessageQueueByHash: the same key always maps to the same queue (for a fixed queue
    count). Strings hash like Java's String.hashCode, so Java and Python producers agree."""
    if isinstance(key, int):
        h = ((key & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000
    else:
        h = java_hash(str(key))
    value = abs(int(_java_rem(h, len(queues))))
    return queues[value]


def select_random(queues: Sequence[MessageQueue], key: object) -> MessageQueue:
    return random.choice(queues)


def _java_rem(a: int, b: int) -> int:
    """Java's % (truncated towards zero)."""
    r = abs(a) % b
    return -r if a < 0 else r

