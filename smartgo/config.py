"""Node configuration: one dataclass, read from a TOML file and overridden by command-line flags.

Every setting is a field of NodeConfig with its default and its help text; the supervisor's
argparse flags are generated from these fields (`--store-dir` for `store_dir`), so a setting
added here is at once a TOML key, a flag and a line of `python supervisor.py --help`.
Precedence: built-in default < config file < flag.

The config file is flat TOML with the same keys, plus optional `[[actor]]` tables declaring
extra actors (see smartgo.actors.spec.ActorSpec.from_dict for their keys):

    role = "registry"
    store_dir = "/var/lib/smartgo/registry"
    listen_port = 9876
    max_restarts = 5

    [[actor]]
    name = "probe"
    cls = "mypackage.probe:ProbeActor"
    after = ["registry"]
    kwargs = { interval = 1.0 }
"""

from __future__ import annotations

import argparse
import dataclasses
import ssl
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from smartgo.cpus import usable_cpus
from smartgo.net.tls import CLIENT_AUTH, MODES, ServerTls, client_context


class ConfigError(Exception):
    """A bad config file or value: the message names the file, the key and what is allowed."""


FLAG_WORDS = ("true", "false")      # how a bool setting is spelt in the file, a flag and RocketMQ's properties


def setting_text(value: object) -> str:
    """A setting as the file, the flags and GET_BROKER_CONFIG spell it: bools as RocketMQ's true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def setting(default: Any, help: str, *, flag: bool = True, choices: tuple[str, ...] | None = None,
            metavar: str | None = None) -> Any:
    if isinstance(default, bool):
        choices = FLAG_WORDS
    meta = {"help": help, "flag": flag, "choices": choices, "type": type(default),
            "metavar": metavar or {int: "N", float: "SECONDS"}.get(type(default))}
    if isinstance(default, list):
        return field(default_factory=list, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class NodeConfig:
    # ---- what this node is
    role: str = setting("", "what this node runs: master, slave or registry (required)", metavar="ROLE")
    store_dir: str = setting("", "root of this node's files (store, run/, logs/); default ~/smartgo/<role>",
                             metavar="DIR")
    run_dir: str = setting("", "where the board, rings and doorbells live (point it at a tmpfs to keep "
                               "ring pages off the disk); default <store-dir>/run", metavar="DIR")
    # ---- network
    listen_host: str = setting("0.0.0.0", "address the node's servers bind", metavar="IP")
    listen_port: int = setting(0, "port clients connect to; 0 = the role's default (registry 9876, broker 10911)")
    registry: str = setting("", "registry (name server) addresses, 'host:port;host:port'; default none",
                            metavar="ADDRS")
    broker_ip: str = setting("127.0.0.1", "address the broker registers and writes into message ids "
                                          "(RocketMQ brokerIP1); set it for a multi-machine deployment", metavar="IP")
    net_actors: int = setting(0, "number of net actors (connection/codec processes) of a broker; 0 = one for "
                                 "every two CPUs the node may use (its affinity and cgroup quota), at least 1: "
                                 "1 is the best on 2 cores (docs/BENCHMARKS.md)")
    commit_in_net: bool = setting(True, "with one net actor, run the commit stage (the CommitLog writer) inside it "
                                        "instead of in an actor of its own: no process hop for a send")
    remoting_connections: int = setting(0, "RocketMQ client connections the node is sized for: as many net actors "
                                           "start as hold them, each taking its open-files limit less a twentieth "
                                           "and its mapped ConsumeQueue files; 0 = --net-actors alone", metavar="N")
    net_busy_poll_us: int = setting(0, "microseconds a net actor keeps polling after I/O before it sleeps "
                                       "(smartgo.net.busy_poll): fewer wake-ups for synchronous clients at the "
                                       "price of spinning; 0 = off")
    # ---- MQTT (smartgo/mqtt/, docs/MQTT.md)
    mqtt_port: int = setting(1883, "MQTT 3.1.1/5.0 over TCP on a broker node; 0 = off")
    mqtt_ws_port: int = setting(8083, "MQTT over WebSocket (path /mqtt, subprotocol mqtt); 0 = off")
    mqtt_tls_port: int = setting(0, "MQTT over TLS with the node's tls_cert_file (usually 8883); 0 = off")
    mqtt_actors: int = setting(1, "MQTT actor processes sharing the MQTT ports (SO_REUSEPORT); more start when "
                                  "--mqtt-connections needs them")
    mqtt_connections: int = setting(0, "MQTT connections the node is sized for: as many MQTT actors start as "
                                       "hold them, each taking its open-files limit less a twentieth; 0 = "
                                       "--mqtt-actors alone", metavar="N")
    mqtt_topic_map: str = setting("#=MQTT", "MQTT topics to SmartGo topics: 'filter=Topic,...', the first "
                                            "matching rule wins (a topic tree with a leaf per device maps to one "
                                            "topic, never a topic or queue per leaf)", metavar="RULES")
    mqtt_topic_queues: int = setting(8, "queues of a bridged SmartGo topic the node creates")
    mqtt_max_packet_size: int = setting(1 << 20, "largest MQTT packet accepted (bytes, MQTT 5.0 Maximum "
                                                 "Packet Size)")
    mqtt_receive_maximum: int = setting(1024, "QoS 1/2 publishes a client may have unanswered (Receive Maximum)")
    mqtt_max_queued_messages: int = setting(1000, "messages a session keeps while its client is away or "
                                                  "slow; more are dropped and counted")
    mqtt_max_queued_bytes: int = setting(16 << 20, "bytes of payload a session keeps queued")
    mqtt_checkpoint_interval: float = setting(0.1, "seconds between checkpoints of the persistent sessions that "
                                                   "changed (records in MQTT_SESSIONS); a QoS 2 delivery waits "
                                                   "for the next one")
    mqtt_connect_timeout: float = setting(10.0, "seconds a new connection has to send CONNECT")
    mqtt_max_keep_alive: int = setting(0, "largest keep-alive granted (Server Keep Alive); 0 = the client's")
    mqtt_allow_anonymous: bool = setting(True, "let clients without a user name connect")
    mqtt_users_file: str = setting("", "MQTT accounts: YAML with hashed passwords and topic permissions "
                                       "(smartgo mqtt-passwd); re-read when it changes", metavar="PATH")
    # ---- broker (master)
    vip_port: int = setting(-1, "second port with the same service, for old clients' VIP channel; "
                                "default listen_port - 2 (10909); 0 = off")
    broker_name: str = setting("broker-a", "the broker's name in routes (RocketMQ brokerName)", metavar="NAME")
    cluster_name: str = setting("DefaultCluster", "cluster the broker registers in (brokerClusterName)",
                                metavar="NAME")
    embedded_registry_port: int = setting(9876, "port of the registry a broker starts inside its node when no "
                                                "--registry is given (a one-command single node)")
    register_interval: float = setting(30.0, "seconds between full registrations with every registry")
    topics: str = setting("", "static topics, 'Name:queues[:perm];Other:queues' with 1..65535 queues each (created "
                              "or reset at every start; others come from UPDATE_AND_CREATE_TOPIC and auto-creation)",
                          metavar="LIST")
    auto_create_topic: bool = setting(True, "create unknown topics on first send through TBW102 "
                                              "(autoCreateTopicEnable; changeable at runtime)")
    default_topic_queues: int = setting(8, "queues of the TBW102 template topic (defaultTopicQueueNums)")
    auto_create_subscription_group: bool = setting(True, "create a consumer group's config on its first heartbeat "
                                                           "or pull (autoCreateSubscriptionGroup; changeable at "
                                                           "runtime)")
    enable_property_filter: bool = setting(True, "serve consumers that subscribe with a SQL92 expression on "
                                                   "message properties (MessageSelector.bySql); false answers them "
                                                   "SYSTEM_ERROR as 4.x does by default (enablePropertyFilter)")
    trace_topic_enable: bool = setting(False, "create the message trace topic (1 queue) at start, for clients "
                                                "with message trace on (traceTopicEnable); without it the topic is "
                                                "auto-created on a traced client's first send, if auto-creation is "
                                                "on")
    msg_trace_topic_name: str = setting("RMQ_SYS_TRACE_TOPIC", "the topic trace_topic_enable creates "
                                                               "(msgTraceTopicName)", metavar="TOPIC")
    metrics_port: int = setting(0, "port of the broker's Prometheus endpoint, GET /metrics (RocketMQ 5.x's "
                                   "metricsPromExporterPort, usually 5557); 0 = off")
    metrics_host: str = setting("", "address the Prometheus endpoint binds; default broker_ip, as 5.x binds "
                                    "brokerIP1 (metricsPromExporterHost)", metavar="IP")
    tls_mode: str = setting("disabled", "TLS on the remoting ports, broker's and registry's (tls.server.mode): "
                                        "disabled, permissive (TLS and plain clients on one port, told apart "
                                        "by their first byte) or enforcing (TLS only)",
                            choices=MODES)
    tls_cert_file: str = setting("", "PEM certificate chain served over TLS (tls.server.certPath)", metavar="PATH")
    tls_key_file: str = setting("", "PEM private key of that certificate (tls.server.keyPath)", metavar="PATH")
    tls_need_client_auth: str = setting("none", "ask TLS clients for a certificate signed by a CA of "
                                                "tls_trust_cert_file (tls.server.need.client.auth)",
                                        choices=tuple(CLIENT_AUTH))
    tls_trust_cert_file: str = setting("", "PEM CA certificates the clients' certificates must lead to "
                                           "(tls.server.trustCertPath)", metavar="PATH")
    tls_enable: bool = setting(False, "this node's own connections (registration with the registries, a "
                                        "slave's sync from its master) speak TLS, showing tls_cert_file when "
                                        "asked (tls.enable)")
    acl_enable: bool = setting(False, "check every request against the ACL file: access key, signature and "
                                        "topic/group permissions, as RocketMQ 4.x's plain ACL (aclEnable); on a "
                                        "registry its writes (admin accounts) and broker registrations")
    acl_file: str = setting("", "the ACL file, RocketMQ's plain_acl.yml format, read again when it changes; "
                                "default <store-dir>/plain_acl.yml", metavar="FILE")
    acl_access_key: str = setting("", "the node's own account: a broker signs its registrations with it (an "
                                      "ACL registry wants them signed), a slave its copies of an ACL-enabled "
                                      "master's topics, groups and offsets (else the master must white-list its "
                                      "address); a failover registry asks and promotes brokers with it (admin)",
                                  metavar="KEY")
    acl_secret_key: str = setting("", "that account's secret key", metavar="SECRET")
    broker_permission: int = setting(6, "what the whole broker allows: READ 4 | WRITE 2 (brokerPermission; "
                                        "changeable at runtime, e.g. 4 to drain a broker)")
    offset_persist_interval: float = setting(5.0, "seconds between writes of changed consumer offsets")
    client_expiry: float = setting(120.0, "seconds without a heartbeat after which a client connection leaves "
                                          "its groups")
    client_scan_interval: float = setting(10.0, "seconds between scans for expired client connections")
    presumed_member_ttl: float = setting(35.0, "seconds a restarted broker serves the consumer group members it "
                                              "persisted until their clients heartbeat (clients do every 30 s)")
    queue_lock_lease: float = setting(60.0, "seconds an orderly consumer's queue lock lasts without renewal")
    stats_interval: int = setting(60, "seconds per statistics record (a divisor of 3600; docs/STATS.md)")
    stats_sample_interval: float = setting(10.0, "seconds between the samples behind the 4.x stats items' "
                                                 "last-minute figures (VIEW_BROKER_STATS_DATA, mqadmin statsAll; "
                                                 "4.x: 10); 7 are kept, so those figures span 6 intervals")
    stats_max_bytes: int = setting(256 * 1024 * 1024, "bytes the stats folder may hold; the oldest files go first")
    flush: str = setting("async", "acknowledge a send once it is in the mapped CommitLog (async) or only "
                                  "after it is on disk (sync, group commit)", choices=("async", "sync"))
    sync_flush_timeout: float = setting(5.0, "sync flush: seconds before a send is answered FLUSH_DISK_TIMEOUT")
    flush_interval: float = setting(0.5, "seconds between CommitLog flush rounds (async flush)")
    flush_least_pages: int = setting(4, "async flush: dirty 4 KiB pages needed before a round writes")
    flush_thorough_interval: float = setting(10.0, "async flush: seconds after which any dirty byte is flushed")
    cq_flush_interval: float = setting(1.0, "seconds between ConsumeQueue/index flush rounds")
    cq_flush_least_pages: int = setting(2, "ConsumeQueue flush: dirty pages needed per queue")
    cq_flush_thorough_interval: float = setting(60.0, "ConsumeQueue flush: seconds after which any dirty "
                                                      "byte is flushed")
    commitlog_file_size: int = setting(1024 * 1024 * 1024, "bytes per CommitLog file")
    consume_queue_file_size: int = setting(300_000 * 20, "bytes per ConsumeQueue file (20-byte entries)")
    mapped_queue_files: int = setting(1024, "ConsumeQueue files each actor keeps mapped at once, the least "
                                            "recently used unmapped first; lowered to fit the open files "
                                            "limit (smartgo.broker.settings.mapped_queue_files)")
    index_slot_count: int = setting(5_000_000, "hash slots per index file")
    index_entry_count: int = setting(20_000_000, "entries per index file")
    max_message_size: int = setting(4 * 1024 * 1024, "largest message body accepted (bytes)")
    access_message_in_memory_max_ratio: int = setting(
        40, "percent of RAM behind the newest message that counts as in memory; a pull reading older "
            "records gets at most 64 KiB instead of 256 KiB (32 messages either way: 4.x's 8 only "
            "multiplied the pulls of a consumer catching up), under slave_read_enable it is sent to the "
            "slave, and a new group's first offset is 0 only while message 0 is within it "
            "(accessMessageInMemoryMaxRatio)")
    file_reserved_hours: float = setting(72.0, "hours a CommitLog file is kept (fileReservedTime)")
    delete_when: str = setting("04", "hours of the day when expired files are deleted, 'HH;HH' (deleteWhen)",
                               metavar="HOURS")
    disk_max_used_ratio: int = setting(75, "disk usage, percent, above which expired files go at any hour")
    disk_force_clean_ratio: int = setting(85, "disk usage, percent, above which the oldest files go even unexpired")
    disk_full_ratio: int = setting(90, "disk usage, percent, at which sends are refused (disk-full flag)")
    cleanup_interval: float = setting(10.0, "seconds between cleanup passes")
    cleanup_max_files: int = setting(10, "CommitLog files deleted at most per cleanup pass")
    trust_clean_stop: bool = setting(True, "after a clean stop, recovery checks the store from the end that "
                                           "stop recorded instead of walking the last three CommitLog and "
                                           "ConsumeQueue files (a clean restart costs the same with any "
                                           "backlog; the background scrub checks the rest)")
    scrub_rate_mb: float = setting(8.0, "MiB/s at which the cleanup actor checks flushed CommitLog data for rot "
                                        "(body CRCs, lengths) in the background; damage is logged and repaired at "
                                        "the next start; 0 = off", metavar="MIB")
    scrub_interval: float = setting(86400.0, "seconds from the start of one background scrub pass to the next")
    scrub_delay: float = setting(600.0, "seconds after the node starts before the first background scrub pass")
    disk_usage_file: str = setting("", "testing: read the disk usage ratio (0..1) from this file instead of "
                                       "measuring the store's file system", metavar="FILE")
    hold_check_interval: float = setting(5.0, "seconds between the long-polling safety re-checks")
    message_delay_level: str = setting("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
                                       "delay of each DELAY level 1..N (messageDelayLevel; units s, m, h, d; at "
                                       "most 32 levels)", metavar="LEVELS")
    timer_wheel_enable: bool = setting(True, "accept timer messages (5.x's TIMER_DELIVER_MS, TIMER_DELAY_SEC, "
                                               "TIMER_DELAY_MS properties: delivery at any time up to "
                                               "timer_max_delay_sec ahead; timerWheelEnable)")
    timer_precision_ms: int = setting(1000, "a timer message is delivered within this many ms after its time, "
                                            "never before (timerPrecisionMs)", metavar="MS")
    timer_max_delay_sec: int = setting(259200, "how far ahead a timer message may be due, in seconds; further is "
                                               "MESSAGE_ILLEGAL (timerMaxDelaySec; 3 days)", metavar="SECONDS")
    store_reply_message: bool = setting(True, "store request-reply replies in <cluster>_REPLY_TOPIC as well as "
                                                "pushing them to the requester (storeReplyMessageEnable)")
    schedule_fault_file: str = setting("", "testing: a file '<step> kill|stop' makes the schedule actor SIGKILL or "
                                           "SIGSTOP itself at that step (handover, landed, persist); removed when it "
                                           "fires", metavar="FILE")
    transaction_timeout: float = setting(6.0, "seconds after its birth before a half message left without "
                                              "END_TRANSACTION is checked back with its producer "
                                              "(transactionTimeOut)")
    transaction_check_interval: float = setting(60.0, "seconds between transaction check-back passes "
                                                      "(transactionCheckInterval)")
    transaction_check_max: int = setting(15, "check-backs of one half message before it is given up "
                                             "(transactionCheckMax)")
    # ---- replication (master/slave)
    broker_id: int = setting(-1, "RocketMQ brokerId: a master is 0, a slave 1 or more; default 0 for a master, "
                                 "1 for a slave")
    replication: str = setting("async", "master: acknowledge a send without waiting for a slave (async, "
                                        "ASYNC_MASTER) or only once a slave has it too (sync, SYNC_MASTER: "
                                        "FLUSH_SLAVE_TIMEOUT after sync_flush_timeout, SLAVE_NOT_AVAILABLE "
                                        "without a slave in reach)", choices=("async", "sync"))
    ha_port: int = setting(0, "port of the replication service a master serves its slaves on; "
                              "0 = listen_port + 1 (10912)")
    ha_master_address: str = setting("", "slave: the master's replication address host:port; default the "
                                         "haServerAddr the registry answers the slave's registration with",
                                     metavar="ADDR")
    ha_fall_behind_max: int = setting(256 * 1024 * 1024, "sync master: a slave more than this many bytes "
                                                         "behind counts as not available (haSlaveFallbehindMax)")
    ha_heartbeat_interval: float = setting(5.0, "seconds between a slave's reports and a master's empty frames "
                                                "while nothing moves (haSendHeartbeatInterval)")
    ha_housekeeping_interval: float = setting(20.0, "seconds of silence after which a replication connection "
                                                    "is closed (haHousekeepingInterval)")
    slave_read_enable: bool = setting(False, "a pull that reads data older than the in-memory window "
                                               "(access_message_in_memory_max_ratio) is told to go on at the "
                                               "slave (suggestWhichBrokerId 1), which keeps a lagging consumer "
                                               "off the master's page cache; the slave sends it back once it "
                                               "reads recent data (slaveReadEnable)")
    failover_enable: bool = setting(False, "automatic failover (5.x's controller mode, opt-in): on a registry, "
                                             "promote the most advanced slave of a broker name whose master has "
                                             "been gone for failover_delay, and send a returning old master back "
                                             "as a slave; on a broker, take those role changes (the role then "
                                             "lives in <store-dir>/config/role.json, over --role) and accept "
                                             "sends as a master only once a failover registry has confirmed it. "
                                             "One registry of a cluster decides (docs/ARCHITECTURE.md)")
    failover_delay: float = setting(10.0, "registry: seconds a broker name may go without a master before one "
                                          "of its slaves is promoted (with failover_enable)")
    failover_unclean_enable: bool = setting(False, "registry: promote the most advanced slave that is up even "
                                                     "when it lacks messages its SYNC_MASTER acknowledged (another "
                                                     "slave held them), rather than wait for one that has them "
                                                     "(5.x's enableElectUncleanMaster)")
    slave_sync_interval: float = setting(10.0, "slave: seconds between copies of the master's topics, groups "
                                               "and consumer offsets (SlaveSynchronize)")
    slave_forward_writes: bool = setting(True, "slave: pass the sends, send-backs, transaction ends and "
                                                 "offsets a client with a stale route addresses to it (after a "
                                                 "switchover or a failover: Java clients re-read routes every 30 s) "
                                                 "on to its master, and relay the answer, rather than refuse them "
                                                 "as 4.x")
    # ---- supervision
    start_method: str = setting("forkserver", "how actor processes start: forkserver (fast restarts from a "
                                              "clean preloaded server) or spawn", choices=("forkserver", "spawn"))
    actor_sched_policy: str = setting("batch", "Linux scheduling policy of the actor processes: batch "
                                                "(SCHED_BATCH: a woken actor does not preempt the one running, so "
                                                "on a busy machine batches grow and context switches drop) or other "
                                                "(the default policy)", choices=("batch", "other"))
    heartbeat_interval: float = setting(0.2, "seconds between an actor's heartbeats on the board")
    heartbeat_deadline: float = setting(5.0, "an actor whose heartbeat is older than this (s) is killed and "
                                             "restarted, unless its progress counter still moves (busy, not "
                                             "hung: a warning); an actor spec may set its own")
    heartbeat_busy_limit: float = setting(30.0, "a busy actor (progress, no heartbeat) is killed all the same once "
                                                "its heartbeat is this old (s)")
    start_timeout: float = setting(60.0, "seconds an actor may take to start before it is killed")
    restart_backoff: float = setting(0.05, "delay (s) before the first restart of a crashed actor; doubles "
                                           "with each further restart inside restart_window")
    restart_backoff_max: float = setting(5.0, "upper bound (s) of the restart delay")
    max_restarts: int = setting(5, "restart intensity: more restarts than this of one actor inside "
                                   "restart_window restart the whole node")
    restart_window: float = setting(60.0, "window (s) of the restart intensity")
    max_node_restarts: int = setting(3, "more whole-node restarts than this inside node_restart_window: "
                                        "the supervisor gives up and exits non-zero")
    node_restart_window: float = setting(300.0, "window (s) of the node restart limit")
    shutdown_timeout: float = setting(10.0, "graceful stop budget (s); actors still alive then are killed")
    recovery_timeout: float = setting(600.0, "seconds the role's recovery step may take")
    # ---- logging and the board
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    log_max_bytes: int = setting(10 * 1024 * 1024, "size (bytes) at which <store-dir>/logs/node.log rotates")
    log_backups: int = setting(5, "rotated log files kept (node.log.1 ...)")
    board_max_actors: int = setting(64, "actor slots on the board, at least; a node starting more actors "
                                        "(--mqtt-connections, --remoting-connections) makes one for each")
    board_queue_capacity: int = setting(65536, "entries of the board's per-queue table (topic, queue id; 160 bytes "
                                               "each, three quarters usable); a node whose store has more queues "
                                               "starts with room for twice as many")
    # ---- config-file only
    actor: list = setting([], "extra actors ([[actor]] tables in the config file)", flag=False)

    # ---- derived values -----------------------------------------------------------------------------
    @property
    def store_path(self) -> Path:
        return Path(self.store_dir or f"~/smartgo/{self.role}").expanduser()

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir).expanduser() if self.run_dir else self.store_path / "run"

    @property
    def log_path(self) -> Path:
        return self.store_path / "logs" / "node.log"

    @property
    def server_tls(self) -> ServerTls:
        return ServerTls(self.tls_mode, self.tls_cert_file, self.tls_key_file, self.tls_need_client_auth,
                         self.tls_trust_cert_file)

    def outbound_tls(self) -> ssl.SSLContext | None:
        """The TLS context of this node's own connections (tls_enable), showing its certificate."""
        if not self.tls_enable:
            return None
        return client_context(cert_file=self.tls_cert_file or None, key_file=self.tls_key_file or None)

    @property
    def board_path(self) -> Path:
        return self.run_path / "board"

    def resolved(self, default_port: int) -> NodeConfig:
        """The same config with every 'role default' filled in (what children receive)."""
        port = self.listen_port or default_port
        return dataclasses.replace(self, store_dir=str(self.store_path.resolve()),
                                   run_dir=str(self.run_path.resolve()), listen_port=port,
                                   net_actors=self.net_actors or max(1, usable_cpus() // 2),
                                   vip_port=max(port - 2, 0) if self.vip_port < 0 else self.vip_port,
                                   ha_port=self.ha_port or port + 1,
                                   broker_id=(1 if self.role == "slave" else 0) if self.broker_id < 0
                                   else self.broker_id)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> NodeConfig:
        return cls(**_checked(data, source))


_FIELDS = {f.name: f for f in fields(NodeConfig)}


def _checked(data: dict, source: str) -> dict:
    out = {}
    for key, value in data.items():
        f = _FIELDS.get(key)
        if f is None:
            raise ConfigError(f"{source}: unknown setting {key!r}")
        want = f.metadata["type"]
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        choices = f.metadata["choices"]
        if want is bool:
            if value not in FLAG_WORDS and not isinstance(value, bool):     # true/false as RocketMQ spells them
                raise ConfigError(f"{source}: {key} must be one of {', '.join(choices)}, got {value!r}")
            out[key] = value if isinstance(value, bool) else value == "true"
            continue
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ConfigError(f"{source}: {key} must be {want.__name__}, got {value!r}")
        if choices and value not in choices:
            raise ConfigError(f"{source}: {key} must be one of {', '.join(choices)}, got {value!r}")
        if want in (int, float) and value < 0:
            raise ConfigError(f"{source}: {key} must not be negative, got {value!r}")
        out[key] = value
    return out


def load_file(path: Path) -> dict:
    """Settings from a TOML file, checked (unknown keys and wrong types are errors)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: {e}") from None
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror}") from None
    return _checked(data, str(path))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One --flag per setting; unset flags stay out of the namespace so the file can fill them."""
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="TOML file with any of the settings below (flags override it)")
    for f in fields(NodeConfig):
        if not f.metadata["flag"]:
            continue
        default = "" if f.default == "" else f" (default: {setting_text(f.default)})"
        want = f.metadata["type"]
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=argparse.SUPPRESS,
                            type=str if want is bool else want, choices=f.metadata["choices"],
                            metavar=None if f.metadata["choices"] else f.metadata["metavar"],
                            help=f.metadata["help"] + default)


def from_namespace(args: argparse.Namespace) -> NodeConfig:
    """Defaults, then the --config file, then the flags given."""
    values: dict = {}
    if getattr(args, "config", None):
        values.update(load_file(Path(args.config)))
    values.update({k: v for k, v in vars(args).items() if k in _FIELDS})
    values = _checked(values, "settings")
    cfg = NodeConfig(**values)
    if not cfg.role:
        raise ConfigError("no role: pass --role master|slave|registry (or set role in the config file)")
    return cfg
