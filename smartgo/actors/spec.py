"""ActorSpec: how a role declares one actor, and the start/stop order of a set of them."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PERMANENT = "permanent"   # always restarted (the default: every broker actor)
TRANSIENT = "transient"   # restarted only after an abnormal exit (non-zero status or a signal)
TEMPORARY = "temporary"   # never restarted
RESTART_POLICIES = (PERMANENT, TRANSIENT, TEMPORARY)


class SpecError(ValueError):
    """A malformed actor declaration or dependency graph."""


@dataclass(frozen=True)
class ActorSpec:
    """One actor of a role.

    name: unique in the node, 1..32 bytes (its board slot, log prefix, ring/doorbell names).
    cls: "package.module:Class" of an Actor subclass, imported in the child process.
    kwargs: keyword arguments for the class, msgpack-able data only (they cross the spawn).
    after: actors that must be ready before this one starts; it is stopped before them.
    heartbeat_deadline: seconds without heartbeat before a kill; None = the node's setting.
    restart: permanent, transient or temporary (OTP's restart types).
    """
    name: str
    cls: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    after: tuple[str, ...] = ()
    heartbeat_deadline: float | None = None
    restart: str = PERMANENT

    def __post_init__(self) -> None:
        if not self.name or len(self.name.encode()) > 32 or "/" in self.name:
            raise SpecError(f"actor name {self.name!r} must be 1..32 bytes without '/'")
        if ":" not in self.cls:
            raise SpecError(f"actor {self.name}: cls must look like 'package.module:Class', got {self.cls!r}")
        if self.restart not in RESTART_POLICIES:
            raise SpecError(f"actor {self.name}: restart must be one of {RESTART_POLICIES}")
        object.__setattr__(self, "after", tuple(self.after))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["after"] = list(self.after)
        return d

    @classmethod
    def from_dict(cls, data: dict) -> ActorSpec:
        """From a config-file [[actor]] table or a to_dict() result."""
        try:
            return cls(**data)
        except TypeError as e:
            raise SpecError(f"actor declaration {data.get('name', data)!r}: {e}") from None


def import_object(path: str) -> Any:
    """'package.module:attr' -> the attribute."""
    module, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise SpecError(f"cannot import {path!r}: {e}") from None


def start_layers(specs: Sequence[ActorSpec]) -> list[list[ActorSpec]]:
    """Group actors by dependency depth: layer 0 needs nothing, layer k only earlier layers.

    Start runs the layers forward, stop backwards. Unknown names, duplicates and cycles are errors.
    """
    by_name: dict[str, ActorSpec] = {}
    for s in specs:
        if s.name in by_name:
            raise SpecError(f"two actors named {s.name!r}")
        by_name[s.name] = s
    for s in specs:
        for dep in s.after:
            if dep not in by_name:
                raise SpecError(f"actor {s.name!r} starts after unknown actor {dep!r}")
    depth: dict[str, int] = {}
    visiting: set[str] = set()

    def visit(name: str) -> int:
        if name in depth:
            return depth[name]
        if name in visiting:
            raise SpecError(f"actor dependencies form a cycle through {name!r}")
        visiting.add(name)
        d = 1 + max((visit(dep) for dep in by_name[name].after), default=-1)
        visiting.discard(name)
        depth[name] = d
        return d

    for s in specs:
        visit(s.name)
    layers: list[list[ActorSpec]] = [[] for _ in range(1 + max(depth.values(), default=-1))]
    for s in specs:
        layers[depth[s.name]].append(s)
    return layers
