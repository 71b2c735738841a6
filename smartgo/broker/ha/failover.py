"""Automatic failover, the broker's side (5.x's controller mode, reduced to what 4.x clients need).

With failover_enable the role of a broker is the failover registry's to change
(smartgo.registry.controller). <store>/config/role.json records what it last said: the role,
the brokerId, the epoch (the number of the master term of this broker name the node last
served or followed), for a master where its term began in the CommitLog, and for a demoted
master the offset its CommitLog is cut to at the next recovery: what it wrote in its term that
the slave promoted in its place never had (never acknowledged under replication=sync).

The broker actor is the file's only writer; the supervisor reads it before every node life
(the role there wins over --role) and recovery before it cuts. Without the file the command
line's role holds, at epoch 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from smartgo.common.persist import RecordFile
from smartgo.config import NodeConfig
from smartgo.net.codes import NO_OFFSET

ROLE_FILE = "config/role.json"


@dataclass(frozen=True, slots=True)
class RoleState:
    role: str                       # "master" or "slave"
    broker_id: int
    epoch: int = 0
    epoch_start: int = NO_OFFSET    # a master: the CommitLog end when its term began (recorded at its first start)
    truncate_to: int = NO_OFFSET    # a demoted master: cut the CommitLog here at the next recovery


def enabled(config: NodeConfig) -> bool:
    return config.failover_enable


def _check(state: RoleState) -> None:
    if state.role not in ("master", "slave") or (state.broker_id == 0) != (state.role == "master"):
        raise ValueError(f"role {state.role!r} with brokerId {state.broker_id}")


def _file(store_path: Path) -> RecordFile[RoleState]:
    return RecordFile(Path(store_path) / ROLE_FILE, RoleState, "failover role", _check)


def load(store_path: Path) -> RoleState | None:
    return _file(store_path).load()


def save(store_path: Path, state: RoleState) -> None:
    _file(store_path).save(state)


def current(config: NodeConfig) -> RoleState:
    """The role this node runs as: the file's under failover, else the command line's at epoch 0."""
    state = load(config.store_path) if enabled(config) else None
    return state or RoleState(config.role, config.broker_id)


def apply(config: NodeConfig) -> NodeConfig:
    """config (resolved: its store path no longer depends on the role) with the role it was last
    given. A failover slave may be set to replication=sync: the setting of its terms as a master."""
    if not enabled(config):
        return config
    state = current(config)
    return replace(config, role=state.role, broker_id=state.broker_id,
                   replication=config.replication if state.role == "master" else "async")
