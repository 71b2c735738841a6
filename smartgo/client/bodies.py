"""Admin response bodies as Java brokers write them with fastjson, which puts objects in key
position for maps keyed by MessageQueue (TopicStatsTable, ConsumeStats; facts D) and leaves
integer keys unquoted. `loads` reads all of that; MessageQueue-shaped keys become MessageQueue."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from smartgo.client.message import MessageQueue
from smartgo.net import fastjson


def _key(key: Any) -> Any:
    """MessageQueue-shaped keys become MessageQueue."""
    if isinstance(key, dict) and {"topic", "brokerName", "queueId"} <= key.keys():
        return MessageQueue.from_json(key)
    return fastjson.hashable(key)


def loads(data: bytes | str) -> Any:
    """Parse a fastjson body; ValueError when it is not one."""
    return fastjson.loads_keyed(data, _key)


@dataclass(slots=True)
class QueueStatus:
    queue: MessageQueue
    min_offset: int
    max_offset: int
    last_update_timestamp: int = 0

    def to_json(self) -> dict:
        return {"broker_name": self.queue.broker_name, "queue_id": self.queue.queue_id,
                "min_offset": self.min_offset, "max_offset": self.max_offset,
                "last_update_timestamp": self.last_update_timestamp}


@dataclass(slots=True)
class QueueProgress:
    queue: MessageQueue
    broker_offset: int
    consumer_offset: int
    last_timestamp: int = 0

    @property
    def lag(self) -> int:
        return max(0, self.broker_offset - self.consumer_offset)

    def to_json(self) -> dict:
        return {"topic": self.queue.topic, "broker_name": self.queue.broker_name, "queue_id": self.queue.queue_id,
                "broker_offset": self.broker_offset, "consumer_offset": self.consumer_offset, "lag": self.lag,
                "last_timestamp": self.last_timestamp}


@dataclass(slots=True)
class ConsumeStats:
    queues: list[QueueProgress] = field(default_factory=list)
    consume_tps: float = 0.0

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)


def _queue_map(obj: Any, what: str) -> dict:
    table = obj.get("offsetTable") if isinstance(obj, dict) else None
    if not isinstance(table, dict) or not all(isinstance(k, MessageQueue) for k in table):
        raise ValueError(f"{what}: offsetTable is not a map keyed by message queues")
    return table


def parse_reset_offsets(data: bytes) -> dict[MessageQueue, int]:
    """ResetOffsetBody: {"offsetTable": {MessageQueue: offset}} (INVOKE_BROKER_TO_RESET_OFFSET's answer,
    RESET_CONSUMER_CLIENT_OFFSET's body)."""
    return {mq: int(offset) for mq, offset in _queue_map(loads(data), "reset offsets").items()}


def parse_topic_stats(data: bytes) -> list[QueueStatus]:
    """TopicStatsTable: {"offsetTable": {MessageQueue: {minOffset, maxOffset, lastUpdateTimestamp}}}."""
    table = _queue_map(loads(data), "topic stats")
    return sorted((QueueStatus(mq, int(v["minOffset"]), int(v["maxOffset"]), int(v.get("lastUpdateTimestamp", 0)))
                   for mq, v in table.items()), key=lambda s: s.queue)


def parse_consume_stats(data: bytes) -> ConsumeStats:
    """ConsumeStats: {"consumeTps": x, "offsetTable": {MessageQueue: {brokerOffset, consumerOffset,
    lastTimestamp}}}."""
    return _consume_stats(loads(data))


def _consume_stats(obj: Any) -> ConsumeStats:
    table = _queue_map(obj, "consume stats")
    queues = sorted((QueueProgress(mq, int(v["brokerOffset"]), int(v["consumerOffset"]), int(v.get("lastTimestamp", 0)))
                     for mq, v in table.items()), key=lambda q: q.queue)
    return ConsumeStats(queues, float(obj.get("consumeTps", 0.0)))


@dataclass(slots=True)
class BrokerConsumeStats:
    """ConsumeStatsList (GET_BROKER_CONSUME_STATS): per group, a ConsumeStats per topic."""
    broker_addr: str
    groups: dict[str, list[ConsumeStats]]
    total_diff: int


def parse_broker_consume_stats(data: bytes) -> BrokerConsumeStats:
    obj = loads(data)
    groups: dict[str, list[ConsumeStats]] = {}
    for entry in obj["consumeStatsList"]:
        for group, stats in entry.items():
            groups.setdefault(str(group), []).extend(_consume_stats(s) for s in stats)
    return BrokerConsumeStats(str(obj.get("brokerAddr", "")), groups, int(obj.get("totalDiff", 0)))


@dataclass(frozen=True, slots=True)
class StatsFigures:
    """BrokerStatsItem: a stats item over one window (the last minute, hour or day)."""
    sum: int
    tps: float
    avgpt: float


@dataclass(frozen=True, slots=True)
class BrokerStats:
    """BrokerStatsData (VIEW_BROKER_STATS_DATA)."""
    minute: StatsFigures
    hour: StatsFigures
    day: StatsFigures

    @property
    def day_sum(self) -> int:
        """mqadmin statsAll's compute24HourSum: the day's sum, else the hour's, else the minute's
        (a young item has no day or hour sample yet)."""
        return self.day.sum or self.hour.sum or self.minute.sum

    def to_json(self) -> dict:
        return {name: {"sum": f.sum, "tps": f.tps, "avgpt": f.avgpt}
                for name, f in (("minute", self.minute), ("hour", self.hour), ("day", self.day))}


def parse_broker_stats(data: bytes) -> BrokerStats:
    obj = loads(data)

    def figures(name: str) -> StatsFigures:
        f = obj[name]
        return StatsFigures(int(f["sum"]), float(f["tps"]), float(f["avgpt"]))
    return BrokerStats(figures("statsMinute"), figures("statsHour"), figures("statsDay"))


@dataclass(frozen=True, slots=True)
class QueueTimeSpan:
    """QUERY_CONSUME_TIME_SPAN: store times (ms, -1 for none) of a queue's first and last message
    and of the group's last consumed one, and how long its next message has waited."""
    queue: MessageQueue
    min_timestamp: int
    max_timestamp: int
    consume_timestamp: int
    delay_ms: int

    def to_json(self) -> dict:
        return {"topic": self.queue.topic, "broker_name": self.queue.broker_name, "queue_id": self.queue.queue_id,
                "min_timestamp": self.min_timestamp, "max_timestamp": self.max_timestamp,
                "consume_timestamp": self.consume_timestamp, "delay_ms": self.delay_ms}


def parse_time_spans(data: bytes) -> list[QueueTimeSpan]:
    return [QueueTimeSpan(MessageQueue.from_json(s["messageQueue"]), int(s["minTimeStamp"]), int(s["maxTimeStamp"]),
                          int(s["consumeTimeStamp"]), int(s["delayTime"]))
            for s in loads(data)["consumeTimeSpanSet"]]


def parse_client_offsets(data: bytes) -> dict[str, dict[MessageQueue, int]]:
    """GetConsumerStatusBody's consumerTable: each client's offsets."""
    table = loads(data)["consumerTable"]
    return {str(cid): dict(sorted((mq, int(o)) for mq, o in _queue_map({"offsetTable": qs}, cid).items()))
            for cid, qs in table.items()}


@dataclass(frozen=True, slots=True)
class AclVersion:
    """GET_BROKER_CLUSTER_ACL_INFO (4.x's ClusterAclVersionInfo): a broker's ACL files with each
    one's dataVersion, (counter, timestamp ms)."""
    cluster: str
    broker_name: str
    broker_addr: str
    files: dict[str, tuple[int, int]]

    def to_json(self) -> dict:
        return {"cluster": self.cluster, "broker_name": self.broker_name, "broker_addr": self.broker_addr,
                "files": {path: {"counter": c, "timestamp": t} for path, (c, t) in sorted(self.files.items())}}


def parse_acl_version(ext: dict[str, str]) -> AclVersion:
    """From GetBrokerAclConfigResponseHeader; a 4.9.2- broker sends only "version" (no file names)."""
    def version(v: Any) -> tuple[int, int]:
        return int(v.get("counter", 0)), int(v.get("timestamp", 0))
    files = ({str(path): version(v) for path, v in loads(ext["allAclFileVersion"]).items()}
             if ext.get("allAclFileVersion") else {"": version(loads(ext["version"]))})
    return AclVersion(ext["clusterName"], ext["brokerName"], ext["brokerAddr"], files)

