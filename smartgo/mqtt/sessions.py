"""Persistent sessions in the store: the topic MQTT_SESSIONS, one record per checkpoint of a session.

A record (msgpack, key = client id, queue = crc32(client id)) holds what a session needs to go on
after a broker restart, a kill -9, or on another node: its subscriptions and expiry, the QoS 2
packet ids it received, and the position (broker, topic, queue, offset) of every QoS 1/2 message
queued for it or in flight, plus the feed position it had been offered everything up to
(`through`). Messages are stored once, in their topics; a session holds positions only.

The checkpoint writes the records of the sessions that changed, and only once the store has them
does the feed commit its offsets: after a crash, the feed replays from its last commit and each
restored session skips what its record says it was already offered. QoS 2 deliveries wait for the
checkpoint that records their packet id, so a redelivery after a crash reuses it (never a duplicate).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import msgpack

from smartgo.client.message import Message
from smartgo.mqtt.codec import sub_options
from smartgo.mqtt.session import Outgoing, Session, Subscription

log = logging.getLogger(__name__)

SESSIONS_TOPIC = "MQTT_SESSIONS"
SESSIONS_QUEUES = 8
#: Seconds between the feed's commits (a file write each): a crash replays at most this much more.
COMMIT_EVERY = 1.0
#: record tags: a session goes on (held by HOLDER) / it ended (restore drops it) / another actor or node
#: asks for it (no state) / its holder let it go to that one (the state it had)
LIVE, ENDED, CLAIM, HANDOFF = "live", "ended", "claim", "handoff"
#: record properties: which actor holds the session ("<broker>/<actor>") since when (its CONNECT, wall ms)
HOLDER, EPOCH = "mqttHolder", "mqttEpoch"
VERSION = 1

#: A message's place in the store: "broker/topic/queue", queue offset.
Source = str


def source_of(broker: str, topic: str, queue_id: int) -> Source:
    return f"{broker}/{topic}/{queue_id}"


def parse_source(src: Source) -> tuple[str, str, int]:
    broker, topic, queue = src.rsplit("/", 2)
    return broker, topic, int(queue)


def session_queue(client_id: str) -> int:
    return zlib.crc32(client_id.encode()) % SESSIONS_QUEUES


@dataclass(slots=True)
class Pending:
    """A queued or in-flight message of a restored session, by position, until it is read back."""
    pid: int               # 0 = queued
    released: bool
    qos: int
    retain: bool
    identifiers: tuple[int, ...]
    src: Source
    offset: int


@dataclass(slots=True)
class Restored:
    session: Session
    pending: list[Pending]
    through: dict[Source, int]
    node: str
    written_ms: int


def encode(session: Session, through: dict[Source, int], node: str) -> bytes:
    sources: dict[Source, int] = {}

    def pos(out: Outgoing) -> list:
        i = sources.setdefault(out.src, len(sources))
        return [i, out.offset, out.qos, int(out.retain), list(out.identifiers)]

    subs = [[s.filter, s.options.qos, int(s.options.no_local), int(s.options.retain_as_published),
             s.options.retain_handling, s.identifier] for s in session.subscriptions.values()]
    inflight = [[pid, int(out.released), *pos(out)] for pid, out in session.inflight.items() if out.src]
    queued = [pos(out) for out in session.queue if out.qos and out.src]
    doc = {"v": VERSION, "c": session.client_id, "e": session.expiry, "s": subs, "i": inflight, "q": queued,
           "n": sorted(session.inbound), "src": list(sources), "t": through, "node": node,
           "ms": int(time.time() * 1000), "cr": session.created_ms,
           "end": int(time.time()) if session.connection is None else 0}
    return msgpack.packb(doc, use_bin_type=True)


def decode(body: bytes) -> Restored:
    doc = msgpack.unpackb(body, raw=False, strict_map_key=False)
    if doc.get("v") != VERSION:
        raise ValueError(f"session record version {doc.get('v')!r}")
    session = Session(doc["c"], expiry=int(doc["e"]), created_ms=int(doc.get("cr", 0)))
    for flt, qos, nl, rap, rh, ident in doc["s"]:
        session.subscriptions[flt] = Subscription(flt, sub_options(qos, bool(nl), bool(rap), rh), ident)
    for pid in doc["n"]:
        session.received(pid)
    sources = doc["src"]
    pending = [Pending(pid, bool(rel), qos, bool(ret), tuple(ids), sources[i], off)
               for pid, rel, i, off, qos, ret, ids in doc["i"]]
    pending += [Pending(0, False, qos, bool(ret), tuple(ids), sources[i], off) for i, off, qos, ret, ids in doc["q"]]
    ended = int(doc.get("end", 0))
    if ended:
        # away since then: the expiry runs from the disconnect, not from the restore
        session.ended_at = time.monotonic() - max(0.0, time.time() - ended)
    return Restored(session, pending, dict(doc["t"]), doc.get("node", ""), int(doc.get("ms", 0)))


def still_alive(r: Restored) -> bool:
    """A record of a session that was connected when it was written (ended_at 0: the node died under
    it) is alive; one of a session away is alive while its expiry has not run out."""
    return not r.session.ended_at or not r.session.expired(time.monotonic())


class SessionJournal:
    """The engine's session side of StoreSide: checkpoints the sessions that changed into
    MQTT_SESSIONS on this node's broker, then lets the feed commit where it had got to.

    `write(topic, queue, messages)` stores records (an awaitable that raises on failure);
    `position()` is the feed's processed position per source, `commit(position)` persists it.
    """

    def __init__(self, holder: str, write: Callable[[list[Message], int], Awaitable[None]],
                 position: Callable[[], dict[Source, int]], commit: Callable[[dict[Source, int]], Awaitable[None]],
                 interval: float) -> None:
        self.holder = holder
        self.write = write
        self.position = position
        self.commit = commit
        self.interval = interval
        self.dirty: dict[str, Session] = {}
        self.ended: set[str] = set()
        self.persisted: set[str] = set()          # client ids with a live record
        self.waiters: list[Callable[[], None]] = []
        self.wake = asyncio.Event()
        self.checkpoints = 0
        self.failures = 0
        self.committed: dict[Source, int] = {}
        self.committed_at = 0.0                   # monotonic time of the last commit
        self.written: dict[str, float] = {}       # client id -> wall time of its last record

    def session_changed(self, session: Session) -> None:
        if session.expiry:
            self.dirty[session.client_id] = session
            if session.connection is None:
                self.wake.set()                  # gone: its record now, for whoever it reconnects to
            self.ended.discard(session.client_id)

    def session_ended(self, client_id: str) -> None:
        self.dirty.pop(client_id, None)
        if client_id in self.persisted:
            self.ended.add(client_id)

    def claim(self, session: Session) -> None:
        """A CONNECT made this actor the session's holder: a record says so (even for a session
        that ends with its connection), so whoever held it before lets it go."""
        self.dirty[session.client_id] = session
        self.ended.discard(session.client_id)
        self.wake.set()

    def forgotten(self, client_id: str) -> None:
        """Another holder has it now: nothing more to write here."""
        self.dirty.pop(client_id, None)
        self.ended.discard(client_id)
        self.persisted.discard(client_id)
        self.written.pop(client_id, None)

    def stale(self, sessions: Iterable[Session], before: float) -> int:
        """Write again the sessions whose last record is older than before (wall time): the store
        deletes old CommitLog files, and a session idle for days must not go with them."""
        count = 0
        for session in sessions:
            if session.expiry and self.written.get(session.client_id, before) < before:
                self.dirty[session.client_id] = session
                count += 1
        return count

    def when_persisted(self, session: Session, then: Callable[[], None]) -> None:
        if not session.expiry:
            then()                               # nothing outlives it: no record to wait for
            return
        self.session_changed(session)
        self.waiters.append(then)
        self.wake.set()

    async def run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()
            await self.checkpoint()

    async def checkpoint(self, final: bool = False) -> bool:
        """One round: the records of the changed sessions, then the feed's commit (at most every
        COMMIT_EVERY seconds, but at the final one: committing later only makes a replay longer);
        False when the store refused (they stay dirty, and the feed does not move)."""
        position = self.position()
        if (self.dirty or self.ended) and not await self._store_records(position):
            return False
        if position == self.committed or (not final and time.monotonic() - self.committed_at < COMMIT_EVERY):
            return True
        try:
            await self.commit(position)
        except Exception as exc:               # noqa: BLE001 - the next round tries again
            log.warning("mqtt: feed position not committed (%s)", exc)
            return False
        self.committed, self.committed_at = position, time.monotonic()
        return True

    async def _store_records(self, position: dict[Source, int]) -> bool:
        dirty, ended, waiters = self.dirty, self.ended, self.waiters
        self.dirty, self.ended, self.waiters = {}, set(), []
        by_queue: dict[int, list[Message]] = {}
        for client_id, session in dirty.items():
            through = position if session.through is None else {
                src: max(position.get(src, -1), session.through.get(src, -1))
                for src in position.keys() | session.through.keys()}
            body = encode(session, through, self.holder)
            by_queue.setdefault(session_queue(client_id), []).append(Message(
                SESSIONS_TOPIC, body, LIVE, client_id, {HOLDER: self.holder, EPOCH: str(session.epoch)}))
        for client_id in ended:
            by_queue.setdefault(session_queue(client_id), []).append(Message(
                SESSIONS_TOPIC, b"-", ENDED, client_id, {HOLDER: self.holder, EPOCH: "0"}))
        try:
            await asyncio.gather(*(self.write(msgs, queue) for queue, msgs in by_queue.items()))
        except Exception as exc:       # noqa: BLE001 - any failure: keep them dirty, try next round
            self.failures += 1
            log.warning("mqtt: checkpoint of %d sessions not stored (%s); again in %gs", len(dirty) + len(ended),
                        exc, self.interval)
            for client_id, session in dirty.items():
                self.dirty.setdefault(client_id, session)
            self.ended |= ended - self.dirty.keys()
            self.waiters[:0] = waiters
            return False
        self.persisted |= dirty.keys()
        self.persisted -= ended
        now = time.time()
        for client_id in dirty:
            self.written[client_id] = now
        for client_id in ended:
            self.written.pop(client_id, None)
        self.checkpoints += 1
        for then in waiters:
            then()
        return True
