"""The broker actor: the control plane, single owner of the broker's metadata.

It owns the topic table (topics.py: default topics, the `topics` setting, auto-creation through
TBW102, admin changes), the subscription groups (groups.py), the consumer offsets (offsets.py),
the client connections (clients.py) and the consumer groups' members (members.py), the orderly
consumers' queue locks (locks.py), the settings changeable at runtime (broker_config.py) and the
statistics (stats.py, stats_files.py). It persists them (persist.py: atomic files with a .bak under
<store>/config/), registers the topic table with every registry (at start, at once on every
change, every register_interval) and hands the net actors what they need without a round trip
per request:

- topics: the snapshot file config/topics.json plus its version on the board
  (`broker.topics_version`); net actors reload it when the version moves;
- groups: each group's pull-visible state (config, message model, subscriptions) is sent to
  every net actor as a channel event when it changes ("group"), and the whole table to a net
  actor that asks ("want_state" -> "groups"), with the settings net actors use ("config");
- brokerPermission: board flags `flag.read_only` and `flag.unreadable`.

Requests reach it through the request channel (smartgo.broker.channel): whole remoting
requests whose code is in FORWARDED_CODES (the CODES tables of the PROCESSORS: client_processor.py,
admin_processor.py, ...), the calls create_topic and push_reply (request-reply: reply_processor.py),
and events from the net actors (offsets, stats, conn_closed, touch, want_state, group_seen). To serve a
new code: add it to a processor's CODES (a new processor class joins PROCESSORS); the net actors
forward it from then on.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator, Sequence
from datetime import date
from typing import Any

from smartgo.actors.actor import Actor, ActorContext
from smartgo.actors.board import NodeState
from smartgo.actors.health import CpuSampler
from smartgo.actors.ring import CONSUMER, PRODUCER, Doorbell
from smartgo.broker.processor.acl_processor import AclProcessor
from smartgo.broker.processor.admin_processor import AdminProcessor
from smartgo.broker.bells import bell_path
from smartgo.broker.ha.role_manager import RoleManager
from smartgo.broker.broker_config import RuntimeConfig
from smartgo.broker.channel import ChannelServer, handlers
from smartgo.broker.processor.client_processor import ClientProcessor
from smartgo.broker.processor.cleanup_processor import CleanupProcessor
from smartgo.broker.processor.mqtt_processor import MqttProcessor
from smartgo.broker.managers.clients import Changes, ClientTable, registered
from smartgo.broker.managers.groups import SubscriptionGroups
from smartgo.broker.managers.locks import RebalanceLocks
from smartgo.broker.managers.members import PERSIST_INTERVAL, MemberFile
from smartgo.broker.stats.metrics import BrokerMetrics
from smartgo.broker.stats.metrics_http import MetricsServer
from smartgo.broker.net_view import NetView
from smartgo.broker.managers.notices import ConsumerNotices
from smartgo.broker.managers.offsets import ConsumerOffsets
from smartgo.broker.registration import BrokerIdentity, Registrar
from smartgo.broker.processor.reply_processor import push_reply
from smartgo.broker.transaction.transaction_check import TransactionChecker
from smartgo.broker.rings import CTL_RING_CAPACITY
from smartgo.broker.ha.slave_sync import Changed, MasterState, apply_state, run_slave_sync
from smartgo.broker.ha.ha_client import master_file
from smartgo.broker.settings import broker_addr, commitlog_writer, ha_addr, is_slave, registry_addrs, store_config
from smartgo.broker.processor.progress_processor import ProgressProcessor
from smartgo.broker.stats.prometheus import render
from smartgo.broker.stats.stats import FLUSH_INTERVAL, StatsBook, minute_sample_ms, window_seconds
from smartgo.broker.stats.stats_files import StatsFiles
from smartgo.broker.managers.subscriptions import GroupState
from smartgo.broker.managers.topics import (DEFAULT_TOPIC, TopicConfig, TopicSnapshot, auto_created, default_topics,
                                            parse_static_topics, read_snapshot, write_snapshot)
from smartgo.common.acl_sign import node_client
from smartgo.net.codes import FLAG_ONEWAY, PermName, RequestCode
from smartgo.net.command import RemotingCommand
from smartgo.store import StoreReader
from smartgo.store.record import store_timestamp_at

#: The broker actor's processors; each class's CODES table names the requests it serves.
PROCESSORS = (ClientProcessor, AdminProcessor, ProgressProcessor, AclProcessor, RoleManager, CleanupProcessor,
              MqttProcessor)
#: Remoting request codes the net actors hand to the broker actor whole: every code of those tables.
FORWARDED_CODES = frozenset(code for processor in PROCESSORS for code in processor.CODES)
#: Forwarded codes the broker actor answers only after asking clients (up to CALL_CLIENT_TIMEOUT).
RELAYED_CODES = frozenset({RequestCode.GET_CONSUMER_RUNNING_INFO, RequestCode.CONSUME_MESSAGE_DIRECTLY,
                           RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS})
STATS_GRACE_MS = int(FLUSH_INTERVAL * 1000) + 500      # a window is written this long after its end


class BrokerActor(Actor):
    def __init__(self, ctx: ActorContext, *, nets: list[str]) -> None:
        super().__init__(ctx)
        self.nets = nets
        cfg = ctx.config
        self._register_task: asyncio.Task | None = None
        self._catch_up: asyncio.Task | None = None          # registering with the registries that lost us
        self._register_waiters: list[asyncio.Future] = []   # wait for the next round to finish
        self._noted_master: str | None = None               # a slave: the HA address in <run>/ha_master
        self._forwarding_to: str | None = None              # a slave: the master address its net actors have
        self.metrics: MetricsServer | None = None            # the Prometheus endpoint, when metrics_port is set
        self.every(cfg.register_interval, self.register_soon, "register")
        self.every(cfg.offset_persist_interval, self.persist_offsets, "persist offsets")
        self.every(cfg.client_scan_interval, self.scan_clients, "scan clients")
        self.every(PERSIST_INTERVAL, self.persist_members, "persist members")
        self.every(1.0, self.sample_stats, "sample stats")
        self.mqtt = MqttProcessor(self)                     # the node's MQTT actors, asked over their sockets
        self.every(1.0, self.mqtt.poll, "poll mqtt")
        if not is_slave(cfg):                               # a slave stores nothing of its own
            self.every(cfg.transaction_check_interval, self.check_transactions, "transaction check")
        self.every(min(1.0, cfg.register_interval), self.register_early, "register early")

    async def start(self) -> None:
        cfg = self.config
        store = cfg.store_path
        board = self.board
        self.runtime = RuntimeConfig(cfg, store)
        self.version = board.scalar("broker.topics_version", writer=self.name)
        self.read_only = board.scalar("flag.read_only", writer=self.name)
        self.unreadable = board.scalar("flag.unreadable", writer=self.name)
        self.fenced = board.scalar("failover.fenced", writer=self.name)
        self.ha_connected = board.scalar("ha.connected")
        self.snapshot = self._load_topics()
        self.version.set(self.snapshot.version)
        self.roles = RoleManager(self)
        self.roles.start()
        self.publish_permission()
        self.groups = SubscriptionGroups.load(store)
        self.offsets = ConsumerOffsets.load(store)
        self.clients = ClientTable(cfg.client_expiry)
        self.notices = ConsumerNotices(self._notify_consumers)
        self.node_state = board.scalar("node.state")
        self.members = MemberFile(store)
        self._restore_members(cfg.presumed_member_ttl)
        self.locks = RebalanceLocks(cfg.queue_lock_lease)
        self.view = NetView(board, store, StoreReader(store_config(cfg)))
        self.transactions = TransactionChecker(self)
        self.cpu_sampler = CpuSampler()
        self.stats_files = StatsFiles(store / "stats", cfg.stats_max_bytes)
        self.stats = StatsBook(window_seconds(cfg), _now_ms(), self.stats_files.last_ts(), cfg.cluster_name,
                               time.monotonic(), minute_sample_ms(cfg))
        self._day = date.today()
        self._morning = self._yesterday = (0, 0)
        self.identity: dict[str, Any] = {"cluster": cfg.cluster_name, "broker": cfg.broker_name,
                                         "broker_id": cfg.broker_id, "addr": broker_addr(cfg)}
        self.published: dict[str, list | None] = {}     # group -> the state the net actors have
        for name in set(self.groups.table) | set(self.clients.consumers):
            self.published[name] = self.group_state(name)
        self.channel = ChannelServer(
            {net: self.ring(f"ctl.{net}", CONSUMER, CTL_RING_CAPACITY) for net in self.nets},
            {net: self.ring(f"ctlr.{net}", PRODUCER, CTL_RING_CAPACITY) for net in self.nets})
        self.channel.calls["create_topic"] = self.create_topic
        self.channel.calls["push_reply"] = lambda net, args: push_reply(self, net, args)
        self.channel.events.update({"offsets": self._on_offsets, "stats": self._on_stats,
                                    "conn_closed": self._on_conn_closed, "touch": self._on_touch,
                                    "want_state": self._on_want_state,
                                    "group_seen": self._on_group_seen})
        self.channel.processors.update(self._processors())
        self.spawn(self.channel.run(self.bell), "channel")
        self.spawn(self._write_stats(), "stats files")
        self.registrar = Registrar(BrokerIdentity(cfg.cluster_name, cfg.broker_name, broker_addr(cfg), ha_addr(cfg),
                                                  cfg.broker_id), registry_addrs(cfg), node_client(cfg))
        self.registrar.extra = self.roles.register_fields      # read at each round: a slave's epoch moves
        if is_slave(cfg):                               # topics, groups and offsets follow the master's
            self.spawn(run_slave_sync(self, lambda: self.registrar.master_addr, cfg.slave_sync_interval,
                                      node_client(cfg)), "slave sync")
        self.log.info("broker %s at %s: %d topics (version %d), %d groups, %d offset entries, registries %s",
                      cfg.broker_name, broker_addr(cfg), len(self.snapshot.topics), self.snapshot.version,
                      len(self.groups.table), len(self.offsets.table), ";".join(self.registrar.registries))
        if cfg.metrics_port:
            await self._serve_metrics(cfg.metrics_host or cfg.broker_ip, cfg.metrics_port)

    async def _serve_metrics(self, host: str, port: int) -> None:
        """The Prometheus endpoint; a port it cannot bind costs the metrics, not the broker."""
        metrics = BrokerMetrics(self)
        server = MetricsServer(lambda: render(metrics.collect()), self.log)
        try:
            await server.start(host, port)
        except OSError as exc:
            self.log.error("metrics endpoint not served: cannot listen on %s:%d: %s", host, port, exc)
            return
        self.metrics = server
        self.log.info("metrics at http://%s:%d/metrics", host, server.port)

    def _processors(self) -> dict:
        clients = ClientProcessor(self)
        self.channel.calls["send_back_target"] = clients.send_back_target
        made = {ClientProcessor: clients, RoleManager: self.roles, MqttProcessor: self.mqtt}
        return {code: handler for cls in PROCESSORS for code, handler in handlers(made.get(cls) or cls(self)).items()}

    @property
    def auto_create_groups(self) -> bool:
        return self.runtime.config.auto_create_subscription_group

    # ---- topics ---------------------------------------------------------------------------------------
    def _load_topics(self) -> TopicSnapshot:
        store = self.config.store_path
        saved = read_snapshot(store)
        base = saved or TopicSnapshot(0, 0, {})
        merged = dict(base.topics)
        static = {c.name for c in parse_static_topics(self.config.topics)}
        for cfg in default_topics(self.runtime.config):
            if cfg.name not in merged or cfg.name in static:     # the settings win for the topics they name
                merged[cfg.name] = cfg
        if saved is not None and merged == saved.topics:
            return saved
        snap = TopicSnapshot(base.version + 1, time.time_ns() // 1_000_000, merged)
        write_snapshot(store, snap)
        return snap

    def publish_topics(self, changed: list[TopicConfig], removed: Sequence[str] = ()) -> asyncio.Future:
        """A new version of the table: persisted, announced on the board (net actors reload it
        on their next request), registered at once; the future is done when the registries have
        been sent it."""
        self.snapshot = self.snapshot.with_topics(changed, removed)
        write_snapshot(self.config.store_path, self.snapshot)
        self.version.set(self.snapshot.version)
        return self.register_soon()

    def create_topic(self, net: str, args: dict) -> dict | None:
        """Auto-creation on first send (createTopicInSendMessageMethod): the topic's config, or
        None when auto-creation is off or the template topic is missing or not inheritable."""
        name = args["topic"]
        existing = self.snapshot.topics.get(name)
        if existing is not None:
            return existing.to_json()
        template = self.snapshot.topics.get(args["default_topic"])
        if not self.runtime.config.auto_create_topic or template is None \
                or not template.perm & PermName.INHERIT:
            return None
        cfg = auto_created(name, template, int(args["queues"]), int(args.get("sys_flag", 0)))
        self.log.info("auto-created topic %s (%d queues) for a producer of %s", name, cfg.write_queues, net)
        self.publish_topics([cfg])
        return cfg.to_json()

    # ---- groups and clients ------------------------------------------------------------------------------
    def group_state(self, name: str) -> list | None:
        """What a pull of this group needs to know (None: nothing - neither config nor consumers)."""
        cfg = self.groups.get(name)
        info = self.clients.consumers.get(name)
        if cfg is None and info is None:
            return None
        return GroupState(cfg is not None, cfg.consume_enable if cfg else True,
                          cfg.consume_broadcast_enable if cfg else True, info.message_model if info else None,
                          {t: registered(s) for t, s in info.subscriptions.items()} if info else {}).to_wire()

    def sync_groups(self, names: set[str]) -> None:
        """Send the net actors the state of each named group that changed."""
        for name in names:
            state = self.group_state(name)
            if self.published.get(name) == state:
                continue
            if state is None:
                self.published.pop(name, None)
            else:
                self.published[name] = state
            self.channel.broadcast("group", name=name, state=state)

    def apply(self, changes: Changes) -> None:
        """After a client table change: state to the net actors first, then the notifications
        (so a consumer that rebalances on them pulls against the new state)."""
        if changes.state:
            self.sync_groups(changes.state)
        for group in changes.notify:
            cfg = self.groups.get(group)
            if cfg is not None and not cfg.notify_consumer_ids_changed_enable:
                continue
            self.notices.changed(group, self.clients.consumer_count(group))

    def _notify_consumers(self, group: str) -> None:
        for ref in self.clients.consumer_refs(group):
            self.channel.push(ref, RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                   flag=FLAG_ONEWAY, ext_fields={"consumerGroup": group}))

    def scan_clients(self) -> None:
        changes = self.clients.expire()
        if changes:
            self.log.info("client connections expired (no heartbeat for %gs): groups %s",
                          self.clients.expiry, sorted(changes.notify | changes.state))
            self.apply(changes)
        self.expire_presumed()

    # ---- the members persisted for a restart (members.py) -------------------------------------------------
    def _restore_members(self, ttl: float) -> None:
        saved = self.members.load()
        if not saved:
            return
        self.clients.restore(saved, ttl)
        self.log.info("%d consumer groups with %d members from before the restart: presumed members for %gs, "
                      "until their clients heartbeat", len(saved), self.clients.presumed_count(), ttl)
        self.spawn(self._end_presumed(ttl), "presumed members")

    async def _end_presumed(self, ttl: float) -> None:
        await asyncio.sleep(ttl)
        self.expire_presumed()

    def expire_presumed(self) -> None:
        left = self.clients.presumed_count()
        changes = self.clients.expire_presumed()
        if changes:
            self.log.info("%d presumed members did not heartbeat within %gs of the restart: they left groups %s",
                          left, self.config.presumed_member_ttl, sorted(changes.notify | changes.state))
            self.apply(changes)

    def persist_members(self) -> None:
        """Write the member table when it changed - not while the node stops or restarts: its net
        actors close every connection first, and a clean restart should find the members as they were."""
        if not self.clients.dirty or self.node_state.get() in (NodeState.STOPPING, NodeState.RESTARTING):
            return
        self.clients.dirty = False
        try:
            self.members.save(self.clients.consumers.values())
        except OSError as exc:
            self.clients.dirty = True               # tried again in PERSIST_INTERVAL
            self.log.error("consumer members not persisted: %s", exc)

    def _on_conn_closed(self, net: str, args: dict) -> None:
        self.apply(self.clients.connection_closed(net, args["conn"]))

    def _on_touch(self, net: str, args: dict) -> None:
        self.clients.touch(net, args["conns"])

    def _on_want_state(self, net: str, args: dict) -> None:
        self._send_state(net)

    def _send_state(self, net: str) -> None:
        self.channel.send(net, "groups", table=self.published)
        self._send_config(net)

    def _send_config(self, net: str) -> None:
        """The runtime settings net actors apply themselves."""
        self.channel.send(net, "config", auto_create_topic=self.runtime.config.auto_create_topic,
                          auto_create_groups=self.auto_create_groups, master=self._forwarding_to or "")

    def _on_group_seen(self, net: str, args: dict) -> None:
        """A pull of a group the net actors do not know: create it if groups are auto-created."""
        name = args["group"]
        _, created = self.groups.find_or_create(name, self.auto_create_groups)
        if created:
            self.log.info("subscription group %s created on its first pull", name)
        self.sync_groups({name})

    async def on_control(self, msg: dict) -> None:
        """A dead net actor's connections died with it. (Not on peer_up: clients of the new
        incarnation may already have registered by then.)"""
        name = msg.get("name")
        if msg.get("op") == "peer_down" and name in self.nets:
            changes = self.clients.net_gone(name)
            if changes:
                self.log.info("%s died: its client connections left groups %s", name,
                              sorted(changes.notify | changes.state))
                self.apply(changes)

    # ---- settings ------------------------------------------------------------------------------------------
    def apply_settings(self, changed: dict) -> None:
        if "broker_permission" in changed:
            self.publish_permission()
            self.publish_topics([])                     # a new dataVersion: registries take the new perm
        if changed.get("auto_create_topic") and DEFAULT_TOPIC not in self.snapshot.topics:
            self.publish_topics([c for c in default_topics(self.runtime.config) if c.name == DEFAULT_TOPIC])
        for net in self.nets:
            self._send_config(net)

    def publish_permission(self) -> None:
        """brokerPermission, and a failover master's fence (smartgo.broker.ha.role_manager)."""
        perm = self.runtime.config.broker_permission
        if self.fenced.get() != self.roles.fenced:
            self.fenced.set(int(self.roles.fenced))
            # the CommitLog writer (commit, or the net actor hosting the commit stage) refuses writes from its next turn
            writer = Doorbell(bell_path(self.ctx.run_path, commitlog_writer(self.config)))
            try:
                writer.ring()
            finally:
                writer.close()
        self.read_only.set(0 if perm & PermName.WRITE and not self.roles.fenced else 1)
        self.unreadable.set(0 if perm & PermName.READ else 1)

    # ---- offsets and statistics --------------------------------------------------------------------------
    def _on_offsets(self, net: str, args: dict) -> None:
        self.offsets.commit_many(args["o"])

    def persist_offsets(self) -> None:
        self.offsets.persist()

    # ---- slave: the master's metadata (slave_sync.py) -------------------------------------------------------
    def apply_master_state(self, state: MasterState) -> Changed:
        """One SlaveSynchronize round on this actor's tables (apply_state), then what the net
        actors must learn: a new topic table through the board word, changed groups as events."""
        changed = apply_state(self.config.store_path, self.snapshot, self.groups, self.offsets, state)
        if changed.topics is not None:
            self.snapshot = changed.topics
            self.version.set(self.snapshot.version)
        self.sync_groups(set(changed.group_names))
        return changed

    def check_transactions(self) -> None:
        if self.roles.fenced:               # its op records and copies would be writes
            return
        sent = self.transactions.run(_now_ms())
        if sent:
            self.log.info("transaction check-back: %d half messages checked with their producers", sent)

    def _on_stats(self, net: str, args: dict) -> None:
        self.stats.add(args["stamp"], args["d"])

    def sample_stats(self) -> None:
        self.stats.sample(time.monotonic(), _now_ms())
        today = date.today()
        if today != self._day:                          # local midnight: BrokerStats.record()
            self._day, self._yesterday = today, self._morning
            self._morning = (self.stats.totals["put_msgs"], self.stats.totals["get_msgs"])

    def day_totals(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(puts, gets) at this morning's and yesterday morning's midnight."""
        return self._morning, self._yesterday

    def earliest_message_time(self) -> int:
        reader = self.view.fresh_reader()
        record = reader.view(reader.commitlog_min, self.view.written.get())
        return 0 if record is None else store_timestamp_at(record, 0)

    def queue_lags(self) -> Iterator[tuple[str, str, int, int, int]]:
        """(topic, group, queue id, max offset, committed offset) per queue of every committed
        (topic, group): the stats records' lag snapshot and the metrics' lag."""
        for (topic, group), queues in sorted(self.offsets.table.items()):
            for queue_id, consumer_offset in sorted(queues.items()):
                yield topic, group, queue_id, self.view.max_offset(topic, queue_id), consumer_offset

    def lag_snapshot(self) -> list[dict]:
        return [{"group": group, "topic": topic, "queue_id": queue_id, "broker_offset": broker_offset,
                 "consumer_offset": consumer_offset, "lag": max(0, broker_offset - consumer_offset)}
                for topic, group, queue_id, broker_offset, consumer_offset in self.queue_lags()]

    async def _write_stats(self) -> None:
        """One record per window, written a little after the window's end."""
        book = self.stats
        while True:
            now = _now_ms()
            for end in book.due(now, STATS_GRACE_MS):
                self._write_window(end)
            next_due = (now - STATS_GRACE_MS) // book.window_ms * book.window_ms + book.window_ms + STATS_GRACE_MS
            await asyncio.sleep(max(0.01, (next_due - _now_ms()) / 1000))

    def _write_window(self, end: int) -> None:
        record = self.stats.close(end).record(self.stats.window_s, self.identity, self.lag_snapshot())
        mqtt = self.mqtt.take_window()
        if mqtt is not None:
            record["mqtt"] = mqtt
        try:
            self.stats_files.append(record)
        except OSError as exc:
            self.log.error("stats record %d not written: %s", end, exc)

    # ---- registration -------------------------------------------------------------------------------------
    def register_soon(self) -> asyncio.Future:
        """Register now, coalesced: changes made while a round runs go in one more round after it.
        The future is done when a round that carries the current table has finished."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._register_waiters.append(done)
        if self._register_task is None or self._register_task.done():
            self._register_task = loop.create_task(self._register())
        return done

    async def _register(self) -> None:
        while self._register_waiters:
            waiters, self._register_waiters = self._register_waiters, []
            try:
                await self.registrar.register(self._registered_table())
                self.roles.on_registered(self.registrar.failover)
                self._note_master()
            finally:
                for done in waiters:
                    if not done.done():
                        done.set_result(None)

    def _registered_table(self) -> TopicSnapshot:
        """The topic table as registered: each topic's perm within the broker's permission."""
        return self.snapshot.with_perm(self.runtime.config.broker_permission)

    def register_early(self) -> None:
        """Register every second rather than every register_interval (30 s) while waiting on the
        registries' answer: a slave without a replication connection that knows no master (or,
        under automatic failover, may have a new one), and a failover master not yet confirmed.
        Otherwise, once the first round is done, register with the registries that lost us alone
        (one down, or restarted since: Registrar.lost)."""
        unplaced = is_slave(self.config) and self.ha_connected.get() == 0 and (
            self.registrar.master_addr is None or self.roles.enabled)
        if unplaced or self.roles.fenced:
            self.register_soon()
        elif (self._register_task is not None and self._register_task.done()
              and (self._catch_up is None or self._catch_up.done()) and (lost := self.registrar.lost())):
            self._catch_up = asyncio.get_running_loop().create_task(
                self.registrar.register(self._registered_table(), lost))

    def _note_master(self) -> None:
        """A slave's ha actor reads its master's HA address from <run>/ha_master (unless set);
        written when the registries' answer names another one. Its net actors pass writes on to
        the master's broker address (smartgo.broker.ha.master_forward)."""
        if self.registrar.master_addr != self._forwarding_to:
            self._forwarding_to = self.registrar.master_addr
            for net in self.nets:
                self._send_config(net)
        addr = self.registrar.master_ha_addr
        if addr and addr != self._noted_master:
            path = master_file(self.ctx.run_path)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(addr)
            os.replace(tmp, path)
            self._noted_master = addr
            self.log.info("master %s, replication from %s", self.registrar.master_addr, addr)

    async def stop(self) -> None:
        """Offsets and the open stats window are written (a restarted broker goes on after that
        window), the broker unregisters."""
        try:
            self.offsets.persist()
            self.persist_members()
        finally:
            self._write_window(self.stats.open_end(_now_ms()))
        await asyncio.gather(*(t for t in (self._register_task, self._catch_up) if t is not None),
                             return_exceptions=True)
        await self.registrar.unregister()
        await self.registrar.close()
        if self.metrics is not None:
            await self.metrics.close()
        await self.channel.close()
        self.view.reader.close()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
