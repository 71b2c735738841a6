"""The role table: what each `--role` runs. The one place a role's actors are declared.

A role gives its actors (ActorSpecs, in any order: `after` fixes the start order), the board
fields they publish (each with its single writer), and optionally a recovery hook the supervisor
runs in a separate process before every (re)start of the node's actors.

Extra actors from the config file's [[actor]] tables are appended to any role's list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from smartgo.actors.board import FieldSpec
from smartgo.actors.spec import ActorSpec
from smartgo.config import ConfigError, NodeConfig


@dataclass(frozen=True)
class Role:
    name: str
    default_port: int
    actors: Callable[[NodeConfig], Sequence[ActorSpec]] | None
    board_fields: Callable[[NodeConfig], Sequence[FieldSpec]] = field(default=lambda config: ())
    # "package.module:function", called as function(config: NodeConfig) in a child process before
    # the actors start; a non-zero exit (or an exception) fails the node start.
    recover: str | None = None
    # Why the role cannot run yet (actors is None).
    unavailable: str = ""


def _registry_actors(config: NodeConfig) -> Sequence[ActorSpec]:
    return [ActorSpec("registry", "smartgo.actors.registry_actor:RegistryActor")]


# Positions and flags a broker publishes, with their writers (ARCHITECTURE.md section 2).
BROKER_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("commitlog.written", "commit", "CommitLog bytes appended (physical offset of the end)"),
    FieldSpec("commitlog.flushed", "flush", "CommitLog bytes durable on disk"),
    FieldSpec("commitlog.slave_acked", "ha", "CommitLog bytes a slave has acknowledged"),
    FieldSpec("commitlog.dispatched", "dispatch", "CommitLog bytes indexed into ConsumeQueue/IndexFile"),
    FieldSpec("flag.disk_full", "cleanup", "1 while the disk is over the refuse-writes watermark"),
    FieldSpec("flag.read_only", "broker", "1 while the broker refuses writes (permission/config)"),
)

_BROKER_PENDING = "the broker actors arrive with the broker data-path issue (#6)"

ROLES: dict[str, Role] = {
    "registry": Role("registry", 9876, _registry_actors),
    "master": Role("master", 10911, None, lambda config: BROKER_FIELDS, unavailable=_BROKER_PENDING),
    "slave": Role("slave", 10911, None, lambda config: BROKER_FIELDS, unavailable=_BROKER_PENDING),
}


def node_actors(config: NodeConfig, role: Role) -> list[ActorSpec]:
    """The role's actors plus the config file's extra ones."""
    assert role.actors is not None
    specs = list(role.actors(config))
    for i, table in enumerate(config.actor):
        if not isinstance(table, dict):
            raise ConfigError(f"[[actor]] entry {i + 1} is not a table")
        specs.append(ActorSpec.from_dict(table))
    return specs
