"""What a pull needs to know about its consumer group, as the broker actor publishes it to the
net actors: the group's config (consumeEnable, consumeBroadcastEnable), whether a consumer of it
is online with which message model, and the subscription it registered per topic (tag codes,
subVersion, expression type, and a SQL92 subscription's expression).

The broker actor owns the truth (groups.py, clients.py) and sends each group's state whenever
it changes (channel event "group") and the whole table when a net actor asks ("groups", at its
start, after a broker restart, or when it saw a gap in the event sequence). A net actor keeps
the latest state per group in a GroupsView and checks pulls against it with no round trip.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RegisteredSub:
    codes: frozenset[int] | None            # tag hash codes; None reads every tag ("*")
    version: int                            # subVersion
    expression_type: str
    expression: str | None = None           # the SQL92 text (subString) of a non-TAG subscription


@dataclass(frozen=True, slots=True)
class GroupState:
    configured: bool = False                # a subscription group config exists
    consume_enable: bool = True
    broadcast_enable: bool = True
    model: str | None = None                # CLUSTERING / BROADCASTING; None: no consumer online
    subs: dict[str, RegisteredSub] = field(default_factory=dict)

    def to_wire(self) -> list:
        return [self.configured, self.consume_enable, self.broadcast_enable, self.model or "",
                {t: [None if s.codes is None else sorted(s.codes), s.version, s.expression_type, s.expression]
                 for t, s in sorted(self.subs.items())}]

    @classmethod
    def from_wire(cls, raw: list) -> GroupState:
        configured, enable, broadcast, model, subs = raw
        return cls(configured, enable, broadcast, model or None,
                   {t: RegisteredSub(None if codes is None else frozenset(codes), version, expr, text)
                    for t, (codes, version, expr, text) in subs.items()})


#: The state of a group nobody configured and no consumer registered (a pull of it is checked
#: as the defaults when groups are created automatically).
UNKNOWN = GroupState()


class GroupsView:
    """The net actor's copy: group name -> GroupState."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupState] = {}
        self.loaded = False

    def get(self, name: str) -> GroupState:
        return self.groups.get(name, UNKNOWN)

    def apply(self, name: str, wire: list | None) -> None:
        if wire is None:
            self.groups.pop(name, None)
        else:
            self.groups[name] = GroupState.from_wire(wire)

    def replace(self, table: dict[str, list]) -> None:
        self.groups = {name: GroupState.from_wire(w) for name, w in table.items()}
        self.loaded = True
