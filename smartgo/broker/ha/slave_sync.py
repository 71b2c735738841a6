"""A slave's copy of its master's metadata: RocketMQ 4.x's SlaveSynchronize (broker/slave/
SlaveSynchronize.java, `syncAll`, run every 10 s by BrokerController on a slave).

The CommitLog reaches a slave through HA; the tables beside it do not. So a slave asks its master
for them, four requests a round, and makes them its own:

- GET_ALL_TOPIC_CONFIG (21), TopicConfigSerializeWrapper -> config/topics.json; syncTopicConfig:
  table and dataVersion replaced;
- GET_ALL_CONSUMER_OFFSET (43), ConsumerOffsetSerializeWrapper -> config/consumerOffset.json;
  syncConsumerOffset: putAll;
- GET_ALL_DELAY_OFFSET (45), DelayOffsetSerializeWrapper -> config/delayOffset.json; syncDelayOffset:
  the file (RocketMQ runs no schedule service on a slave: this is the file's only writer there);
- GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), SubscriptionGroupWrapper -> config/subscriptionGroup.json;
  syncSubscriptionGroupConfig: table and dataVersion replaced.

Consumer offsets are merged as RocketMQ's putAll does: the master's entry of a topic@group
replaces the slave's, entries the master lacks stay. Departures, with reasons: a file is written
only when its content changes (RocketMQ rewrites the offsets and delay files every round), and
the topic table's dataVersion counter never goes down (`next_topics`: net actors reload the
snapshot when the board word holding it moves, so it must move on every change and never come
back to a value a net actor may still hold for another table).

The parts are separate so each can be tested alone: `fetch_master_state` does the I/O (any failure
is a SlaveSyncError naming the request), `apply_state` changes files and managers (no actor
needed), BrokerActor.apply_master_state adds what the net actors must learn, and
`run_slave_sync` is the loop a slave's broker actor runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from smartgo.actors.logs import Repeats, gist
from smartgo.broker.managers.groups import GroupSnapshot, SubscriptionGroups, parse_group_snapshot
from smartgo.broker.managers.offsets import ConsumerOffsets, Key
from smartgo.broker.managers.offsets import decode as decode_offsets
from smartgo.broker.schedule.schedule_offsets import DelayOffsetFile, DelayState, decode_state
from smartgo.broker.managers.topics import TopicSnapshot, parse_snapshot, write_snapshot
from smartgo.net.client import RemotingClient
from smartgo.net.codes import RequestCode, ResponseCode, code_name
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import RemotingError

log = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_TIMEOUT = 3.0          # per request; RocketMQ's BrokerOuterAPI uses 3 s for these four


class SlaveSyncError(Exception):
    """One of the four requests failed; the message names it, the master and why."""


@dataclass(frozen=True, slots=True)
class MasterState:
    """What one round fetched, already parsed into the shapes the broker's managers hold."""
    topics: TopicSnapshot                       # the table and its dataVersion
    offsets: dict[Key, dict[int, int]]          # ConsumerOffsets.table: (topic, group) -> queue -> offset
    groups: GroupSnapshot                       # the table and its dataVersion
    delay: DelayState                           # level -> offset (scan_from None: the master sends none)


# ---- fetching ----------------------------------------------------------------------------------------------
async def _fetch(client: RemotingClient, addr: str, code: RequestCode, parse: Callable[[bytes], T],
                 timeout: float) -> T:
    what = f"{code.name} ({int(code)}) to master {addr}"
    try:
        response = await client.invoke(addr, RemotingCommand(code), timeout)
    except (RemotingError, OSError) as exc:
        raise SlaveSyncError(f"{what} failed: {exc}") from exc
    if response.code != ResponseCode.SUCCESS:
        raise SlaveSyncError(f"{what} answered {code_name(response.code)} ({response.code}): {response.remark}")
    try:
        return parse(response.body_bytes())
    except Exception as exc:        # whatever a remote body makes a parser raise, it is a malformed body
        raise SlaveSyncError(f"{what}: malformed body ({type(exc).__name__}: {exc})") from exc


async def fetch_master_state(client: RemotingClient, master_addr: str,
                             timeout: float = DEFAULT_TIMEOUT) -> MasterState:
    """The four tables, in syncAll's order; `timeout` is per request. SlaveSyncError on a
    connection failure, a non-SUCCESS answer (with its remark) or a malformed body."""
    topics = await _fetch(client, master_addr, RequestCode.GET_ALL_TOPIC_CONFIG, parse_snapshot, timeout)
    offsets = await _fetch(client, master_addr, RequestCode.GET_ALL_CONSUMER_OFFSET, decode_offsets, timeout)
    delay = await _fetch(client, master_addr, RequestCode.GET_ALL_DELAY_OFFSET, decode_state, timeout)
    groups = await _fetch(client, master_addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                          parse_group_snapshot, timeout)
    return MasterState(topics, offsets, groups, delay)


# ---- applying -----------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Changed:
    """What apply_state wrote; all empty (falsy) when nothing differed and no file was written."""
    topics: TopicSnapshot | None = None         # the slave's new topic table, for its owner to publish
    topic_names: frozenset[str] = frozenset()   # topics added, changed or removed
    offsets: int = 0                            # topic@group entries taken from the master
    groups: GroupSnapshot | None = None         # the table adopted
    group_names: frozenset[str] = frozenset()   # groups added, changed or removed
    delay: bool = False                         # delayOffset.json rewritten

    def __bool__(self) -> bool:
        return self.topics is not None or self.offsets > 0 or self.groups is not None or self.delay

    def summary(self) -> str:
        parts = []
        if self.topics is not None:
            parts.append(f"topics version {self.topics.version} ({len(self.topic_names)} added/changed/removed)")
        if self.offsets:
            parts.append(f"{self.offsets} consumer offset entries")
        if self.groups is not None:
            parts.append(f"subscription groups version {self.groups.version} "
                         f"({len(self.group_names)} added/changed/removed)")
        if self.delay:
            parts.append("delay offsets")
        return "; ".join(parts) or "nothing"


def next_topics(ours: TopicSnapshot, master: TopicSnapshot) -> TopicSnapshot | None:
    """The slave's next topic table, None when it stays as it is.

    syncTopicConfig: when the dataVersions differ the slave takes the master's table and
    dataVersion. So here while the master's counter is ahead (the normal case: the slave's table
    is a copy), or equal with the same table. A slave whose counter is at or ahead of the master's
    with another table (its own defaults at first start, an admin change made on it) takes the
    master's table under its own counter plus one: the counter is also the board word net actors
    reload on, and going down could bring it back later to a value some net actor still holds
    with an older table."""
    if master.version > ours.version or (master.version == ours.version and master.topics == ours.topics):
        return None if master == ours else master
    if master.topics == ours.topics:
        return None
    return TopicSnapshot(ours.version + 1, master.timestamp, master.topics)


def _differing(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(n for n in ours.keys() | theirs.keys() if ours.get(n) != theirs.get(n))


@contextmanager
def _part(what: str) -> Iterator[None]:
    """Each table on its own, as each of SlaveSynchronize's sync* methods: a failed write (a full
    disk) is logged, the other tables go on, and the next round tries this one again."""
    try:
        yield
    except OSError as exc:
        log.error("slave sync: the master's %s not written (%s); the next round tries again", what, exc)


def apply_state(store_path: Path, snapshot: TopicSnapshot, groups: SubscriptionGroups,
                offsets: ConsumerOffsets, state: MasterState) -> Changed:
    """Make the master's tables the slave's, in syncAll's order, each file written only when its
    content changes. `offsets` and `groups` are changed in place; the topic snapshot is written
    and returned in Changed.topics for the caller to publish (it is immutable)."""
    changed = Changed()
    topics = next_topics(snapshot, state.topics)
    if topics is not None:
        with _part("topic table"):
            write_snapshot(store_path, topics)
            changed.topics, changed.topic_names = topics, _differing(snapshot.topics, topics.topics)
    taken = {key: queues for key, queues in state.offsets.items() if offsets.table.get(key) != queues}
    if taken:
        offsets.table.update({key: dict(queues) for key, queues in taken.items()})
        offsets.dirty = True
        changed.offsets = len(taken)            # in memory now; a failed write stays dirty for the next persist
        with _part("consumer offsets"):
            offsets.persist()
    delay_file = DelayOffsetFile(store_path)
    saved = delay_file.load()
    if saved is None or saved.offsets != state.delay.offsets:
        with _part("delay offsets"):
            delay_file.save(state.delay)
            changed.delay = True
    if groups.snapshot() != state.groups:
        names = _differing(groups.table, state.groups.table)
        with _part("subscription groups"):
            groups.adopt(state.groups)
            changed.groups, changed.group_names = state.groups, names
    if changed:
        log.info("slave sync: took the master's %s", changed.summary())
    return changed


# ---- the loop -----------------------------------------------------------------------------------------------
class SyncTarget(Protocol):
    """What run_slave_sync needs of the broker actor."""

    def apply_master_state(self, state: MasterState) -> object: ...


async def run_slave_sync(broker: SyncTarget, master_addr_of: Callable[[], str | None], interval: float,
                         client: RemotingClient, timeout: float = DEFAULT_TIMEOUT) -> None:
    """A round at once, then one every `interval` seconds after the previous ended, until
    cancelled. A round is skipped while the master's address is unknown (None); a failed fetch is
    a warning and the next round tries again (the slave keeps what it has). client (the node's
    own, acl.node_client: signed for an ACL-enabled master) is closed when the loop ends."""
    last: str | None = None
    failures = Repeats()                        # a master that is down: once a minute
    try:
        while True:
            addr = master_addr_of()
            if addr != last and last is not None:
                client.close_connection(last)   # a new master: the old one's connection is not needed
            last = addr
            if addr is not None:
                try:
                    state = await fetch_master_state(client, addr, timeout)
                except SlaveSyncError as exc:
                    why = f"slave sync: {exc}; keeping the current tables, next try in {interval:g}s"
                    failures.log(log, logging.WARNING, why, gist(why))
                else:
                    broker.apply_master_state(state)
            await asyncio.sleep(interval)
    finally:
        await client.close()
