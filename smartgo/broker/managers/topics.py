"""The topic table: default topics, the static topics setting, auto-creation, and its snapshot file.

The broker actor owns the table. Every change is written (atomically, the previous copy kept
as topics.json.bak: smartgo.common.persist) to <store-dir>/config/topics.json in RocketMQ's
TopicConfigSerializeWrapper shape, then its dataVersion counter is published on the board
(`broker.topics_version`); net actors reload the file when the counter moves. One file serves
as the snapshot the net actors read, the persisted table a restarted node starts from, and the
body of REGISTER_BROKER.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from smartgo.broker.schedule.schedule_message import HALF_TOPIC, OP_TOPIC
from smartgo.common.persist import PersistedFile
from smartgo.config import ConfigError, NodeConfig
from smartgo.net import fastjson
from smartgo.net.codes import TRACE_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, PermName
from smartgo.store.record import SCHEDULE_TOPIC

DEFAULT_TOPIC = "TBW102"                 # the auto-create template (TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC)
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
BENCHMARK_TOPIC = "BenchmarkTest"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
REPLY_TOPIC_SUFFIX = "_REPLY_TOPIC"      # "_" + MixAll.REPLY_TOPIC_POSTFIX
DLQ_QUEUES = 1                           # MixAll.DLQ_NUMS_PER_GROUP
SNAPSHOT = Path("config") / "topics.json"
RW = PermName.READ | PermName.WRITE
# Queues a topic may have (read and write counts alike). RocketMQ sets no bound and the queue id is an int32 in the
# wire and the store; this one lets a topic of 10,000 queues (issue 47) and more be made, while a typo (1000000)
# cannot make a million queue directories. A board's queue table holds 49,152 queues unless board_queue_capacity
# is raised.
MAX_QUEUES = 65535
# Topics producers may not send to (TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET)
NOT_ALLOWED_SEND = frozenset({SCHEDULE_TOPIC, HALF_TOPIC, OP_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC,
                              "RMQ_SYS_SELF_TEST_TOPIC", OFFSET_MOVED_EVENT})
# TopicValidator.SYSTEM_TOPIC_SET before the broker adds its own (system_topics)
SYSTEM_TOPICS = frozenset({DEFAULT_TOPIC, SCHEDULE_TOPIC, BENCHMARK_TOPIC, HALF_TOPIC, TRACE_TOPIC, OP_TOPIC,
                           TRANS_CHECK_MAX_TIME_TOPIC, SELF_TEST_TOPIC, OFFSET_MOVED_EVENT})


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """common/TopicConfig.java."""
    name: str
    read_queues: int = 16
    write_queues: int = 16
    perm: int = RW
    filter_type: str = "SINGLE_TAG"
    sys_flag: int = 0
    order: bool = False

    @property
    def queue_limit(self) -> int:
        """Queue ids below this are valid (msgCheck: max(read, write))."""
        return max(self.read_queues, self.write_queues)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PermName.WRITE)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PermName.READ)

    def __str__(self) -> str:   # TopicConfig.toString, as Java remarks quote it
        return (f"TopicConfig [topicName={self.name}, readQueueNums={self.read_queues}, "
                f"writeQueueNums={self.write_queues}, perm={perm_string(self.perm)}, "
                f"topicFilterType={self.filter_type}, topicSysFlag={self.sys_flag}, order={str(self.order).lower()}]")

    def to_json(self) -> dict:
        return {"order": self.order, "perm": self.perm, "readQueueNums": self.read_queues,
                "topicFilterType": self.filter_type, "topicName": self.name, "topicSysFlag": self.sys_flag,
                "writeQueueNums": self.write_queues}

    @classmethod
    def from_json(cls, obj: Mapping) -> TopicConfig:
        return cls(obj["topicName"], int(obj.get("readQueueNums", 16)), int(obj.get("writeQueueNums", 16)),
                   int(obj.get("perm", RW)), obj.get("topicFilterType", "SINGLE_TAG"),
                   int(obj.get("topicSysFlag", 0)), bool(obj.get("order", False)))


def perm_string(perm: int) -> str:
    return ("R" if perm & PermName.READ else "-") + ("W" if perm & PermName.WRITE else "-") + \
        ("X" if perm & PermName.INHERIT else "-")


def parse_static_topics(spec: str) -> list[TopicConfig]:
    """The `topics` setting: 'Name:queues[:perm];Other:queues' (',' works as a separator too)."""
    out = []
    for item in spec.replace(",", ";").split(";"):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        try:
            queues = int(parts[1]) if len(parts) > 1 else 8
            perm = int(parts[2]) if len(parts) > 2 else RW
        except ValueError:
            raise ConfigError(f"topics: {item!r} is not Name:queues[:perm]") from None
        if not parts[0] or not 0 < queues <= MAX_QUEUES or len(parts) > 3:
            raise ConfigError(f"topics: {item!r} is not Name:queues[:perm] with 1..{MAX_QUEUES} queues")
        out.append(TopicConfig(parts[0], queues, queues, perm))
    return out


def default_topics(config: NodeConfig) -> list[TopicConfig]:
    """TopicConfigManager's built-in topics, plus the static ones from the settings."""
    topics = [TopicConfig(SELF_TEST_TOPIC, 1, 1),
              TopicConfig(BENCHMARK_TOPIC, 1024, 1024),
              TopicConfig(config.cluster_name, 16, 16, RW | PermName.INHERIT),
              TopicConfig(config.broker_name, 1, 1, RW | PermName.INHERIT),
              TopicConfig(OFFSET_MOVED_EVENT, 1, 1),
              TopicConfig(reply_topic(config.cluster_name), 1, 1)]     # request-reply (MixAll.getReplyTopic)
    if config.auto_create_topic:
        q = config.default_topic_queues
        topics.append(TopicConfig(DEFAULT_TOPIC, q, q, RW | PermName.INHERIT))
    if config.trace_topic_enable:
        topics.append(TopicConfig(config.msg_trace_topic_name, 1, 1))
    return topics + parse_static_topics(config.topics)


def system_topics(config: NodeConfig) -> list[str]:
    """GET_SYSTEM_TOPIC_LIST_FROM_BROKER: TopicValidator's set with the broker's own system
    topics (its cluster's and its own name, its cluster's reply topic)."""
    own = {config.cluster_name, config.broker_name, reply_topic(config.cluster_name)}
    if config.trace_topic_enable:
        own.add(config.msg_trace_topic_name)
    return sorted(SYSTEM_TOPICS | own)


@dataclass(frozen=True, slots=True)
class TopicSnapshot:
    version: int                        # dataVersion.counter
    timestamp: int
    topics: dict[str, TopicConfig]

    def wrapper_json(self) -> dict:
        """TopicConfigSerializeWrapper (also the REGISTER_BROKER body's main part)."""
        return {"dataVersion": {"counter": self.version, "timestamp": self.timestamp},
                "topicConfigTable": {n: c.to_json() for n, c in self.topics.items()}}

    def with_topics(self, changed: Iterable[TopicConfig] = (), removed: Iterable[str] = ()) -> TopicSnapshot:
        """The next version: `changed` added or replaced, `removed` gone."""
        topics = dict(self.topics)
        for c in changed:
            topics[c.name] = c
        for name in removed:
            topics.pop(name, None)
        return TopicSnapshot(self.version + 1, time.time_ns() // 1_000_000, topics)

    def with_perm(self, broker_perm: int) -> TopicSnapshot:
        """What a broker whose brokerPermission lacks read or write registers: every topic with
        the broker's permission (BrokerController.registerBrokerAll)."""
        if broker_perm & RW == RW:
            return self
        return TopicSnapshot(self.version, self.timestamp,
                             {n: replace(c, perm=broker_perm) for n, c in self.topics.items()})


def snapshot_path(store_path: Path) -> Path:
    return store_path / SNAPSHOT


def write_snapshot(store_path: Path, snap: TopicSnapshot) -> None:
    """Atomic replace: a reader (or a restart) sees the old file or the new one, never half."""
    PersistedFile(snapshot_path(store_path)).save(fastjson.dumps(snap.wrapper_json()))


def parse_snapshot(raw: bytes) -> TopicSnapshot:
    obj = fastjson.loads(raw)
    version = obj.get("dataVersion", {})
    table = obj["topicConfigTable"]
    if not isinstance(table, dict):
        raise TypeError("topicConfigTable is not an object")
    topics = {n: replace(TopicConfig.from_json(c), name=n) for n, c in table.items()}
    return TopicSnapshot(int(version.get("counter", 0)), int(version.get("timestamp", 0)), topics)


def read_snapshot(store_path: Path) -> TopicSnapshot | None:
    """The persisted table (its .bak if the file is corrupt), None when there is none."""
    return PersistedFile(snapshot_path(store_path)).load(parse_snapshot, "topic table")


def auto_created(name: str, template: TopicConfig, requested_queues: int, sys_flag: int = 0) -> TopicConfig:
    """createTopicInSendMessageMethod: queues = min(requested, template's write queues); the
    template's perm without INHERIT."""
    queues = max(1, min(requested_queues, template.write_queues))
    return TopicConfig(name, queues, queues, template.perm & ~PermName.INHERIT, sys_flag=sys_flag)


def reply_topic(cluster: str) -> str:
    return cluster + REPLY_TOPIC_SUFFIX
