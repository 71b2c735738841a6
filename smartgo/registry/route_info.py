"""The registry's routing tables (RocketMQ's RouteInfoManager, the seed's Registry chapter 4.2).

  TopicQueueTable   topic -> brokerName -> QueueData      (queue counts and perm per master)
  BrokerAddrTable   brokerName -> BrokerData              (cluster, brokerId -> address)
  ClusterAddrTable  clusterName -> {brokerName}
  BrokerLiveTable   brokerAddr -> BrokerLiveInfo          (last heard, DataVersion, connection)

Plain in-memory state owned by one event loop, so no locks. Every method either completes or
changes nothing: callers validate input (bodies.py) before calling. `version` increases on every
change so readers can cache derived answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from smartgo.net.codes import MASTER_ID, PermName
from smartgo.net.route_data import BrokerData, QueueData

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DataVersion:
    """A broker's topic-config version; the registry only compares it for equality."""

    timestamp: int = 0
    counter: int = 0


@dataclass(frozen=True, slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PermName.READ | PermName.WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False


@dataclass(frozen=True, slots=True)
class RegisterBrokerBody:
    data_version: DataVersion
    topic_configs: dict[str, TopicConfig]
    filter_server_list: list[str] = field(default_factory=list)


@dataclass(slots=True)
class BrokerLiveInfo:
    last_update: float
    data_version: DataVersion
    channel: object          # the connection it registered on (closing it removes the broker)
    ha_server_addr: str


@dataclass(slots=True)
class RegisterResult:
    """Filled for slaves only: where their master and its HA port are."""

    master_addr: str | None = None
    ha_server_addr: str | None = None


@dataclass(slots=True)
class TopicRoute:
    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    filter_server_table: dict[str, list[str]]


class RouteInfoManager:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}
        self.filter_server_table: dict[str, list[str]] = {}
        self.wiped: set[str] = set()        # broker names whose write perm an operator wiped
        self.version = 0

    # -- broker registration --------------------------------------------------------------------

    def register_broker(self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int,
                        ha_server_addr: str, body: RegisterBrokerBody, channel: object) -> RegisterResult:
        """Queue data is taken from masters only, and only on their first registration or when
        their DataVersion changed. Topics missing from the body are kept: 4.x brokers send only the
        changed topic when one is created (registerIncrementBrokerData)."""
        self.version += 1
        self.cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)
        broker = self.broker_addr_table.get(broker_name)
        first = broker is None
        if broker is None:
            broker = self.broker_addr_table[broker_name] = BrokerData(cluster_name, broker_name, {})
        addrs = broker.broker_addrs
        # One address holds one id: a slave promoted to master moves from <1, addr> to <0, addr>.
        for other_id in [i for i, a in addrs.items() if a == broker_addr and i != broker_id]:
            del addrs[other_id]
        first = addrs.get(broker_id) is None or first
        addrs[broker_id] = broker_addr
        if broker_id == MASTER_ID and (first or self.is_broker_topic_config_changed(broker_addr, body.data_version)):
            for config in body.topic_configs.values():
                self._update_queue_data(broker_name, config)
        self.broker_live_table[broker_addr] = BrokerLiveInfo(self.clock(), body.data_version, channel,
                                                             ha_server_addr)
        if body.filter_server_list:
            self.filter_server_table[broker_addr] = list(body.filter_server_list)
        else:
            self.filter_server_table.pop(broker_addr, None)
        result = RegisterResult()
        if broker_id != MASTER_ID:
            master_addr = addrs.get(MASTER_ID)
            master = self.broker_live_table.get(master_addr) if master_addr else None
            if master is not None:
                result.master_addr = master_addr
                result.ha_server_addr = master.ha_server_addr
        return result

    def _update_queue_data(self, broker_name: str, config: TopicConfig) -> None:
        queues = self.topic_queue_table.setdefault(config.topic_name, {})
        perm = config.perm & ~PermName.WRITE if broker_name in self.wiped else config.perm
        new = QueueData(broker_name, config.read_queue_nums, config.write_queue_nums, perm, config.topic_sys_flag)
        old = queues.get(broker_name)
        if old != new:
            if old is None:
                log.info("new topic registered: %s %s", config.topic_name, new)
            else:
                log.info("topic changed: %s from %s to %s", config.topic_name, old, new)
            queues[broker_name] = new

    def is_broker_topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        live = self.broker_live_table.get(broker_addr)
        return live is None or live.data_version != data_version

    def query_broker_topic_config(self, broker_addr: str) -> DataVersion | None:
        live = self.broker_live_table.get(broker_addr)
        return live.data_version if live is not None else None

    def update_broker_info_update_timestamp(self, broker_addr: str) -> None:
        live = self.broker_live_table.get(broker_addr)
        if live is not None:
            live.last_update = self.clock()

    def unregister_broker(self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int) -> None:
        self.version += 1
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        broker = self.broker_addr_table.get(broker_name)
        if broker is not None and broker.broker_addrs.get(broker_id) == broker_addr:
            del broker.broker_addrs[broker_id]
            log.info("unregistered broker %s[%d] %s", broker_name, broker_id, broker_addr)
            if broker_id == MASTER_ID:
                self._unwipe(broker_name)
            if not broker.broker_addrs:
                self._remove_broker_name(broker_name)

    def _remove_broker_name(self, broker_name: str) -> None:
        """The last address of broker_name is gone: forget the name, its cluster membership and queues."""
        self.broker_addr_table.pop(broker_name, None)
        for cluster, names in list(self.cluster_addr_table.items()):
            names.discard(broker_name)
            if not names:
                del self.cluster_addr_table[cluster]
        for topic, queues in list(self.topic_queue_table.items()):
            if queues.pop(broker_name, None) is not None and not queues:
                del self.topic_queue_table[topic]
                log.info("topic %s removed with its last broker %s", topic, broker_name)

    # -- liveness -------------------------------------------------------------------------------

    def on_channel_destroy(self, channel: object) -> str | None:
        """The connection a broker registered on closed: drop that broker at once."""
        for addr, live in self.broker_live_table.items():
            if live.channel is channel:
                self._drop_address(addr)
                return addr
        return None

    def scan_not_active_brokers(self, expiry: float) -> list[tuple[str, object]]:
        """Drop brokers not heard from for `expiry` seconds; returns (address, connection) pairs so
        the caller can close those connections."""
        now = self.clock()
        expired = [(addr, live.channel) for addr, live in self.broker_live_table.items()
                   if live.last_update + expiry < now]
        for addr, _channel in expired:
            log.warning("broker %s expired: not heard from for more than %g s", addr, expiry)
            self._drop_address(addr)
        return expired

    def _drop_address(self, broker_addr: str) -> None:
        self.version += 1
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        for name, broker in list(self.broker_addr_table.items()):
            ids = [i for i, a in broker.broker_addrs.items() if a == broker_addr]
            if not ids:
                continue
            for i in ids:
                del broker.broker_addrs[i]
            if MASTER_ID in ids:
                self._unwipe(name)
            if not broker.broker_addrs:
                self._remove_broker_name(name)

    # -- queries --------------------------------------------------------------------------------

    def pickup_topic_route(self, topic: str) -> TopicRoute | None:
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return None
        brokers = [self.broker_addr_table[name] for name in queues if name in self.broker_addr_table]
        if not brokers:
            return None
        filters = {addr: self.filter_server_table[addr] for broker in brokers
                   for addr in broker.broker_addrs.values() if addr in self.filter_server_table}
        return TopicRoute(list(queues.values()), brokers, filters)

    def all_topics(self) -> list[str]:
        return list(self.topic_queue_table)

    def topics_by_cluster(self, cluster_name: str) -> list[str]:
        names = self.cluster_addr_table.get(cluster_name, set())
        return [topic for topic, queues in self.topic_queue_table.items() if not names.isdisjoint(queues)]

    # -- admin ----------------------------------------------------------------------------------

    def wipe_write_perm_of_broker(self, broker_name: str) -> int:
        """Clear WRITE on every topic of broker_name, so that producers move away before
        maintenance; the number of topics. The wipe holds for what the broker registers later,
        until add_write_perm_of_broker or its master's restart (4.x's holds only until the
        broker's next topic change)."""
        self.wiped.add(broker_name)
        return self._set_write_perm(broker_name, lambda perm: perm & ~PermName.WRITE)

    def add_write_perm_of_broker(self, broker_name: str) -> int:
        """Undo a wipe: READ | WRITE on every topic of broker_name (4.x's 327 sets exactly that)."""
        self.wiped.discard(broker_name)
        return self._set_write_perm(broker_name, lambda perm: PermName.READ | PermName.WRITE)

    def _set_write_perm(self, broker_name: str, change: Callable[[int], int]) -> int:
        count = 0
        for queues in self.topic_queue_table.values():
            queue = queues.get(broker_name)
            if queue is not None:
                queue.perm = change(queue.perm)
                count += 1
        self.version += 1
        return count

    def _unwipe(self, broker_name: str) -> None:
        """Its master is gone (a restart, say): it registers writable again, as with 4.x."""
        if broker_name in self.wiped:
            self.wiped.discard(broker_name)
            log.info("broker %s: its write perm, wiped, comes back with its master's next registration", broker_name)

    def delete_topic(self, topic: str, cluster_name: str | None = None) -> None:
        """Forget topic (only its queues on cluster_name's brokers when given)."""
        self.version += 1
        if not cluster_name:
            self.topic_queue_table.pop(topic, None)
            return
        queues = self.topic_queue_table.get(topic)
        if queues is None:
            return
        for name in self.cluster_addr_table.get(cluster_name, set()):
            queues.pop(name, None)
        if not queues:
            del self.topic_queue_table[topic]
