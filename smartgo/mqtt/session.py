"""A client's MQTT session: what outlives its network connection (MQTT 5.0 section 4.1).

Subscriptions, the messages waiting for it, the QoS 1 and 2 messages in flight in both directions
and the packet identifiers they hold. The engine (engine.py) drives it; the session store
(sessions.py) persists it, so a persistent session survives a reconnect and a broker restart.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from smartgo.mqtt.bridge import Delivery
from smartgo.mqtt.codec import SubOptions

#: session_expiry_interval meaning "never" (MQTT 5.0 3.1.2.11.2).
NEVER = 0xFFFFFFFF
MAX_PACKET_ID = 0xFFFF


@dataclass(slots=True)
class Subscription:
    filter: str                 # as subscribed, $share/<group>/ prefix included
    options: SubOptions
    identifier: int = 0         # MQTT 5.0 subscription identifier; 0 = none
    #: what this actor had stored and its feed not yet offered when the subscription was made ("broker/
    #: topic/queue" -> offset): published before it, so not for it live (the retained index has them)
    since: dict[str, int] | None = None


@dataclass(slots=True)
class Outgoing:
    """A message on its way to the client: queued, or in flight under a packet id."""
    delivery: Delivery
    qos: int
    retain: bool
    identifiers: tuple[int, ...] = ()
    released: bool = False      # QoS 2: PUBREC came, PUBREL sent, PUBCOMP awaited
    src: str = ""               # where the message is stored ("broker/topic/queue"), for the session's record
    offset: int = -1

    @property
    def size(self) -> int:
        return len(self.delivery.payload) + len(self.delivery.topic)


class SessionUnavailable(Exception):
    """The session may be held by an actor that does not answer now (it is restarting): the
    CONNECT is refused with "server unavailable" and the device comes back, rather than starting
    over with an empty session."""


#: What an idle session holds instead of an empty deque (624 bytes), set (216) and dict (64): a
#: node keeps a million of them, nearly all with nothing queued and nothing in flight.
NOTHING: tuple[()] = ()
NO_IDS: frozenset[int] = frozenset()
NO_FLIGHT: Mapping[int, Outgoing] = MappingProxyType({})


@dataclass(slots=True, eq=False)
class Session:
    client_id: str
    expiry: int = 0                     # seconds after the connection ends; NEVER = never
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    queue: deque[Outgoing] | tuple[()] = NOTHING     # a deque while anything is queued
    queued_bytes: int = 0
    #: outbound, by packet id (fly/land); the shared NO_FLIGHT while empty
    inflight: dict[int, Outgoing] | Mapping[int, Outgoing] = field(default_factory=lambda: NO_FLIGHT)
    inbound: set[int] | frozenset[int] = NO_IDS      # QoS 2 received, PUBREL awaited
    next_id: int = 1
    connection: Any = None              # the engine's Connection while connected
    ended_at: float = 0.0               # monotonic time the last connection ended; 0 while connected
    epoch: int = 0                      # wall ms of the CONNECT that made this actor its holder
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    dropped: int = 0                    # messages the bounded queue refused
    #: restored from its record: the feed position it had been offered everything up to, per source;
    #: the feed's replay after a restart skips those (None once the replay is over, or never restored)
    through: dict[str, int] | None = None

    def allocate_id(self) -> int:
        """A packet id not in use by an outbound message in flight (a session holds at most the
        client's receive maximum of them, far below 65,535)."""
        pid = self.next_id
        while pid in self.inflight:
            pid = pid % MAX_PACKET_ID + 1
        self.next_id = pid % MAX_PACKET_ID + 1
        return pid

    def enqueue(self, out: Outgoing, max_messages: int, max_bytes: int) -> bool:
        """Queue a message; False (and counted) when the session's bound is reached."""
        if len(self.queue) >= max_messages or self.queued_bytes + out.size > max_bytes:
            self.dropped += 1
            return False
        self.keep(out)
        return True

    def keep(self, out: Outgoing) -> None:
        """Queue a message whatever the bound (one its stored record had queued)."""
        queue = self.queue
        if not isinstance(queue, deque):
            queue = self.queue = deque()
        queue.append(out)
        self.queued_bytes += out.size

    def pop(self) -> Outgoing:
        queue = self.queue
        assert isinstance(queue, deque), "pop from an empty queue"
        out = queue.popleft()
        self.queued_bytes -= out.size
        if not queue:
            self.queue = NOTHING
        return out

    def fly(self, pid: int, out: Outgoing) -> None:
        """out is sent (or about to be) under pid: in flight until acknowledged."""
        inflight = self.inflight
        if not isinstance(inflight, dict):
            inflight = self.inflight = {}
        inflight[pid] = out

    def land(self, pid: int) -> Outgoing | None:
        """pid acknowledged (or given up): its message, None if it was not in flight."""
        inflight = self.inflight
        if not isinstance(inflight, dict):
            return None
        out = inflight.pop(pid, None)
        if not inflight:
            self.inflight = NO_FLIGHT
        return out

    def received(self, pid: int) -> None:
        """A QoS 2 publish stored: its PUBREL is awaited."""
        inbound = self.inbound
        if not isinstance(inbound, set):
            inbound = self.inbound = set()
        inbound.add(pid)

    def released(self, pid: int) -> bool:
        """PUBREL for pid: whether it was awaited."""
        inbound = self.inbound
        if not isinstance(inbound, set) or pid not in inbound:
            return False
        inbound.remove(pid)
        if not inbound:
            self.inbound = NO_IDS
        return True

    def expired(self, now: float) -> bool:
        return (self.connection is None and self.expiry != NEVER
                and now - self.ended_at >= self.expiry)
