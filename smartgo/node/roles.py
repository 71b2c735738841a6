"""The role table: what each `--role` runs. The one place a role's actors are declared.

A role (smartgo.actors.role.Role) gives its actors (ActorSpecs, in any order: `after` fixes the
start order), the board fields they publish (each with its single writer), and optionally a
recovery hook the supervisor runs in a separate process before every (re)start of the node's
actors. The entry point (smartgo.node.main) hands this table to the actor runtime, which imports
no role.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from smartgo.actors.board import FieldSpec
from smartgo.actors.role import Role
from smartgo.actors.spec import ActorSpec
from smartgo.broker.ha import failover
from smartgo.broker.recovery import queue_demand
from smartgo.broker.settings import (SCHEDULE, commit_in_net, commit_producers, commitlog_writer, delay_levels,
                                    intent_fields, is_slave, net_names, ring_producers, vip_port)
from smartgo.broker.stats.stats import minute_sample_ms, window_seconds
from smartgo.config import ConfigError, NodeConfig
from smartgo.mqtt.listeners import check_ports_free, mqtt_names, mqtt_ports


def _registry_actors(config: NodeConfig) -> Sequence[ActorSpec]:
    return [ActorSpec("registry", "smartgo.node.registry_actor:RegistryActor")]


# Positions and flags a broker publishes, with their writers (ARCHITECTURE.md, sections actors and broker).
BROKER_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("commitlog.written", "commit", "CommitLog bytes appended (physical offset of the end)"),
    FieldSpec("commitlog.store_ts", "commit", "store timestamp of the last appended record"),
    FieldSpec("commitlog.flushed", "flush", "CommitLog bytes durable on disk"),
    FieldSpec("commitlog.slave_acked", "ha", "master: the highest CommitLog position a slave has reported"),
    FieldSpec("ha.slaves", "ha", "master: slaves connected to the replication service"),
    FieldSpec("ha.sleeping", "ha", "1 while the replication service waits for commit to ring it"),
    FieldSpec("ha.connected", "ha", "slave: 1 while it is connected to its master's replication service"),
    FieldSpec("commitlog.dispatched", "dispatch", "CommitLog bytes indexed into ConsumeQueue/IndexFile"),
    FieldSpec("commitlog.min", "cleanup", "start of the oldest CommitLog file still on disk"),
    FieldSpec("dispatch.store_ts", "dispatch", "store timestamp of the last dispatched record"),
    FieldSpec("dispatch.sleeping", "dispatch", "1 while dispatch sleeps until commit rings it"),
    FieldSpec("flush.sleeping", "flush", "1 while flush sleeps until commit rings it (sync flush)"),
    FieldSpec("hold.watching", "hold", "1 while pulls are parked (dispatch then sends arrival notices)"),
    FieldSpec("hold.woken_ms", "hold", "monotonic ms when a parked pull was last woken by an arrival (dispatch "
                                       "keeps its rounds close together while consumers follow the head)"),
    FieldSpec("flag.disk_full", "cleanup", "1 while the disk is over the refuse-writes watermark"),
    FieldSpec("disk.used_permille", "cleanup", "disk usage of the store's file system, per mille"),
    FieldSpec("cleanup.commitlog_asked", "broker", "DELETE_EXPIRED_COMMITLOG requests: cleanup deletes expired "
                                                   "CommitLog files now, whatever the hour"),
    FieldSpec("cleanup.commitlog_done", "cleanup", "the last cleanup.commitlog_asked served"),
    FieldSpec("cleanup.queues_asked", "broker", "CLEAN_EXPIRED_CONSUMEQUEUE requests: cleanup deletes ConsumeQueue "
                                                "and index files below the CommitLog minimum now"),
    FieldSpec("cleanup.queues_done", "cleanup", "the last cleanup.queues_asked served"),
    FieldSpec("scrub.damaged", "cleanup", "damaged CommitLog ranges the background scrub found since the start "
                                          "(repaired at the next start)"),
    FieldSpec("flag.read_only", "broker", "1 while brokerPermission forbids sends"),
    FieldSpec("flag.unreadable", "broker", "1 while brokerPermission forbids pulls"),
    FieldSpec("failover.fenced", "broker", "1 while a failover master writes nothing: unconfirmed, or handing its "
                                           "role over (sends refused, delayed messages held)"),
    FieldSpec("commit.fenced", "commit", "1 once commit refuses writes for failover.fenced: commitlog.written is "
                                         "final while it stays"),
    FieldSpec("broker.topics_version", "broker", "dataVersion counter of the topic snapshot file"),
    FieldSpec("schedule.idle", SCHEDULE, "bit level-1 set: that delay level sleeps until entries arrive (dispatch "
                                         "rings schedule)"),
)


def _broker_fields(config: NodeConfig) -> Sequence[FieldSpec]:
    nets = commit_producers(config)
    writer = commitlog_writer(config)            # a slave's CommitLog is written by replication
    own = tuple(replace(f, writer=writer) if f.writer == "commit" else f for f in BROKER_FIELDS)
    return (*own, *(FieldSpec(name, writer, doc) for name, doc in intent_fields(ring_producers(config))),
            *(FieldSpec(f"{net}.flush_wait", net, "lowest end offset a sync-flush send of this net actor waits "
                                                  "for; 0 = none") for net in nets))


def _broker_actors(config: NodeConfig) -> Sequence[ActorSpec]:
    """The broker data path (docs/ARCHITECTURE.md, section broker). Start order: flush, then
    dispatch, then commit and hold, then the net actors, then schedule; stop order is the reverse,
    so schedule and the net actors drain before the commit stage stops, and it stops before
    dispatch's last round; flush goes last. With one net actor the commit stage runs inside it
    (commit_in_net): no commit actor, and schedule follows the net actor. A slave has no commit
    and no schedule actor: its ha actor writes the CommitLog."""
    nets = net_names(config)
    producers = commit_producers(config)        # the net actors and the schedule actor
    delay_levels(config)                        # a malformed table or timer setting is a settings error (exit 2)
    window_seconds(config)                      # so is a stats window that does not tile an hour
    minute_sample_ms(config)                    # and a stats sample interval that is not above 0
    slave = is_slave(config)
    if slave != (config.broker_id != 0):
        raise ConfigError(f"broker_id {config.broker_id}: a master is 0, a slave 1 or more (RocketMQ brokerId)")
    if slave and config.replication == "sync":
        raise ConfigError("replication=sync is a master's setting (SYNC_MASTER); a slave only follows")
    pkg = "smartgo.broker.actors"
    specs = []
    broker_after: tuple[str, ...] = ()
    if not config.registry:
        specs.append(ActorSpec("registry", "smartgo.node.registry_actor:RegistryActor",
                               kwargs={"port": config.embedded_registry_port, "subdir": "registry"}))
        broker_after = ("registry",)
    writer = commitlog_writer(config)
    specs += [
        ActorSpec("flush", f"{pkg}.flush_actor:FlushActor", kwargs={"nets": producers}),
        ActorSpec("dispatch", f"{pkg}.dispatch_actor:DispatchActor", after=("flush",)),
        ActorSpec("ha", f"{pkg}.ha_actor:HAActor", kwargs={"nets": nets}, after=("dispatch",)),
    ]
    if not slave and not commit_in_net(config):
        specs.append(ActorSpec("commit", f"{pkg}.commit_actor:CommitActor", kwargs={"nets": producers},
                               after=("ha",)))
    specs += [
        ActorSpec("hold", f"{pkg}.hold_actor:HoldActor", kwargs={"nets": nets}, after=("dispatch",)),
        ActorSpec("cleanup", f"{pkg}.cleanup_actor:CleanupActor"),
        ActorSpec("broker", f"{pkg}.broker_actor:BrokerActor", kwargs={"nets": nets}, after=broker_after),
    ]
    net_after = tuple(dict.fromkeys((writer if writer not in nets else "ha", "hold", "broker", "cleanup")))
    specs += [ActorSpec(net, f"{pkg}.net_actor:NetActor", after=net_after) for net in nets]
    if not slave:                   # after the CommitLog writer (a net actor hosting the commit stage, or commit)
        specs.append(ActorSpec(SCHEDULE, f"{pkg}.schedule_actor:ScheduleActor", after=(writer,)))
    if mqtt_ports(config):          # a slave's too: its devices' publishes go to its master
        check_ports_free(config)
        specs += [ActorSpec(name, "smartgo.mqtt.actor:MqttActor", after=tuple(nets)) for name in mqtt_names(config)]
    return specs


_RECOVER = "smartgo.broker.recovery:recover_broker"


def _net_ports(config: NodeConfig) -> Sequence[int]:
    ports = [port for port in (config.listen_port, vip_port(config)) if port]
    return [*ports, *(port for _, port in mqtt_ports(config))]


def _broker_ports(config: NodeConfig) -> Sequence[tuple[str, int]]:
    """Clients, VIP channel, replication (a master serves it; a slave's ha actor only connects),
    the embedded registry (without --registry) and the metrics page; a port that is off is left out."""
    ports = [("clients", config.listen_port), ("vip", vip_port(config)),
             ("ha", 0 if is_slave(config) else config.ha_port or config.listen_port + 1),
             ("registry", 0 if config.registry else config.embedded_registry_port), ("metrics", config.metrics_port),
             *mqtt_ports(config)]
    return [(what, port) for what, port in ports if port]


ROLES: dict[str, Role] = {
    "registry": Role("registry", 9876, _registry_actors, ports=lambda config: [("registry", config.listen_port)]),
    "master": Role("master", 10911, _broker_actors, _broker_fields, recover=_RECOVER, configure=failover.apply,
                   shared_ports=_net_ports, queue_demand=queue_demand, ports=_broker_ports),
    "slave": Role("slave", 10911, _broker_actors, _broker_fields, recover=_RECOVER, configure=failover.apply,
                  shared_ports=_net_ports, queue_demand=queue_demand, ports=_broker_ports),
}
