"""The broker's Prometheus metrics, read from the broker actor's own tables at each scrape.

Names, labels and units are RocketMQ 5.x's (BrokerMetricsManager, DefaultStoreMetricsManager), so
its Grafana dashboards and alert rules apply: every sample carries cluster, node_type="broker" and
node_id=<brokerName>. What 5.x has no name for is `smartgo_*`: request latency, pulls, the disk
watermark and each actor's health, CPU and memory (the per-actor view the supervisor keeps).

Nothing here is counted on the data path: the counters are the stats items the net actors
already report every second (stats.py), so a scrape costs the broker actor, not the net actors,
and counters restart from 0 with the broker actor (Prometheus' rate() expects that).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import psutil

from smartgo.actors.health import CpuSampler, node_health
from smartgo.broker.managers.clients import ClientChannel
from smartgo.broker.managers.groups import is_system_group
from smartgo.broker.net_view import store_backlog
from smartgo.broker.stats.prometheus import Family, Labels
from smartgo.broker.schedule.schedule_message import HALF_TOPIC
from smartgo.broker.schedule.schedule_offsets import DelayOffsetFile
from smartgo.broker.settings import store_config
from smartgo.broker.stats.stats import FINISH_BOUNDS, SIZE_BOUNDS, transaction_counts
from smartgo.broker.stats.stats_items import GROUP_GET_NUMS, GROUP_GET_SIZE, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, StatsItems
from smartgo.broker.managers.topics import system_topics
from smartgo.net.codes import RETRY_GROUP_TOPIC_PREFIX
from smartgo.stats_schema import LATENCY_BOUNDS
from smartgo.store.config import TIMER_FIRST_LEVEL
from smartgo.store.record import SCHEDULE_TOPIC

if TYPE_CHECKING:
    from smartgo.broker.actors.broker_actor import BrokerActor

_BOUNDS_MS = [float(b) for b in LATENCY_BOUNDS if b is not None]
_FINISH_BOUNDS = [float(b) for b in FINISH_BOUNDS]
_SIZE_BOUNDS = [float(b) for b in SIZE_BOUNDS]
_STORAGE = {"storage_type": "local", "storage_medium": "disk"}     # DefaultStoreMetricsConstant's defaults
_CONSUME_MODES = {"CONSUME_ACTIVELY": "pull", "CONSUME_PASSIVELY": "push"}   # ConsumeType.getTypeCN, lower case


class BrokerMetrics:
    """collect() builds every family from the actor's tables; one per broker actor (it keeps the
    psutil handles of the node's processes between scrapes)."""

    def __init__(self, broker: BrokerActor) -> None:
        self.b = broker
        cfg = broker.config
        self.const = {"cluster": cfg.cluster_name, "node_type": "broker", "node_id": cfg.broker_name}
        self.system_topics = frozenset(system_topics(cfg))
        self.sampler = CpuSampler()
        self.schedule_levels = store_config(cfg).delay_levels_ms
        self.delay_offsets = DelayOffsetFile(cfg.store_path)

    def family(self, name: str, kind: str, help_text: str) -> Family:
        return Family(name, kind, help_text, self.const)

    def collect(self) -> list[Family]:
        now_ms = time.time_ns() // 1_000_000
        return [*self._traffic(), *self._lag(now_ms), *self._connections(), *self._broker(),
                *self._transactions(), *self._schedule(), *self._storage(now_ms), *self._latency(),
                *self._actors(), *self._mqtt()]

    def _system(self, topic: str, group: str = "") -> str:
        return _bool(topic in self.system_topics or (bool(group) and is_system_group(group)))

    # ---- messages in and out (the net actors' stats items) ------------------------------------------
    def _traffic(self) -> list[Family]:
        items = self.b.stats.items
        msgs_in = self.family("rocketmq_messages_in_total", "counter", "Messages stored, by topic")
        bytes_in = self.family("rocketmq_throughput_in_total", "counter", "Bytes of messages stored, by topic")
        for family, name in ((msgs_in, TOPIC_PUT_NUMS), (bytes_in, TOPIC_PUT_SIZE)):
            for topic, item in sorted(items.table[name].items()):
                family.add({"topic": topic, "message_type": _message_type(topic),
                            "is_system": self._system(topic)}, item.value)
        msgs_out = self.family("rocketmq_messages_out_total", "counter", "Messages pulled, by topic and group")
        bytes_out = self.family("rocketmq_throughput_out_total", "counter",
                                "Bytes of messages pulled, by topic and group")
        for family, name in ((msgs_out, GROUP_GET_NUMS), (bytes_out, GROUP_GET_SIZE)):
            for key, value in _group_items(items, name):
                family.add(self._group_labels(*key), value)
        dlq = self.family("rocketmq_send_to_dlq_messages_total", "counter",
                          "Messages a consumer sent back that went to its group's DLQ, by original topic and group")
        for (topic, group), n in sorted(self.b.stats.dlq.items()):
            dlq.add({"topic": topic, "consumer_group": group, "is_system": self._system(topic, group)}, n)
        size = self.family("rocketmq_message_size", "histogram",
                           "Bytes of the messages stored, one observation per send request: its average record size")
        for topic, counts in sorted(self.b.stats.sizes.items()):
            size.add_histogram({"topic": topic, "message_type": _message_type(topic), "is_system": self._system(topic)},
                               _SIZE_BOUNDS, counts[:-1], counts[-1])
        pulls = self.family("smartgo_pulls_total", "counter", "Pull requests answered, with messages or without")
        totals = self.b.stats.totals
        pulls.add({"result": "found"}, totals["pulls_found"])
        pulls.add({"result": "missed"}, totals["pulls_missed"])
        relayed = self.family("smartgo_slave_forwarded_requests_total", "counter",
                              "Writes of clients with a stale route (sends, send-backs, transaction ends, offsets) "
                              "this slave passed on to its master, or could not, by request code")
        for (code, result), n in sorted(self.b.stats.forwarded.items()):
            relayed.add({"request_code": str(code), "result": result}, n)
        return [msgs_in, bytes_in, size, msgs_out, bytes_out, dlq, pulls, relayed]

    def _group_labels(self, topic: str, group: str) -> Labels:
        return {"topic": topic, "consumer_group": group, "is_retry": _bool(topic.startswith(RETRY_GROUP_TOPIC_PREFIX)),
                "is_system": self._system(topic, group)}

    # ---- consumer lag (committed offsets against the queues' max offsets) ------------------------------
    def _lag(self, now_ms: int) -> list[Family]:
        """Every committed (topic, group), online or not (a group whose consumers all died keeps
        showing its growing lag; 5.x lists online groups only), and the online groups' subscribed
        topics; a queue without a commit counts 0, as in 5.x's ConsumerLagCalculator."""
        b = self.b
        lag = self.family("rocketmq_consumer_lag_messages", "gauge",
                          "Messages stored and not yet committed by the group (sum over its queues)")
        latency = self.family("rocketmq_consumer_lag_latency", "gauge",
                              "Milliseconds since the oldest message the group has not committed was stored")
        reader = b.view.fresh_reader()
        written = b.view.written.get()
        pairs: dict[tuple[str, str], list[int]] = {}            # (topic, group) -> [lag, oldest store time]
        for topic, group, queue_id, broker_offset, committed in b.queue_lags():
            pair = pairs.setdefault((topic, group), [0, 0])
            if committed < broker_offset:
                pair[0] += broker_offset - committed
                stored = reader.message_store_time(topic, queue_id, committed, broker_offset, written)
                if stored > 0 and (not pair[1] or stored < pair[1]):
                    pair[1] = stored
        for group, info in b.clients.consumers.items():     # online, nothing committed yet: 0, as in 5.x
            for topic in info.subscriptions:
                if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and topic in b.snapshot.topics:
                    pairs.setdefault((topic, group), [0, 0])
        for (topic, group), (behind, oldest) in sorted(pairs.items()):
            labels = self._group_labels(topic, group)
            lag.add(labels, behind)
            latency.add(labels, max(0, now_ms - oldest) if oldest else 0)
        return [lag, latency]

    # ---- clients -----------------------------------------------------------------------------------------
    def _connections(self) -> list[Family]:
        clients = self.b.clients
        prod = self.family("rocketmq_producer_connections", "gauge",
                           "Producer connections, by client language and version (MQVersion ordinal)")
        for (language, version), n in _by_client(ch for chans in clients.producers.values() for ch in chans.values()):
            prod.add({"language": language, "version": version, "protocol_type": "remoting"}, n)
        cons = self.family("rocketmq_consumer_connections", "gauge",
                           "Consumer connections, by group, client language and version (MQVersion ordinal)")
        for group, info in sorted(clients.consumers.items()):
            for (language, version), n in _by_client(info.channels.values()):
                cons.add({"consumer_group": group, "language": language, "version": version,
                          "consume_mode": _CONSUME_MODES.get(info.consume_type, info.consume_type.lower()),
                          "protocol_type": "remoting", "is_system": _bool(is_system_group(group))}, n)
        refused = self.family("smartgo_connections_refused_total", "counter",
                              "Client connections a net actor closed at accept: it held all its open-files "
                              "limit allows (--remoting-connections sizes the node)")
        refused.add({"reason": "open_files"}, self.b.stats.totals["connections_refused"])
        return [prod, cons, refused]

    # ---- the broker's tables and flags -------------------------------------------------------------------
    def gauge(self, name: str, help_text: str, value: float, labels: Labels | None = None) -> Family:
        """A family of one sample."""
        family = self.family(name, "gauge", help_text)
        family.add(labels or {}, value)
        return family

    def _broker(self) -> list[Family]:
        b = self.b
        return [self.gauge("rocketmq_broker_permission", "brokerPermission (2 read, 4 write, 6 both)",
                           b.runtime.config.broker_permission),
                self.gauge("rocketmq_topic_number", "Topics in the broker's table", len(b.snapshot.topics)),
                self.gauge("rocketmq_consumer_group_number", "Subscription groups in the broker's table",
                           len(b.groups.table)),
                self.gauge("smartgo_disk_full", "1 while sends are refused for a full disk (the 90 % watermark)",
                           b.view.disk_full.get()),
                self.gauge("smartgo_broker_role", "1, labelled with the node's role, brokerId and failover epoch "
                                                  "(a new series after a failover changed them)", 1,
                           {"role": b.roles.state.role, "broker_id": str(b.roles.state.broker_id),
                            "epoch": str(b.roles.state.epoch)}),
                self.gauge("smartgo_failover_fenced", "1 while a failover master writes nothing: it waits for "
                                                      "its registry's confirmation, or hands its role over",
                           int(b.roles.fenced))]

    def _storage(self, now_ms: int) -> list[Family]:
        b = self.b
        f = b.board.scalars()
        dispatch_behind, flush_behind = store_backlog(f)
        out = [self.gauge("rocketmq_storage_dispatch_behind_bytes", "CommitLog bytes not yet in the ConsumeQueues",
                          dispatch_behind, _STORAGE),
               self.gauge("rocketmq_storage_flush_behind_bytes", "CommitLog bytes not yet flushed to disk",
                          flush_behind, _STORAGE),
               self.gauge("smartgo_storage_disk_used_ratio", "Used share of the store's disk, as the cleanup "
                                                             "watermarks read it", f["disk.used_permille"] / 1000),
               self.gauge("smartgo_commitlog_min_offset", "First CommitLog offset still kept", f["commitlog.min"]),
               self.gauge("smartgo_commitlog_max_offset", "CommitLog offset written up to", f["commitlog.written"]),
               self.gauge("smartgo_queue_table_queues", "Queues on the board's queue table (sends opening more "
                                                        "than the limit are refused)", b.board.queues.count),
               self.gauge("smartgo_queue_limit", "Queues sends may open: the board's queue table limit (sized at "
                                                 "start)", b.board.queues.limit)]
        try:
            out.append(self.gauge("rocketmq_storage_size", "Bytes used on the store's file system",
                                  psutil.disk_usage(str(b.config.store_path)).used, _STORAGE))
        except OSError:
            pass
        earliest = b.earliest_message_time()
        if earliest > 0:
            out.append(self.gauge("rocketmq_storage_message_reserve_time", "Milliseconds since the oldest message "
                                                                           "kept was stored",
                                  max(0, now_ms - earliest), _STORAGE))
        return out

    # ---- transactions (5.x's initTransactionMetrics) -----------------------------------------------------
    def _transactions(self) -> list[Family]:
        """Commits and rollbacks by the message's topic, as END_TRANSACTION stored them, with the
        seconds from each half's birth (5.x's buckets and unit); the halves the check-back's last
        pass found open, by topic."""
        commits = self.family("rocketmq_commit_messages_total", "counter", "Transactional messages committed")
        rollbacks = self.family("rocketmq_rollback_messages_total", "counter", "Transactional messages rolled back")
        finish = self.family("rocketmq_finish_message_latency", "histogram",
                             "Seconds from a half message's birth to its commit or rollback")
        for topic, counts in sorted(self.b.stats.transactions.items()):
            committed, rolled_back, buckets, seconds = transaction_counts(counts)
            labels = {"topic": topic}
            commits.add(labels, committed)
            rollbacks.add(labels, rolled_back)
            finish.add_histogram(labels, _FINISH_BOUNDS, buckets, seconds)
        half = self.family("rocketmq_half_messages", "gauge",
                           "Half messages not yet committed or rolled back (at the last check-back pass)")
        for topic, n in sorted((+self.b.transactions.open_halves).items()):
            half.add({"topic": topic}, n)
        return [commits, rollbacks, finish, half]

    # ---- delayed and timer messages (the schedule actor's queues) -------------------------------------------
    def _schedule(self) -> list[Family]:
        """Per SCHEDULE_TOPIC_XXXX level that has a queue: its entries past the offset the
        schedule actor last saved (delayOffset.json, at most ~50 ms behind it). 5.x counts its
        timer wheel per topic (rocketmq_timing_messages); the levels are what this broker has."""
        family = self.family("smartgo_schedule_waiting_messages", "gauge",
                             "Delayed and timer messages stored and not yet delivered, by schedule level "
                             "(kind timer: a timer's hops, levels 33 on)")
        state = self.delay_offsets.load()
        delivered = state.offsets if state else {}
        for level, delay_ms in enumerate(self.schedule_levels, 1):
            stored = self.b.view.max_offset(SCHEDULE_TOPIC, level - 1)
            if stored:
                family.add({"level": str(level), "kind": "timer" if level >= TIMER_FIRST_LEVEL else "delay",
                            "delay_ms": str(delay_ms)}, max(0, stored - delivered.get(level, 0)))
        return [family]

    def _latency(self) -> list[Family]:
        family = self.family("smartgo_request_latency_milliseconds", "histogram",
                             "Send and pull requests, arrival (a parked pull: its wake-up) to response")
        for request, hist in (("send", self.b.stats.send), ("pull", self.b.stats.pull)):
            family.add_histogram({"request": request}, _BOUNDS_MS, hist.buckets, hist.sum_ms)
        return [family]

    # ---- the node's processes ------------------------------------------------------------------------------
    def _mqtt(self) -> list[Family]:
        summary = self.b.mqtt.summary()
        return [] if summary is None else mqtt_families(self.family, summary)

    def _actors(self) -> list[Family]:
        health = node_health(self.b.board, self.sampler)
        healthy = self.family("smartgo_node_healthy", "gauge", "1 when the supervisor and every actor are healthy")
        healthy.add({}, int(health["healthy"]))
        up = self.family("smartgo_actor_up", "gauge", "1 when the actor runs, is ready and heartbeats in time")
        restarts = self.family("smartgo_actor_restarts_total", "counter", "Times the supervisor restarted the actor")
        age = self.family("smartgo_actor_heartbeat_age_seconds", "gauge", "Seconds since the actor's last heartbeat")
        mailbox = self.family("smartgo_actor_mailbox_depth", "gauge", "Control messages waiting for the actor")
        lag = self.family("smartgo_actor_loop_lag_seconds", "gauge",
                          "How late the actor's last heartbeat timer fired: its loop's latest gap between turns")
        progress = self.family("smartgo_actor_progress_total", "counter",
                               "Units of work the actor counted (net actors: requests and woken pulls run)")
        cpu = self.family("smartgo_process_cpu_seconds_total", "counter", "CPU time (user + system) of the process")
        rss = self.family("smartgo_process_resident_memory_bytes", "gauge", "Resident memory of the process")
        node = health["node"]
        processes = [("supervisor", node["pid"] if node["state"] != "down" else 0, node["rss_bytes"])]
        for actor in health["actors"]:
            labels = {"actor": actor["name"]}
            up.add(labels, int(actor["healthy"]))
            restarts.add(labels, actor["restarts"])
            if actor["heartbeat_age_s"] is not None:
                age.add(labels, actor["heartbeat_age_s"])
            if actor["mailbox_depth"] is not None:
                mailbox.add(labels, actor["mailbox_depth"])
                lag.add(labels, actor["loop_lag_ms"] / 1000)
                progress.add(labels, actor["progress"])
            processes.append((actor["name"], actor["pid"] or 0, actor["rss_bytes"]))
        for name, pid, resident in processes:
            times = self.sampler.cpu_seconds(pid) if pid else None
            if times is not None:
                cpu.add({"actor": name}, round(times, 3))
            if resident is not None:
                rss.add({"actor": name}, resident)
        return [healthy, up, restarts, age, mailbox, lag, progress, cpu, rss]


#: MqttStats counters -> the event label of smartgo_mqtt_events_total (the messages have their own families).
MQTT_EVENTS = ("connects", "refused", "busy", "auth_failures", "takeovers", "bad_packets", "connect_timeouts",
               "keep_alive_timeouts", "denied", "dropped", "expired", "oversize", "unrouted", "store_failures", "wills")


def mqtt_families(family: Callable[[str, str, str], Family], summary: dict) -> list[Family]:
    """The node's MQTT actors (smartgo.broker.processor.mqtt_processor): gauges as last polled,
    counters since the broker actor started."""
    out = []
    for key, help_text in (("connections", "MQTT network connections open"),
                           ("sessions", "MQTT sessions, connected or waiting for their client"),
                           ("subscriptions", "MQTT subscriptions of every session"),
                           ("retained", "MQTT retained messages (topics with one)")):
        f = family(f"smartgo_mqtt_{key}", "gauge", help_text)
        f.add({}, summary.get(key, 0))
        out.append(f)
    for way, help_text in (("in", "PUBLISH packets from MQTT clients, by QoS"),
                           ("out", "PUBLISH packets to MQTT clients, by QoS")):
        f = family(f"smartgo_mqtt_messages_{way}_total", "counter", help_text)
        for qos, n in enumerate(summary.get(f"messages_{way}") or [0, 0, 0]):
            f.add({"qos": str(qos)}, n)
        out.append(f)
    events = family("smartgo_mqtt_events_total", "counter",
                    "MQTT events: connects, refused CONNECTs (busy: of them, past an actor's connection limit), "
                    "auth failures, takeovers, bad packets, timeouts, "
                    "denied subscriptions, dropped (a full session queue), expired, oversize, unrouted, "
                    "store failures, wills published")
    for key in MQTT_EVENTS:
        events.add({"event": key}, summary.get(key, 0))
    up = family("smartgo_mqtt_actors_answering", "gauge", "MQTT actors whose counters the broker actor read")
    up.add({}, len(summary["answering"]))
    return [*out, events, up]


def _by_client(channels: Iterable[ClientChannel]) -> list[tuple[tuple[str, str], int]]:
    """Connections counted by (language, version), as 5.x's labels write them."""
    return sorted(Counter((ch.language_name.lower(), str(ch.version)) for ch in channels).items())


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _message_type(topic: str) -> str:
    """5.x's message_type label, from what the stats know: the topic a message was stored under.
    A delayed message is stored under SCHEDULE_TOPIC_XXXX, a transaction's half under the half
    topic; FIFO is a producer's choice of queue, invisible here, so it counts as normal."""
    if topic == SCHEDULE_TOPIC:
        return "delay"
    if topic == HALF_TOPIC:
        return "transaction"
    return "normal"


def _group_items(items: StatsItems, name: str) -> list[tuple[tuple[str, str], int]]:
    """((topic, group), value) of a topic@group item; topic names cannot hold '@' (TopicValidator)."""
    out = []
    for key, item in items.table[name].items():
        topic, _, group = key.partition("@")
        out.append(((topic, group), item.value))
    return sorted(out)
