"""The MQTT server state machine of one MQTT actor: connections, sessions, subscriptions, flows.

Bytes come in through `Connection.data_received`; what the engine answers goes out through the
connection's transport. It owns no socket and no store: a device's PUBLISH goes to `StoreSide`
(the actor stores it as a SmartGo message and says when the store has it), and deliveries come
back through `deliver` from the feed of stored messages, so a message reaches its subscribers the
same way whichever node of the cluster it was published on. MQTT 3.1, 3.1.1 and 5.0 are served
by the same code; `version` decides the packets' shapes and which reason codes a client can be told.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from smartgo.mqtt import codec as c
from smartgo.mqtt.auth import Account, Authenticator
from smartgo.mqtt.bridge import Delivery, delivery_from_message, publish_properties
from smartgo.mqtt.session import NEVER, Outgoing, Session, SessionUnavailable, Subscription
from smartgo.mqtt.stats import MqttStats
from smartgo.mqtt.topics import (RetainedIndex, SubscriptionIndex, matches, split_share, valid_filter,
                                 valid_topic_name)
from smartgo.net.limits import worth_logging
from smartgo.net.wheel import TimingWheel

log = logging.getLogger(__name__)

#: Close reasons that do not publish the will (MQTT 5.0 3.1.2.5: a normal DISCONNECT).
Done = Callable[[int], None]


#: Store answers no retry changes: a 3.1.1 client is acknowledged (and the publish dropped, logged),
#: as for a topic it may not publish to, instead of being closed to send it again forever.
REFUSED_FOR_GOOD = frozenset((c.TOPIC_NAME_INVALID, c.NOT_AUTHORIZED, c.IMPLEMENTATION_SPECIFIC))


def retained(p: c.Publish, client_id: str) -> Delivery | None:
    """The retained message a stored publish leaves (None: an empty one deletes), as the store's copy
    reads back: its expiry absolute, so what remains of it is what later subscribers are told."""
    if not p.payload:
        return None
    now_ms = int(time.time() * 1000)
    props = publish_properties(p.topic, p.qos, True, client_id, p.properties, now_ms)
    return delivery_from_message(p.topic, props, bytes(p.payload), now_ms)


def _nothing(client_id: str) -> None:
    return None


def _publish_properties(conn: Connection, out: Outgoing) -> dict[str, Any]:
    """The 5.0 PUBLISH properties of a delivery: what the publisher gave, what remains of its expiry,
    the identifiers of the subscriptions it matched (none for an older client)."""
    if conn.version != 5:
        return {}
    d = out.delivery
    props = dict(d.properties)
    if d.expires_ms:
        props["message_expiry_interval"] = max(0, int((d.expires_ms - time.time() * 1000) // 1000))
    if out.identifiers:
        props["subscription_identifier"] = list(out.identifiers)
    return props


class StoreSide(Protocol):
    """Where device publishes go: `store` calls `done(reason)` once the store has the message
    (reason 0) or refused it (an MQTT 5.0 reason code)."""

    def store(self, publish: c.Publish, client_id: str, done: Done) -> None: ...

    def session_changed(self, session: Session) -> None: ...

    def session_ended(self, client_id: str) -> None: ...

    def when_persisted(self, session: Session, then: Callable[[], None]) -> None: ...

    def unfed(self) -> dict[str, int]: ...

    def claim(self, session: Session) -> None: ...

    def forgotten(self, client_id: str) -> None: ...

    def find_session(self, client_id: str, clean: bool,
                     then: Callable[[Session | SessionUnavailable | None], None]) -> None: ...


@dataclass(slots=True)
class Limits:
    max_packet_size: int = 1 << 20
    receive_maximum: int = 1024             # QoS 1/2 publishes a client may have unanswered
    topic_alias_maximum: int = 64
    max_queued_messages: int = 1000         # per session, while away or over its receive maximum
    max_queued_bytes: int = 16 << 20
    connect_timeout: float = 10.0
    max_keep_alive: int = 0                 # 0 = the client's own
    max_session_expiry: int = NEVER
    max_connections: int = 1 << 62          # more CONNECTs get "server busy" (net.limits.connections_per_actor)


class Connection(asyncio.Protocol):
    """One network connection (TCP, TLS or a WebSocket's MQTT stream). Small on purpose: a node
    holds very many of them."""

    __slots__ = ("engine", "transport", "decoder", "version", "session", "client_id", "keep_alive", "last_seen",
                 "aliases", "send_quota", "max_packet", "will", "will_delay", "account", "closed",
                 "clean", "inbound_pending", "listener", "waiting", "out")

    def __init__(self, engine: Engine, listener: str) -> None:
        self.engine = engine
        self.listener = listener
        self.transport: Any = None
        self.decoder = c.Decoder(max_packet_size=engine.limits.max_packet_size)
        self.version = 4
        self.session: Session | None = None
        self.client_id = ""
        self.keep_alive = 0
        self.last_seen = 0.0
        self.aliases: dict[int, str] | None = None
        self.send_quota = 65535          # the client's receive maximum (5.0)
        self.max_packet = 0              # the client's maximum packet size; 0 = no limit
        self.will: c.Will | None = None
        self.will_delay = 0
        self.account: Account | None = None
        self.closed = False
        self.clean = False               # a DISCONNECT came: no will
        self.inbound_pending = 0         # QoS 1/2 publishes stored but not yet answered
        self.waiting: list | None = None  # packets that came while its session is looked up elsewhere
        self.out: list[bytes] | None = None   # written at the end of this event-loop turn

    # ---- asyncio.Protocol ----------------------------------------------------------------------
    @property
    def peer(self) -> str:
        """host:port, for logs (asked of the transport: not a string per idle connection)."""
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "?")

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.engine.opened(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_seen = self.engine.now()
        try:
            packets = self.decoder.feed(data)
        except c.MqttError as exc:
            self._handle(exc.packets)          # what came whole before the bad one is served
            if self.closed:
                return
            if isinstance(exc, c.UnsupportedProtocolVersion):
                # 3.1.1 section 3.1.2.2: CONNACK 1, then close (the 3.1.1 shape every version reads)
                self.transport.write(c.encode(c.ConnAck(False, c.REFUSED_PROTOCOL_VERSION, {}), 4))
            self.engine.bad_input(self, exc.reason, str(exc))
            return
        self._handle(packets)

    def _handle(self, packets: list) -> None:
        engine = self.engine
        engine.progress[0] += 1
        for i, packet in enumerate(packets):
            if self.closed:
                return
            if self.waiting is not None:
                self.waiting.extend(packets[i:])
                return
            engine.handle(self, packet)

    def connection_lost(self, exc: Exception | None) -> None:
        self.engine.closed(self, "connection lost" if exc is None else f"connection lost: {exc}")

    def send(self, packet: Any) -> None:
        if not self.closed:
            self.write(c.encode(packet, self.version))

    def write(self, data: bytes) -> None:
        """Bytes for the client, written once per event-loop turn with what else is for it (a
        batch of PUBACKs or deliveries is one send, not one each)."""
        out = self.out
        if out is not None:
            out.append(data)
        elif self.engine.hold_write(self):
            self.out = [data]
        else:
            self.transport.write(data)

    def flush(self) -> None:
        out = self.out
        if out is not None:
            self.out = None
            if not self.closed:
                self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.transport.close()


@dataclass(slots=True)
class _Shared:
    next: int = 0


@dataclass
class Engine:
    limits: Limits
    store: StoreSide
    auth: Authenticator
    stats: MqttStats = field(default_factory=MqttStats)
    now: Callable[[], float] = time.monotonic
    sessions: dict[str, Session] = field(default_factory=dict)
    index: SubscriptionIndex[Subscription] = field(default_factory=SubscriptionIndex)
    retained: RetainedIndex[Delivery] = field(default_factory=RetainedIndex)
    wheel: TimingWheel[Connection] = field(default_factory=TimingWheel)
    expiries: TimingWheel[Session] = field(default_factory=TimingWheel)    # sessions away, by expiry
    shared: dict[tuple[str, str], _Shared] = field(default_factory=dict)
    wills: list[tuple[float, str, c.Will, str]] = field(default_factory=list)   # delayed wills
    connections: int = 0
    writers: list[Connection] = field(default_factory=list)    # connections with output held this turn
    #: a client's session is in sessions now / is no more (the node's directory.SessionDirectory)
    held: Callable[[str], None] = _nothing
    let_go: Callable[[str], None] = _nothing
    #: units of work done, one a read or an accept: the actor's board cell, so that the supervisor's
    #: watchdog sees an actor deep in a connect storm as busy, not hung
    progress: Any = field(default_factory=lambda: [0])

    def hold_write(self, conn: Connection) -> bool:
        """Hold conn's output until the end of this turn (False outside an event loop: write now)."""
        if not self.writers:
            try:
                asyncio.get_running_loop().call_soon(self._flush_writes)
            except RuntimeError:
                return False
        self.writers.append(conn)
        return True

    def _flush_writes(self) -> None:
        writers, self.writers = self.writers, []
        for conn in writers:
            conn.flush()

    # ---- connections ---------------------------------------------------------------------------
    def opened(self, conn: Connection) -> None:
        self.progress[0] += 1
        self.connections += 1
        self.stats.connections = self.connections
        conn.last_seen = self.now()
        self.wheel.add(conn.last_seen + self.limits.connect_timeout, conn)

    def closed(self, conn: Connection, why: str) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.connections -= 1
        self.stats.connections = self.connections
        session = conn.session
        if session is None or session.connection is not conn:
            return                       # never connected, or taken over
        session.connection = None
        session.ended_at = self.now()
        log.debug("mqtt %s (%s): %s", conn.client_id, conn.peer, why)
        if conn.will is not None and not conn.clean:
            self._will(conn, session)
        if session.expiry == 0:
            self._end_session(session)
        else:
            self._away(session)
            self.store.session_changed(session)

    def bad_input(self, conn: Connection, reason: int, why: str) -> None:
        """A packet the standard forbids: the disconnect it prescribes, a log line, and only this
        connection goes (MQTT 5.0 4.13)."""
        self.stats.bad_packets += 1
        log.warning("mqtt %s (%s): %s; disconnecting (reason 0x%02X)", conn.client_id or "-", conn.peer, why,
                    reason)
        self.disconnect(conn, reason, why)

    def disconnect(self, conn: Connection, reason: int, why: str = "") -> None:
        if conn.closed:
            return
        if conn.version == 5 and conn.session is not None:
            props = {"reason_string": why[:200]} if why else {}
            conn.send(c.Disconnect(reason, props))
        conn.close()
        self.closed(conn, why)

    def tick(self) -> None:
        """Once a second: keep-alive and CONNECT deadlines (a timing wheel: the cost is the
        connections due, not all of them), delayed wills, expired sessions."""
        now = self.now()
        for conn in self.wheel.due(now):
            if conn.closed:
                continue
            if conn.session is None:
                if conn.client_id:                  # its CONNECT came: its session is being looked up
                    self.wheel.add(now + self.limits.connect_timeout, conn)
                    continue
                self.stats.connect_timeouts += 1
                log.warning("mqtt %s: no CONNECT within %gs; closing", conn.peer, self.limits.connect_timeout)
                conn.close()
                self.closed(conn, "no CONNECT")
                continue
            if conn.keep_alive == 0:
                continue
            deadline = conn.last_seen + conn.keep_alive * 1.5
            if deadline <= now:
                self.stats.keep_alive_timeouts += 1
                log.info("mqtt %s (%s): nothing for %gs (keep-alive %ds); closing", conn.client_id, conn.peer,
                         now - conn.last_seen, conn.keep_alive)
                self.disconnect(conn, c.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
            else:
                self.wheel.add(deadline, conn)
        if self.wills:
            due = [w for w in self.wills if w[0] <= now]
            if due:
                self.wills = [w for w in self.wills if w[0] > now]
                for _, client_id, will, _ in due:
                    self._publish_will(client_id, will)
        for session in self.expiries.due(now):
            if self.sessions.get(session.client_id) is session and session.expired(now):
                self._end_session(session)

    # ---- packets -------------------------------------------------------------------------------
    def handle(self, conn: Connection, packet: Any) -> None:
        kind = type(packet)
        if kind is c.Publish:
            self._publish(conn, packet)
        elif kind is c.PubAck or kind is c.PubComp:
            self._acked(conn, packet.packet_id)
        elif kind is c.PubRec:
            self._pubrec(conn, packet)
        elif kind is c.PubRel:
            self._pubrel(conn, packet)
        elif kind is c.PingReq:
            conn.send(c.PingResp())
        elif kind is c.Subscribe:
            self._subscribe(conn, packet)
        elif kind is c.Unsubscribe:
            self._unsubscribe(conn, packet)
        elif kind is c.Connect:
            if conn.session is not None:
                self.bad_input(conn, c.PROTOCOL_ERROR, "a second CONNECT")
            else:
                self._connect(conn, packet)
        elif kind is c.Disconnect:
            self._disconnect(conn, packet)
        elif kind is c.Auth:
            self.bad_input(conn, c.BAD_AUTH_METHOD, "enhanced authentication (AUTH) is not offered")
        else:
            self.bad_input(conn, c.PROTOCOL_ERROR, f"a client may not send {kind.__name__}")

    def _connect(self, conn: Connection, p: c.Connect) -> None:
        conn.version = p.protocol_level
        v5 = conn.version == 5
        if self.connections > self.limits.max_connections:
            self.stats.busy += 1
            if worth_logging(self.stats.busy):
                log.warning("mqtt: %d connections, this actor's limit (its open-files limit less what it keeps "
                            "for itself): CONNECT refused with server busy, %d so far (logged at 1, 10, 100, "
                            "1000, then every 10,000; --mqtt-connections starts more MQTT actors)",
                            self.connections - 1, self.stats.busy)
            self._refuse(conn, c.SERVER_BUSY, "server busy: too many connections", logged=False)
            return
        props: dict[str, Any] = {}
        client_id = p.client_id
        if not client_id:
            if not v5 and not p.clean_start:
                self._refuse(conn, c.CLIENT_ID_NOT_VALID, "a zero-length client id needs clean session 1")
                return
            client_id = "auto-" + uuid.uuid4().hex
            if v5:
                props["assigned_client_identifier"] = client_id
        account = self.auth.login(p.username, p.password)
        if account is None:
            self.stats.auth_failures += 1
            if p.username is None:         # nothing bad was sent: no anonymous access (3.1.1 code 5)
                log.warning("mqtt %s (%s): anonymous access is off", client_id, conn.peer)
                self._refuse(conn, c.NOT_AUTHORIZED, "anonymous access is off")
                return
            log.warning("mqtt %s (%s): bad user name or password (user %r)", client_id, conn.peer, p.username)
            self._refuse(conn, c.BAD_USERNAME_OR_PASSWORD, "bad user name or password")
            return
        if p.will is not None and not account.may_publish(p.will.topic):
            self._refuse(conn, c.NOT_AUTHORIZED, f"may not publish the will to {p.will.topic}")
            return
        conn.client_id = client_id
        conn.account = account
        conn.will = p.will
        keep_alive = p.keep_alive
        limits = self.limits
        if limits.max_keep_alive and (keep_alive == 0 or keep_alive > limits.max_keep_alive):
            keep_alive = limits.max_keep_alive
            if v5:
                props["server_keep_alive"] = keep_alive
        conn.keep_alive = keep_alive
        if v5:
            expiry = int(p.properties.get("session_expiry_interval", 0))
            conn.send_quota = int(p.properties.get("receive_maximum", 65535))
            conn.max_packet = int(p.properties.get("maximum_packet_size", 0))
            if p.will is not None:
                conn.will_delay = int(p.will.properties.get("will_delay_interval", 0))
        else:
            expiry = 0 if p.clean_start else NEVER
        if limits.max_session_expiry != NEVER and (expiry == NEVER or expiry > limits.max_session_expiry):
            expiry = limits.max_session_expiry
            if v5:
                props["session_expiry_interval"] = expiry
        if client_id not in self.sessions:
            # perhaps held by another MQTT actor or node: it lets go first (and hands it over unless clean)
            conn.waiting = []
            self.store.find_session(client_id, p.clean_start,
                                    lambda found: self._found(conn, p, props, expiry, found))
            return
        self._accept(conn, p, props, expiry)

    def _found(self, conn: Connection, p: c.Connect, props: dict[str, Any], expiry: int,
               found: Session | SessionUnavailable | None) -> None:
        waiting, conn.waiting = conn.waiting or [], None
        if conn.closed:
            return
        if isinstance(found, SessionUnavailable):
            self._refuse(conn, c.SERVER_UNAVAILABLE, f"the session of {p.client_id} is unavailable now ({found})",
                         logged=False)
            return
        if found is not None and not p.clean_start and found.client_id not in self.sessions:
            self.restore(found, found.through or {})
        self._accept(conn, p, props, expiry)
        for packet in waiting:
            if conn.closed:
                return
            self.handle(conn, packet)

    def _accept(self, conn: Connection, p: c.Connect, props: dict[str, Any], expiry: int) -> None:
        client_id = conn.client_id
        v5 = conn.version == 5
        limits = self.limits
        # takeover: MQTT 5.0 3.1.4-3; the old connection's will goes out unless the session goes on
        session = self.sessions.get(client_id)
        if session is not None and session.connection is not None:
            old = session.connection
            self.stats.takeovers += 1
            log.info("mqtt %s: taken over by %s (was %s)", client_id, conn.peer, old.peer)
            if not p.clean_start:
                old.clean = True
            old_session = session
            session.connection = None
            session.ended_at = self.now()
            if old.version == 5:
                old.send(c.Disconnect(c.SESSION_TAKEN_OVER, {}))
            if old.will is not None and not old.clean:
                self._will(old, old_session)
            old.close()                          # its DISCONNECT goes out first
            old.closed = True
            self.connections -= 1
        self._cancel_will(client_id)
        if p.clean_start and session is not None:
            self._end_session(session)
            session = None
        present = session is not None
        if session is None:
            session = Session(client_id)
            self._keep(session)
        session.expiry = expiry
        session.connection = conn
        session.ended_at = 0.0
        session.epoch = int(time.time() * 1000)
        conn.session = session
        if v5:
            props.update(receive_maximum=limits.receive_maximum, topic_alias_maximum=limits.topic_alias_maximum,
                         maximum_packet_size=limits.max_packet_size, retain_available=1,
                         wildcard_subscription_available=1, subscription_identifier_available=1,
                         shared_subscription_available=1)
        conn.send(c.ConnAck(present, c.SUCCESS, props))
        self.stats.connects += 1
        if conn.keep_alive:
            self.wheel.add(conn.last_seen + conn.keep_alive * 1.5, conn)
        self.store.claim(session)
        self._resume(conn, session)

    def _refuse(self, conn: Connection, reason: int, why: str, logged: bool = True) -> None:
        if logged:
            log.info("mqtt %s: CONNECT refused: %s", conn.peer, why)
        self.stats.refused += 1
        if conn.version == 5:
            conn.send(c.ConnAck(False, reason, {"reason_string": why}))
        else:
            conn.send(c.ConnAck(False, c.connack_code_v3(reason), {}))
        conn.close()
        self.closed(conn, why)

    def _disconnect(self, conn: Connection, p: c.Disconnect) -> None:
        conn.clean = p.reason != c.DISCONNECT_WITH_WILL
        session = conn.session
        if session is not None and conn.version == 5 and "session_expiry_interval" in p.properties:
            new = int(p.properties["session_expiry_interval"])
            if session.expiry == 0 and new != 0:
                self.bad_input(conn, c.PROTOCOL_ERROR, "session expiry set at DISCONNECT after 0 at CONNECT")
                return
            session.expiry = new
        conn.close()
        self.closed(conn, "DISCONNECT")

    # ---- device publishes -----------------------------------------------------------------------
    def _publish(self, conn: Connection, p: c.Publish) -> None:
        if conn.session is None:
            return
        topic = p.topic
        if conn.version == 5 and "topic_alias" in p.properties:
            alias = int(p.properties.pop("topic_alias"))
            if not 0 < alias <= self.limits.topic_alias_maximum:
                self.bad_input(conn, c.TOPIC_ALIAS_INVALID, f"topic alias {alias} is out of range")
                return
            aliases = conn.aliases
            if aliases is None:
                aliases = conn.aliases = {}
            if topic:
                aliases[alias] = topic
            else:
                topic = aliases.get(alias, "")
                if not topic:
                    self.bad_input(conn, c.PROTOCOL_ERROR, f"topic alias {alias} was never set")
                    return
                p.topic = topic
        if not valid_topic_name(topic):
            self.bad_input(conn, c.TOPIC_NAME_INVALID, f"invalid topic name {topic!r}")
            return
        qos = p.qos
        self.stats.count_in(qos)
        if qos == 2 and p.dup and p.packet_id is not None and p.packet_id in conn.session.inbound:
            conn.send(c.PubRec(p.packet_id))          # a resend of one already stored
            return
        if qos and conn.inbound_pending >= self.limits.receive_maximum:
            self.bad_input(conn, c.RECEIVE_MAXIMUM_EXCEEDED, "more QoS 1/2 publishes in flight than receive maximum")
            return
        assert conn.account is not None
        if not conn.account.may_publish(topic):
            self.stats.denied += 1
            log.warning("mqtt %s: not authorized to publish to %s", conn.client_id, topic)
            self._answer(conn, p, c.NOT_AUTHORIZED)
            return
        if qos:
            conn.inbound_pending += 1
        self.store.store(p, conn.client_id, lambda reason: self._stored(conn, p, reason))

    def _stored(self, conn: Connection, p: c.Publish, reason: int) -> None:
        if p.qos:
            conn.inbound_pending -= 1
        if reason == c.SUCCESS:
            if p.retain:
                self.retain(p.topic, retained(p, conn.client_id))
        else:
            self.stats.store_failures += 1
        if conn.closed:
            return
        if reason != c.SUCCESS and conn.version != 5 and p.qos and reason not in REFUSED_FOR_GOOD:
            # 3.1.1 has no negative acknowledgement: closing makes the client send it again later
            log.warning("mqtt %s: publish to %s not stored (0x%02X); closing so the client retries",
                        conn.client_id, p.topic, reason)
            conn.close()
            self.closed(conn, "store refused a publish")
            return
        if reason == c.SUCCESS and p.qos == 2 and conn.session is not None and p.packet_id is not None:
            conn.session.received(p.packet_id)
            self.store.session_changed(conn.session)
        self._answer(conn, p, reason)

    def _answer(self, conn: Connection, p: c.Publish, reason: int) -> None:
        if not p.qos:
            return
        assert p.packet_id is not None
        code = reason if conn.version == 5 else 0
        conn.send(c.PubAck(p.packet_id, code, {}) if p.qos == 1 else c.PubRec(p.packet_id, code, {}))

    def _pubrel(self, conn: Connection, p: c.PubRel) -> None:
        session = conn.session
        if session is None:
            return
        if session.released(p.packet_id):
            self.store.session_changed(session)
            conn.send(c.PubComp(p.packet_id))
        else:
            conn.send(c.PubComp(p.packet_id, c.PACKET_ID_NOT_FOUND if conn.version == 5 else 0, {}))

    # ---- subscriptions --------------------------------------------------------------------------
    def _subscribe(self, conn: Connection, p: c.Subscribe) -> None:
        session = conn.session
        if session is None or conn.account is None:
            return
        v5 = conn.version == 5
        identifier = 0
        ids = p.properties.get("subscription_identifier")
        if ids:
            identifier = int(ids[0] if isinstance(ids, list) else ids)
        reasons = []
        fresh: list[tuple[str, Subscription, bool]] = []
        unfed = self.store.unfed()
        for flt, opts in p.topics:
            group, inner = split_share(flt)
            if not valid_filter(flt):
                reasons.append(c.TOPIC_FILTER_INVALID if v5 else 0x80)
                continue
            if group is not None and opts.no_local:
                self.bad_input(conn, c.PROTOCOL_ERROR, "no local on a shared subscription")
                return
            if not conn.account.may_subscribe(inner):
                self.stats.denied += 1
                log.warning("mqtt %s: not authorized to subscribe to %s", conn.client_id, flt)
                reasons.append(c.NOT_AUTHORIZED if v5 else 0x80)
                continue
            qos = min(opts.qos, 2)
            sub = Subscription(flt, c.sub_options(qos, opts.no_local, opts.retain_as_published, opts.retain_handling),
                               identifier, unfed or None)
            new = flt not in session.subscriptions
            session.subscriptions[flt] = sub
            self.index.add(session.client_id, flt, sub)
            reasons.append(qos)
            fresh.append((flt, sub, new))
        self.stats.subscriptions = len(self.index)
        # SUBACK once the session's record holds the subscription, which a crash then cannot take back
        # (MQTT 5.0 3.8.4 lets the retained messages below go first)
        ack = c.SubAck(p.packet_id, reasons, {})
        self.store.when_persisted(session, lambda: conn.send(ack))
        for flt, sub, new in fresh:
            group, inner = split_share(flt)
            handling = sub.options.retain_handling
            if group is None and (handling == 0 or (handling == 1 and new)):
                for _, d in self.retained.match(inner):
                    self._offer(session, d, min(d.qos, sub.options.qos), True, (sub.identifier,)
                                if sub.identifier else ())

    def _unsubscribe(self, conn: Connection, p: c.Unsubscribe) -> None:
        session = conn.session
        if session is None:
            return
        reasons = []
        for flt in p.filters:
            if session.subscriptions.pop(flt, None) is not None:
                self.index.remove(session.client_id, flt)
                reasons.append(c.SUCCESS)
            else:
                reasons.append(c.NO_SUBSCRIPTION_EXISTED)
        self.stats.subscriptions = len(self.index)
        conn.send(c.UnsubAck(p.packet_id, reasons, {}))
        self.store.session_changed(session)

    # ---- deliveries ----------------------------------------------------------------------------
    def retain(self, topic: str, d: Delivery | None) -> None:
        """A retained message stored (here or on another node); None deletes the topic's."""
        if d is None:
            self.retained.delete(topic)
        else:
            self.retained.set(topic, d)
        self.stats.retained = len(self.retained)

    def deliver(self, d: Delivery, src: str = "", offset: int = -1) -> int:
        """A stored message to every matching subscription; returns the sessions it went to.
        src and offset say where it is stored: a restored session skips what it was offered before."""
        return self.route(d.topic, lambda: d, src, offset)

    def route(self, topic: str, build: Callable[[], Delivery], src: str = "", offset: int = -1) -> int:
        """deliver() of a message built only when a subscription matches its topic (most stored
        messages of a busy cluster have no subscriber on this actor)."""
        matched, shared = self.index.match(topic)
        if not matched and not shared:
            self.stats.unrouted += 1
            return 0
        d = build()
        plain = cast(list[tuple[str, Subscription]], matched)       # owners are client ids
        best: dict[str, tuple[int, list[int], bool]] = {}
        for owner, sub in plain:
            if sub.options.no_local and owner == d.client_id:
                continue
            if sub.since is not None and sub.since.get(src, -1) >= offset:
                continue
            qos = min(d.qos, sub.options.qos)
            prev = best.get(owner)
            if prev is None:
                best[owner] = (qos, [sub.identifier] if sub.identifier else [], sub.options.retain_as_published)
            else:
                if sub.identifier:
                    prev[1].append(sub.identifier)
                best[owner] = (max(prev[0], qos), prev[1], prev[2] or sub.options.retain_as_published)
        sent = 0
        for owner, (qos, ids, rap) in best.items():
            session = self.sessions.get(owner)
            if session is not None and (session.through is None or session.through.get(src, -1) < offset):
                self._offer(session, d, qos, d.retain and rap, tuple(ids), src, offset)
                sent += 1
        for group, flt, members in shared:
            if members:
                sent += self._share(group, flt, cast(list[tuple[str, Subscription]], members), d, src, offset)
        if not sent:
            self.stats.unrouted += 1
        return sent

    def _share(self, group: str, flt: str, members: list[tuple[str, Subscription]], d: Delivery, src: str,
               offset: int) -> int:
        """One member of a shared subscription: round robin over the connected ones first."""
        state = self.shared.get((group, flt))
        if state is None:
            state = self.shared[(group, flt)] = _Shared()
        n = len(members)
        pick = None
        for i in range(n):
            owner, sub = members[(state.next + i) % n]
            session = self.sessions.get(owner)
            if session is not None and session.connection is not None:
                pick = (session, sub)
                state.next = (state.next + i + 1) % n
                break
        if pick is None:
            owner, sub = members[state.next % n]
            state.next = (state.next + 1) % n
            session = self.sessions.get(owner)
            if session is None:
                return 0
            pick = (session, sub)
        session, sub = pick
        if session.through is not None and session.through.get(src, -1) >= offset:
            return 1
        self._offer(session, d, min(d.qos, sub.options.qos), False, (sub.identifier,) if sub.identifier else (),
                    src, offset)
        return 1

    def _offer(self, session: Session, d: Delivery, qos: int, retain: bool, ids: tuple[int, ...], src: str = "",
               offset: int = -1) -> None:
        conn = session.connection
        if conn is None and qos == 0:
            return                                        # QoS 0 is not kept for an absent client
        out = Outgoing(d, qos, retain, ids, False, src, offset)
        if qos:
            self.store.session_changed(session)
        if conn is not None and not session.queue and (qos == 0 or len(session.inflight) < conn.send_quota):
            self._send(conn, session, out)
        elif not session.enqueue(out, self.limits.max_queued_messages, self.limits.max_queued_bytes):
            self.stats.dropped += 1
            if worth_logging(session.dropped):
                log.warning("mqtt %s: its queue is full (%d messages, %d bytes): a message dropped, %d so far "
                            "(logged at 1, 10, 100, 1000, then every 10,000)", session.client_id,
                            len(session.queue), session.queued_bytes, session.dropped)

    def _send(self, conn: Connection, session: Session, out: Outgoing, dup: bool = False) -> None:
        d = out.delivery
        if d.expires_ms and d.expires_ms <= time.time() * 1000:
            self.stats.expired += 1
            return
        pid = None
        if out.qos:
            pid = session.allocate_id()
            session.fly(pid, out)
        packet = c.Publish(d.topic, d.payload, out.qos, out.retain, dup, pid, _publish_properties(conn, out))
        if out.qos == 2:
            # its packet id in the session's record first: a redelivery after a crash reuses it
            self.store.when_persisted(session, lambda: self._write(session, conn, packet, out))
            return
        self._write(session, conn, packet, out)

    def _write(self, session: Session, conn: Connection, packet: c.Publish, out: Outgoing) -> None:
        if session.connection is not conn or conn.closed:
            return                                         # gone meanwhile: the resume sends it
        pid = packet.packet_id
        if conn.max_packet:
            data = c.encode(packet, conn.version)
            if len(data) > conn.max_packet:                # MQTT 5.0 3.1.2.11.4: discard as if sent
                self.stats.oversize += 1
                if pid is not None:
                    session.land(pid)
                return
            conn.write(data)
        else:
            conn.send(packet)
        self.stats.count_out(out.qos)

    def _acked(self, conn: Connection, pid: int) -> None:
        session = conn.session
        if session is None:
            return
        if session.land(pid) is not None:
            self._pump(conn, session)
            self.store.session_changed(session)

    def _pubrec(self, conn: Connection, p: c.PubRec) -> None:
        session = conn.session
        if session is None:
            return
        out = session.inflight.get(p.packet_id)
        if out is None:
            conn.send(c.PubRel(p.packet_id, c.PACKET_ID_NOT_FOUND if conn.version == 5 else 0, {}))
            return
        if p.reason >= 0x80:                               # the client refused it: done with it
            session.land(p.packet_id)
            self._pump(conn, session)
            return
        out.released = True
        # PUBREL only once the record says released: after a crash before that the PUBLISH goes again,
        # and a client that had PUBREL (and delivered the message) would deliver it twice (MQTT 4.3.3)
        self.store.when_persisted(session, lambda: conn.send(c.PubRel(p.packet_id)))

    def _pump(self, conn: Connection, session: Session) -> None:
        while session.queue and not conn.closed:
            if session.queue[0].qos and len(session.inflight) >= conn.send_quota:
                return
            self._send(conn, session, session.pop())

    def _resume(self, conn: Connection, session: Session) -> None:
        """A session back: what was in flight goes again (DUP, or PUBREL once released), then the queue."""
        for pid, out in list(session.inflight.items()):
            if out.released:
                conn.send(c.PubRel(pid))
            else:
                d = out.delivery
                conn.send(c.Publish(d.topic, d.payload, out.qos, out.retain, True, pid, _publish_properties(conn, out)))
        self._pump(conn, session)

    # ---- wills and session ends ------------------------------------------------------------------
    def _will(self, conn: Connection, session: Session) -> None:
        will = conn.will
        conn.will = None
        if will is None:
            return
        delay = min(conn.will_delay, session.expiry) if conn.will_delay else 0
        if delay:
            self.wills.append((self.now() + delay, session.client_id, will, conn.peer))
        else:
            self._publish_will(session.client_id, will)

    def _cancel_will(self, client_id: str) -> None:
        if self.wills:
            self.wills = [w for w in self.wills if w[1] != client_id]

    def _publish_will(self, client_id: str, will: c.Will) -> None:
        self.stats.wills += 1
        log.info("mqtt %s: publishing its will to %s", client_id, will.topic)
        p = c.Publish(will.topic, will.payload, will.qos, will.retain, False, 1 if will.qos else None,
                      dict(will.properties))
        p.properties.pop("will_delay_interval", None)

        def stored(reason: int) -> None:
            if reason == c.SUCCESS and will.retain:
                self.retain(will.topic, retained(p, client_id))
            elif reason != c.SUCCESS:
                log.warning("mqtt %s: its will to %s was not stored (0x%02X)", client_id, will.topic, reason)
        self.store.store(p, client_id, stored)

    def _keep(self, session: Session) -> None:
        if session.client_id not in self.sessions:
            self.held(session.client_id)
        self.sessions[session.client_id] = session
        self.stats.sessions = len(self.sessions)

    def _forget(self, client_id: str) -> Session | None:
        session = self.sessions.pop(client_id, None)
        if session is not None:
            self.let_go(client_id)
        return session

    def _end_session(self, session: Session) -> None:
        if self.sessions.get(session.client_id) is session:
            self._forget(session.client_id)
        self.index.remove_owner(session.client_id)
        for client_id, will, in [(w[1], w[2]) for w in self.wills if w[1] == session.client_id]:
            self._publish_will(client_id, will)
        self._cancel_will(session.client_id)
        self.stats.sessions = len(self.sessions)
        self.stats.subscriptions = len(self.index)
        self.store.session_ended(session.client_id)

    def _away(self, session: Session) -> None:
        if session.expiry != NEVER:
            self.expiries.add(session.ended_at + session.expiry, session)

    # ---- restore after a restart ---------------------------------------------------------------
    def restore(self, session: Session, through: dict[str, int]) -> None:
        """A session read back from its record: away (since the crash, if it was connected), its
        subscriptions back in the index, skipping in the feed's replay what it was offered."""
        session.through = through
        if not session.ended_at:
            session.ended_at = self.now()
        self._keep(session)
        self._away(session)
        for flt, sub in session.subscriptions.items():
            self.index.add(session.client_id, flt, sub)
        self.stats.subscriptions = len(self.index)

    def replayed_qos2(self, client_id: str, pid: int, src: str, offset: int) -> None:
        """A QoS 2 publish the feed replays, stored after its session's record: the client may send
        it again (DUP) not knowing it was stored, and must get PUBREC, not a second copy."""
        session = self.sessions.get(client_id)
        if session is not None and session.through is not None and session.through.get(src, -1) < offset:
            session.received(pid)

    def catch_up(self, session: Session, d: Delivery, src: str, offset: int) -> None:
        """A message stored while the session was held elsewhere, offered by its own subscriptions
        (not the shared ones: another member had it)."""
        qos, ids, rap = -1, [], False
        for flt, sub in session.subscriptions.items():
            group, inner = split_share(flt)
            if group is not None or not matches(inner, d.topic):
                continue
            if sub.options.no_local and d.client_id == session.client_id:
                continue
            qos = max(qos, min(d.qos, sub.options.qos))
            rap = rap or sub.options.retain_as_published
            if sub.identifier:
                ids.append(sub.identifier)
        if qos >= 0:
            self._offer(session, d, qos, d.retain and rap, tuple(ids), src, offset)

    def taken_elsewhere(self, client_id: str, epoch: int) -> Session | None:
        """Another MQTT actor or node claimed the session at epoch (ms): a session connected here
        before that goes (returned, for the record that hands it over)."""
        session = self.sessions.get(client_id)
        if session is not None and session.epoch < epoch:
            return self.release(client_id)
        return None

    def release(self, client_id: str) -> Session | None:
        """Let a session go to another holder: its connection is told why and closed (no will:
        the device is alive, elsewhere); the session is returned for its record."""
        session = self._forget(client_id)
        if session is None:
            return None
        conn = session.connection
        if conn is not None and not conn.closed:
            self.stats.takeovers += 1
            log.info("mqtt %s: session taken over by another actor or node; closing %s", client_id, conn.peer)
            if conn.version == 5:
                conn.send(c.Disconnect(c.SESSION_TAKEN_OVER, {}))
            conn.session = None
            conn.will = None
            conn.close()
            self.closed(conn, "taken over elsewhere")
        session.connection = None
        session.ended_at = session.ended_at or self.now()
        self.index.remove_owner(client_id)
        self._cancel_will(client_id)
        self.stats.sessions = len(self.sessions)
        self.stats.subscriptions = len(self.index)
        self.store.forgotten(client_id)
        return session

    def replay_done(self) -> None:
        for session in self.sessions.values():
            session.through = None

    def kick(self, client_id: str) -> bool:
        """Admin: disconnect a client (MQTT 5.0 reason 0x98, administrative action)."""
        session = self.sessions.get(client_id)
        if session is None or session.connection is None:
            return False
        self.disconnect(session.connection, c.ADMINISTRATIVE_ACTION, "disconnected by an administrator")
        return True

    def shutting_down(self) -> None:
        for session in list(self.sessions.values()):
            conn = session.connection
            if conn is not None:
                conn.clean = True                 # a server going down is not the device's death
                self.disconnect(conn, c.SERVER_SHUTTING_DOWN, "server shutting down")
