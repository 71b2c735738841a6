"""What every broker actor derives from the node's settings: the store config, addresses, names."""

from __future__ import annotations

import resource

from smartgo.config import ConfigError, NodeConfig
from smartgo.broker.schedule.schedule_message import TimerSettings
from smartgo.store.config import TIMER_FIRST_LEVEL, StoreConfig
from smartgo.store.record import parse_delay_levels
from smartgo.net.limits import connections_per_actor, open_files_limit

NET_PREFIX = "net-"
SCHEDULE = "schedule"       # the schedule actor: a producer to commit like a net actor (actors/schedule_actor.py)


def net_names(config: NodeConfig) -> list[str]:
    """Actor names of the net actors: net-0 .. net-(N-1); --net-actors, or more when
    --remoting-connections needs more descriptors than they have."""
    needed = -(-config.remoting_connections // net_capacity(config, open_files_limit()))
    return [f"{NET_PREFIX}{i}" for i in range(max(1, config.net_actors, needed))]


def net_capacity(config: NodeConfig, open_files: int) -> int:
    """Client connections a net actor takes before it refuses more: its share of open files less
    the ConsumeQueue files it may keep mapped (each holds a descriptor)."""
    return max(1, connections_per_actor(open_files) - mapped_queue_files(config.mapped_queue_files, open_files))


def commit_producers(config: NodeConfig) -> list[str]:
    """Actors whose records the commit stage appends: the net actors and the schedule actor."""
    return [*net_names(config), SCHEDULE]


def commit_in_net(config: NodeConfig) -> bool:
    """Does the commit stage run inside the only net actor (smartgo.broker.commit_stage)?"""
    return config.commit_in_net and not is_slave(config) and len(net_names(config)) == 1


def ring_producers(config: NodeConfig) -> list[str]:
    """Producers that reach the commit stage through send.<name> / done.<name> rings: all of them,
    but the net actor hosting the stage."""
    if commit_in_net(config):
        return [SCHEDULE]
    return commit_producers(config)


def delay_levels(config: NodeConfig) -> tuple[int, ...]:
    """message_delay_level in ms per level (ConfigError when malformed, and for timer settings below 1)."""
    try:
        levels = parse_delay_levels(config.message_delay_level)
    except (KeyError, ValueError, IndexError):
        levels = ()
    if not levels or min(levels) < 0 or len(levels) >= TIMER_FIRST_LEVEL:
        raise ConfigError(f"message_delay_level must be up to {TIMER_FIRST_LEVEL - 1} delays like '1s 5s 1m 2h' "
                          f"(units s, m, h, d), got {config.message_delay_level!r}")
    if config.timer_precision_ms < 1 or config.timer_max_delay_sec < 1:
        raise ConfigError(f"timer_precision_ms ({config.timer_precision_ms}) and timer_max_delay_sec "
                          f"({config.timer_max_delay_sec}) must be 1 or more")
    return levels


def timer_settings(config: NodeConfig) -> TimerSettings:
    """What the send path and the schedule actor need of the timer settings (checked by delay_levels):
    the hops are the schedule table's, as dispatch computes the entries' due times with it."""
    store = store_config(config)
    return TimerSettings(config.timer_wheel_enable, store.timer_max_delay_ms,
                         store.delay_levels_ms[TIMER_FIRST_LEVEL - 1:])


def intent_fields(nets: list[str]) -> list[tuple[str, str]]:
    """The board fields of the commit actor's restart protocol (smartgo.broker.actors.commit_actor)."""
    return [("commit.intent", "sequence number of the batch being appended; 0 = none"),
            ("commit.intent_start", "written position when that batch began"),
            ("commit.intent_bytes", "upper bound of the bytes that batch may write"),
            *[(f"commit.cursor.{net}", f"send.{net} ring position that batch consumes through") for net in nets]]


def vip_port(config: NodeConfig) -> int:
    """The VIP channel's port (listen_port - 2 unless set; NodeConfig.resolved fills it), 0 when off."""
    return config.vip_port if config.vip_port >= 0 else max(config.listen_port - 2, 0)


def broker_addr(config: NodeConfig) -> str:
    """What the broker registers and writes as store host: broker_ip:listen_port (brokerIP1)."""
    return f"{config.broker_ip}:{config.listen_port}"


def ha_addr(config: NodeConfig) -> str:
    """Where slaves reach this master's replication service (registered as haServerAddr)."""
    return f"{config.broker_ip}:{config.ha_port or config.listen_port + 1}"


def is_slave(config: NodeConfig) -> bool:
    return config.role == "slave"


def commitlog_writer(config: NodeConfig) -> str:
    """The actor that appends to the CommitLog: on a master commit, or the only net actor hosting
    the commit stage; ha (replication) on a slave."""
    if is_slave(config):
        return "ha"
    return net_names(config)[0] if commit_in_net(config) else "commit"


def registry_addrs(config: NodeConfig) -> list[str]:
    """Registries to register with: --registry, or the node's embedded one."""
    if config.registry:
        return [a.strip() for a in config.registry.split(";") if a.strip()]
    return [f"127.0.0.1:{config.embedded_registry_port}"]


RESERVED_FILES = 1024        # descriptors kept for connections, CommitLog and index files


def mapped_queue_files(configured: int, soft: int | None = None) -> int:
    """ConsumeQueue files an actor may keep mapped, each holding a descriptor (CPython's mmap keeps
    a dup of the file's): the configured number, or fewer to leave a quarter of the open files
    limit (the supervisor raised it to the hard limit) for everything else - at least
    RESERVED_FILES, at most half. Past it the least recently used file is unmapped (MappingLimit),
    so no number of queues runs an actor out of descriptors."""
    if soft is None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return configured
    return min(configured, soft - min(max(RESERVED_FILES, soft // 4), soft // 2))


def store_config(config: NodeConfig) -> StoreConfig:
    return StoreConfig(
        store_path=str(config.store_path),
        commitlog_file_size=config.commitlog_file_size,
        consume_queue_file_size=config.consume_queue_file_size,
        mapped_queue_files=mapped_queue_files(config.mapped_queue_files),
        index_slot_count=config.index_slot_count,
        index_entry_count=config.index_entry_count,
        max_message_size=config.max_message_size,
        message_delay_level=config.message_delay_level,
        timer_precision_ms=config.timer_precision_ms,
        timer_max_delay_ms=config.timer_max_delay_sec * 1000,
        flush_disk_type="SYNC_FLUSH" if config.flush == "sync" else "ASYNC_FLUSH",
        sync_flush_timeout_ms=int(config.sync_flush_timeout * 1000),
        flush_interval_commitlog_ms=int(config.flush_interval * 1000),
        flush_commitlog_least_pages=config.flush_least_pages,
        flush_commitlog_thorough_interval_ms=int(config.flush_thorough_interval * 1000),
        flush_interval_consume_queue_ms=int(config.cq_flush_interval * 1000),
        flush_consume_queue_least_pages=config.cq_flush_least_pages,
        flush_consume_queue_thorough_interval_ms=int(config.cq_flush_thorough_interval * 1000),
        file_reserved_time_hours=config.file_reserved_hours,  # type: ignore[arg-type]  # hours may be fractional
        delete_when=config.delete_when,
        disk_max_used_space_ratio=config.disk_max_used_ratio,
        access_message_in_memory_max_ratio=config.access_message_in_memory_max_ratio,
        store_host=(config.broker_ip, config.listen_port),
        trust_clean_stop=config.trust_clean_stop,
    )
