"""What the actor runtime needs to know of a role: its actors, board fields, recovery hook, ports.

The roles themselves (registry, master, slave) are declared above the runtime, in
smartgo.node.roles, and handed to the supervisor (Arbiter) by the entry point.

Extra actors from the config file's [[actor]] tables are appended to any role's list; a table with
only the name of one of the role's actors and a heartbeat_deadline sets that actor's own deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from smartgo.actors.board import FieldSpec
from smartgo.actors.spec import ActorSpec
from smartgo.config import ConfigError, NodeConfig


@dataclass(frozen=True)
class Role:
    name: str
    default_port: int
    actors: Callable[[NodeConfig], Sequence[ActorSpec]]
    board_fields: Callable[[NodeConfig], Sequence[FieldSpec]] = field(default=lambda config: ())
    # "package.module:function", called as function(config: NodeConfig) in a child process before
    # the actors start; a non-zero exit (or an exception) fails the node start.
    recover: str | None = None
    # The config of each node life: automatic failover may have changed the role the command line gave.
    configure: Callable[[NodeConfig], NodeConfig] = field(default=lambda config: config)
    # Entries of the board's per-queue table this node life needs at least (the queues in its store).
    queue_demand: Callable[[NodeConfig], int] = field(default=lambda config: 0)
    # Ports its actors share through SO_REUSEPORT: the supervisor locks them for its life, since the
    # kernel would let a second node of the same user bind them too and take half the connections.
    shared_ports: Callable[[NodeConfig], Sequence[int]] = field(default=lambda config: ())
    # Every port the node listens on, (what, port) in the order the "node ready" line names them.
    ports: Callable[[NodeConfig], Sequence[tuple[str, int]]] = field(default=lambda config: ())


def node_actors(config: NodeConfig, role: Role) -> list[ActorSpec]:
    """The role's actors plus the config file's extra ones, with the deadlines it sets for its own."""
    specs = list(role.actors(config))
    own = {s.name: i for i, s in enumerate(specs)}
    for i, table in enumerate(config.actor):
        if not isinstance(table, dict):
            raise ConfigError(f"[[actor]] entry {i + 1} is not a table")
        if table.keys() == {"name", "heartbeat_deadline"} and table["name"] in own:
            j = own[table["name"]]
            specs[j] = replace(specs[j], heartbeat_deadline=float(table["heartbeat_deadline"]))
        else:
            specs.append(ActorSpec.from_dict(table))
    return specs
