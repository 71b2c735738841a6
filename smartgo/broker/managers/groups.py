"""Subscription groups (RocketMQ's SubscriptionGroupManager): per consumer group, may it consume,
may it broadcast, its retry queues and retry limit.

Owned by the broker actor; persisted on every change to <store>/config/subscriptionGroup.json
as SubscriptionGroupWrapper ({"dataVersion":...,"subscriptionGroupTable":{G: config}}). A
group is created with the defaults when a consumer of it heartbeats or pulls and
auto_create_subscription_group is on (system groups always), or by
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP. A slave replaces the table by its master's (`adopt`,
smartgo.broker.ha.slave_sync).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from smartgo.common.bodies import Fields, parse_body
from smartgo.common.persist import PersistedFile
from smartgo.net import fastjson

FILE = Path("config") / "subscriptionGroup.json"
SYS_GROUP_PREFIX = "CID_RMQ_SYS_"
# SubscriptionGroupManager.init
DEFAULT_GROUPS = ("TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                  "CID_ONSAPI_PULL", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_RMQ_SYS_TRANS")


def is_system_group(name: str) -> bool:
    """MixAll.isSysConsumerGroup, or one of the groups every broker creates."""
    return name.startswith(SYS_GROUP_PREFIX) or name in DEFAULT_GROUPS


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """SubscriptionGroupConfig (4.9)."""
    name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def to_json(self) -> dict:
        return {"brokerId": self.broker_id, "consumeBroadcastEnable": self.consume_broadcast_enable,
                "consumeEnable": self.consume_enable, "consumeFromMinEnable": self.consume_from_min_enable,
                "groupName": self.name, "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
                "retryMaxTimes": self.retry_max_times, "retryQueueNums": self.retry_queue_nums,
                "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly}

    @classmethod
    def from_fields(cls, f: Fields) -> GroupConfig:
        """From a checked JSON object (BodyError names a bad field)."""
        d = cls("")
        cfg = cls(f.text("groupName"), f.flag("consumeEnable", d.consume_enable),
                  f.flag("consumeFromMinEnable", d.consume_from_min_enable),
                  f.flag("consumeBroadcastEnable", d.consume_broadcast_enable),
                  f.integer("retryQueueNums", d.retry_queue_nums), f.integer("retryMaxTimes", d.retry_max_times),
                  f.integer("brokerId", d.broker_id),
                  f.integer("whichBrokerWhenConsumeSlowly", d.which_broker_when_consume_slowly),
                  f.flag("notifyConsumerIdsChangedEnable", d.notify_consumer_ids_changed_enable))
        if not cfg.name.strip():
            raise ValueError(f"{f.body}: groupName is empty")
        if not 0 < cfg.retry_queue_nums <= 1024:
            raise ValueError(f"{f.body}: retryQueueNums must be in 1..1024, got {cfg.retry_queue_nums}")
        return cfg


def parse_group_body(raw: bytes | None) -> GroupConfig:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP's body (BodyError / ValueError name the problem)."""
    return GroupConfig.from_fields(parse_body(raw, "SubscriptionGroupConfig"))


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    """SubscriptionGroupWrapper: the table and its dataVersion - the file, and the body of
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG a slave copies (SlaveSynchronize)."""
    version: int                        # dataVersion.counter
    timestamp: int
    table: dict[str, GroupConfig]

    def wrapper_json(self) -> dict:
        return {"dataVersion": {"counter": self.version, "timestamp": self.timestamp},
                "subscriptionGroupTable": {n: c.to_json() for n, c in sorted(self.table.items())}}

    def encode(self) -> bytes:
        return fastjson.dumps(self.wrapper_json())


def parse_group_snapshot(raw: bytes | None, body: str = "SubscriptionGroupWrapper") -> GroupSnapshot:
    """SubscriptionGroupWrapper JSON (BodyError / ValueError name the problem)."""
    obj = parse_body(raw, body)
    table = {name: GroupConfig.from_fields(Fields(cfg, name, body))
             for name, cfg in obj.obj.get("subscriptionGroupTable", {}).items()}
    version = obj.obj.get("dataVersion") or {}
    return GroupSnapshot(int(version.get("counter", 0)), int(version.get("timestamp", 0)), table)


class SubscriptionGroups:
    def __init__(self, path: Path) -> None:
        self.file = PersistedFile(path)
        self.table: dict[str, GroupConfig] = {}
        self.version = 0
        self.timestamp = 0

    @classmethod
    def load(cls, store_path: Path) -> SubscriptionGroups:
        groups = cls(store_path / FILE)
        saved = groups.file.load(groups._decode, "subscription groups")
        missing = [g for g in DEFAULT_GROUPS if g not in groups.table]
        if saved is None or missing:
            groups.update([GroupConfig(g) for g in missing])
        return groups

    def _decode(self, raw: bytes) -> bool:
        saved = parse_group_snapshot(raw, "subscriptionGroup.json")
        self.table, self.version, self.timestamp = saved.table, saved.version, saved.timestamp
        return True

    def get(self, name: str) -> GroupConfig | None:
        return self.table.get(name)

    def find_or_create(self, name: str, auto_create: bool) -> tuple[GroupConfig | None, bool]:
        """(config, created): the group's config, made with the defaults when missing and
        auto_create is on (system groups always) - findSubscriptionGroupConfig."""
        cfg = self.table.get(name)
        if cfg is not None:
            return cfg, False
        if not (auto_create or name.startswith(SYS_GROUP_PREFIX)):
            return None, False
        cfg = GroupConfig(name)
        self.update([cfg])
        return cfg, True

    def update(self, configs: list[GroupConfig], removed: tuple[str, ...] = ()) -> None:
        for cfg in configs:
            self.table[cfg.name] = cfg
        for name in removed:
            self.table.pop(name, None)
        self.version += 1
        self.timestamp = time.time_ns() // 1_000_000
        self.file.save(self.encode())

    def snapshot(self) -> GroupSnapshot:
        return GroupSnapshot(self.version, self.timestamp, dict(self.table))

    def adopt(self, snap: GroupSnapshot) -> None:
        """Take another broker's table and dataVersion as they are (a slave its master's:
        SlaveSynchronize.syncSubscriptionGroupConfig); persisted before memory changes, so a
        failed write leaves both as they were."""
        self.file.save(snap.encode())
        self.table, self.version, self.timestamp = dict(snap.table), snap.version, snap.timestamp

    def encode(self) -> bytes:
        return self.snapshot().encode()
