"""Producer and consumer connections (RocketMQ's ConsumerManager, ProducerManager and
ClientHousekeepingService), kept by the broker actor.

A client connection is a ClientRef (net actor, connection id, address). HEART_BEAT registers it
in its groups with its HeartbeatData; it leaves a group by UNREGISTER_CLIENT, when its
connection closes (the net actor reports it), when its net actor dies, or when it sent no
heartbeat for client_expiry (120 s; scanned every client_scan_interval, 10 s). A heartbeat the
net actor answered itself (the same as the last) arrives as a `touch`. An index from each
connection to its groups makes a close or a touch cost its groups, not the table. Each operation
returns which groups changed membership (their consumers get NOTIFY_CONSUMER_IDS_CHANGED) and
which groups changed what pulls see (their state is published to the net actors). The clock
is injectable, so expiry is tested without waiting.

A restarted broker actor `restore`s the members persisted before (members.py) as presumed
members: client ids without a connection, counted in the consumer id list until their client's
first heartbeat replaces them or presumed_member_ttl passes (`expire_presumed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from smartgo.broker.channel import ClientRef
from smartgo.broker.managers.subscriptions import RegisteredSub
from smartgo.common.heartbeat import SUB_ALL, HeartbeatData, SubscriptionData
from smartgo.filter import is_tag_type
from smartgo.net.codes import LanguageCode

ChannelKey = tuple[str, int]          # (net actor, connection id)
Memberships = tuple[tuple[str, ...], tuple[str, ...]]   # a connection's (consumer groups, producer groups)

if TYPE_CHECKING:
    from smartgo.broker.managers.members import SavedGroup


def registered(sub: SubscriptionData) -> RegisteredSub:
    """What a pull filters by: every tag for "*" (and class filter mode), else the codes; a
    SQL92 subscription by its expression (compiled by the net actors)."""
    if not is_tag_type(sub.expression_type):
        return RegisteredSub(None, sub.sub_version, sub.expression_type, sub.sub_string)
    reads_all = sub.sub_string.strip() == SUB_ALL or not sub.sub_string.strip() or sub.class_filter_mode
    return RegisteredSub(None if reads_all else frozenset(sub.code_set), sub.sub_version, sub.expression_type)


@dataclass(slots=True)
class ClientChannel:
    ref: ClientRef
    client_id: str
    language: int
    version: int
    last_update: float

    @property
    def language_name(self) -> str:
        try:
            return LanguageCode(self.language).name
        except ValueError:
            return "OTHER"

    def to_json(self) -> dict:
        """Connection (ConsumerConnection.connectionSet items)."""
        return {"clientAddr": self.ref.addr, "clientId": self.client_id, "language": self.language_name,
                "version": self.version}


@dataclass(slots=True)
class ConsumerGroupInfo:
    name: str
    consume_type: str
    message_model: str
    consume_from_where: str
    channels: dict[ChannelKey, ClientChannel] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)
    presumed: set[str] = field(default_factory=set)     # client ids restored from before a restart

    def member_ids(self) -> list[str]:
        """The client ids of the group: its connections', then presumed ones not among them."""
        ids = [ch.client_id for ch in self.channels.values()]
        return ids + sorted(self.presumed.difference(ids))

    def connection_json(self) -> dict:
        """ConsumerConnection (GET_CONSUMER_CONNECTION_LIST)."""
        return {"connectionSet": [c.to_json() for c in self.channels.values()],
                "consumeFromWhere": self.consume_from_where, "consumeType": self.consume_type,
                "messageModel": self.message_model,
                "subscriptionTable": {t: s.to_json() for t, s in self.subscriptions.items()}}

    def update_subscriptions(self, subs: list[SubscriptionData]) -> tuple[bool, bool]:
        """(membership changed: a topic came or went, state changed: also a newer subVersion) -
        ConsumerGroupInfo.updateSubscription."""
        topics_changed = state_changed = False
        wanted = {s.topic for s in subs}
        for s in subs:
            old = self.subscriptions.get(s.topic)
            if old is None:
                self.subscriptions[s.topic] = s
                topics_changed = True
            elif s.sub_version > old.sub_version:
                self.subscriptions[s.topic] = s
                state_changed |= registered(old) != registered(s)
        for topic in [t for t in self.subscriptions if t not in wanted]:
            del self.subscriptions[topic]
            topics_changed = True
        return topics_changed, topics_changed or state_changed


@dataclass(slots=True)
class Changes:
    notify: set[str] = field(default_factory=set)        # groups whose consumers changed
    state: set[str] = field(default_factory=set)         # groups whose pull-visible state changed

    def __bool__(self) -> bool:
        return bool(self.notify or self.state)


class ClientTable:
    def __init__(self, expiry: float = 120.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.expiry = expiry
        self.clock = clock
        self.consumers: dict[str, ConsumerGroupInfo] = {}
        self.presumed_until = 0.0           # when the presumed members left (clock time)
        self.dirty = False                  # the consumer groups changed since members.py last saved them
        self.producers: dict[str, dict[ChannelKey, ClientChannel]] = {}
        self._producer_ids: dict[str, tuple[str, ChannelKey]] = {}    # client id -> (group, channel): a hint
        self._groups_of: dict[ChannelKey, Memberships] = {}
        self._shapes: dict[Memberships, Memberships] = {}    # one tuple for equal memberships (memory)

    # ---- registration ---------------------------------------------------------------------------
    def heartbeat(self, ref: ClientRef, hb: HeartbeatData, language: int, version: int) -> Changes:
        """ConsumerManager.registerConsumer for each consumer group, registerProducer for each
        producer group."""
        now = self.clock()
        key = (ref.net, ref.conn)
        changes = Changes()
        for data in hb.consumers:
            info = self.consumers.get(data.group)
            if info is None:
                info = self.consumers[data.group] = ConsumerGroupInfo(data.group, data.consume_type,
                                                                      data.message_model, data.consume_from_where)
                changes.state.add(data.group)
            if info.message_model != data.message_model:
                changes.state.add(data.group)
            if (info.consume_type, info.consume_from_where) != (data.consume_type, data.consume_from_where):
                self.dirty = True
            info.consume_type, info.message_model = data.consume_type, data.message_model
            info.consume_from_where = data.consume_from_where
            came = self._touch(info.channels, key, ref, hb.client_id, language, version, now)
            if came and hb.client_id not in info.presumed:      # a presumed one back: the id list stays
                changes.notify.add(data.group)
            info.presumed.discard(hb.client_id)
            topics_changed, state_changed = info.update_subscriptions(data.subscriptions)
            if topics_changed:
                changes.notify.add(data.group)
            if state_changed:
                changes.state.add(data.group)
        for group in hb.producers:
            self._touch(self.producers.setdefault(group, {}), key, ref, hb.client_id, language, version, now)
            self._producer_ids[hb.client_id] = (group, key)
        consumers, producers = self._groups_of.get(key, ((), ()))
        self._index(key, _union(consumers, (d.group for d in hb.consumers)), _union(producers, hb.producers))
        self.dirty |= bool(changes)
        return changes

    def touch(self, net: str, conns: Iterable[int]) -> None:
        """Connections whose unchanged heartbeat their net actor answered: seen now."""
        now = self.clock()
        for conn in conns:
            key = (net, conn)
            consumers, producers = self._groups_of.get(key, ((), ()))
            channel_maps = [info.channels for info in map(self.consumers.get, consumers) if info is not None]
            channel_maps += [chans for chans in map(self.producers.get, producers) if chans is not None]
            for channels in channel_maps:
                ch = channels.get(key)
                if ch is not None:
                    ch.last_update = now

    def _index(self, key: ChannelKey, consumers: tuple[str, ...], producers: tuple[str, ...]) -> None:
        if not consumers and not producers:
            self._groups_of.pop(key, None)
            return
        shape = (consumers, producers)
        self._groups_of[key] = self._shapes.setdefault(shape, shape)

    def _unindex(self, key: ChannelKey, group: str, producer: bool) -> None:
        consumers, producers = self._groups_of.get(key, ((), ()))
        if producer:
            producers = tuple(g for g in producers if g != group)
        else:
            consumers = tuple(g for g in consumers if g != group)
        self._index(key, consumers, producers)

    @staticmethod
    def _touch(channels: dict[ChannelKey, ClientChannel], key: ChannelKey, ref: ClientRef, client_id: str,
               language: int, version: int, now: float) -> bool:
        """Refresh a channel; True when it is new to the group."""
        ch = channels.get(key)
        if ch is None:
            channels[key] = ClientChannel(ref, client_id, language, version, now)
            return True
        ch.client_id, ch.last_update = client_id, now
        return False

    def unregister(self, ref: ClientRef, producer_group: str | None, consumer_group: str | None,
                   client_id: str = "") -> Changes:
        """UNREGISTER_CLIENT: the connection leaves the named groups; so does client_id when it is
        a presumed member (a client that stops before it heartbeat a restarted broker)."""
        key = (ref.net, ref.conn)
        if producer_group:
            self._drop_producer(producer_group, only=key)
        info = self.consumers.get(consumer_group or "")
        if info is None:
            return Changes()
        changes = self._drop_consumers([info.name], only=key)
        if client_id in info.presumed:
            info.presumed.discard(client_id)
            self._left(info, changes)
        return changes

    def connection_closed(self, net: str, conn: int) -> Changes:
        key = (net, conn)
        consumers, producers = self._groups_of.get(key, ((), ()))
        for group in producers:
            self._drop_producer(group, only=key)
        return self._drop_consumers(list(consumers), only=key)

    def net_gone(self, net: str) -> Changes:
        """A net actor died or restarted: its connections are gone with it."""
        return self._drop_everywhere(lambda k, ch: k[0] == net)

    def expire(self) -> Changes:
        """Channels without a heartbeat for `expiry` seconds (scanNotActiveChannel)."""
        deadline = self.clock() - self.expiry
        return self._drop_everywhere(lambda k, ch: ch.last_update < deadline)

    def _drop_everywhere(self, gone: Callable[[ChannelKey, ClientChannel], bool]) -> Changes:
        for group in list(self.producers):
            self._drop_producer(group, gone)
        return self._drop_consumers(list(self.consumers), gone)

    def _drop_producer(self, group: str, gone: Callable[[ChannelKey, ClientChannel], bool] = lambda k, ch: True,
                       only: ChannelKey | None = None) -> None:
        """Drop the group's channels that are `gone`, of `only`'s alone when given (no scan)."""
        channels = self.producers.get(group, {})
        for k in [k for k in _candidates(channels, only) if gone(k, channels[k])]:
            ch = channels.pop(k)
            self._unindex(k, group, producer=True)
            if self._producer_ids.get(ch.client_id) == (group, k):
                del self._producer_ids[ch.client_id]
        if not channels:
            self.producers.pop(group, None)

    def _drop_consumers(self, groups: list[str],
                        gone: Callable[[ChannelKey, ClientChannel], bool] = lambda k, ch: True,
                        only: ChannelKey | None = None) -> Changes:
        changes = Changes()
        for group in groups:
            info = self.consumers.get(group)
            if info is None:
                continue
            channels = info.channels
            dropped = [k for k in _candidates(channels, only) if gone(k, channels[k])]
            if not dropped:
                continue
            for k in dropped:
                del channels[k]
                self._unindex(k, group, producer=False)
            self._left(info, changes)
        return changes

    def _left(self, info: ConsumerGroupInfo, changes: Changes) -> None:
        self.dirty = True
        if info.channels or info.presumed:
            changes.notify.add(info.name)
        else:
            del self.consumers[info.name]          # the last one left: the group's subscriptions go too
            changes.state.add(info.name)

    # ---- presumed members (a restart) -------------------------------------------------------------------
    def restore(self, groups: Iterable[SavedGroup], ttl: float) -> None:
        """Take the groups persisted before a restart as presumed members until ttl from now."""
        self.presumed_until = self.clock() + ttl
        for g in groups:
            self.consumers[g.name] = ConsumerGroupInfo(g.name, g.consume_type, g.message_model, g.consume_from_where,
                                                       subscriptions={s.topic: s for s in g.subscriptions},
                                                       presumed=set(g.client_ids))

    def expire_presumed(self) -> Changes:
        """Once the TTL has passed: presumed members that did not heartbeat since the restart leave."""
        changes = Changes()
        if self.clock() < self.presumed_until:
            return changes
        for info in [i for i in self.consumers.values() if i.presumed]:
            info.presumed.clear()
            self._left(info, changes)
        return changes

    def presumed_count(self) -> int:
        return sum(len(info.presumed) for info in self.consumers.values())

    # ---- queries ---------------------------------------------------------------------------------
    def consumer_channels(self, group: str) -> list[ClientChannel]:
        info = self.consumers.get(group)
        return [] if info is None else list(info.channels.values())

    def consumer_ids(self, group: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP: presumed members too, so clients rebalance as before a restart."""
        info = self.consumers.get(group)
        return [] if info is None else info.member_ids()

    def consumer_count(self, group: str) -> int:
        info = self.consumers.get(group)
        return 0 if info is None else len(info.channels)

    def consumer_refs(self, group: str) -> list[ClientRef]:
        return [ch.ref for ch in self.consumer_channels(group)]

    def producer_ref(self, client_id: str) -> ClientRef | None:
        """A connection of the producer client `client_id` (ProducerManager.findChannel: where a
        request-reply reply goes). The index is a hint, checked, with a scan when it misses."""
        hint = self._producer_ids.get(client_id)
        if hint is not None:
            ch = self.producers.get(hint[0], {}).get(hint[1])
            if ch is not None and ch.client_id == client_id:
                return ch.ref
        for group, channels in self.producers.items():
            for key, ch in channels.items():
                if ch.client_id == client_id:
                    self._producer_ids[client_id] = (group, key)
                    return ch.ref
        return None

    def subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.consumers.get(group)
        return None if info is None else info.subscriptions.get(topic)

    def counts(self) -> tuple[int, int, int]:
        """(consumer groups, producer groups, distinct client connections)."""
        conns = {k for info in self.consumers.values() for k in info.channels}
        conns |= {k for chans in self.producers.values() for k in chans}
        return len(self.consumers), len(self.producers), len(conns)


def _union(held: tuple[str, ...], more: Iterable[str]) -> tuple[str, ...]:
    """held, then the groups of `more` not in it (a heartbeat never takes a connection out of a group)."""
    extra = [g for g in more if g not in held]
    return held + tuple(dict.fromkeys(extra)) if extra else held


def _candidates(channels: dict[ChannelKey, ClientChannel], only: ChannelKey | None) -> list[ChannelKey]:
    """The keys to test: all of them, or just `only` (if the group has it)."""
    if only is None:
        return list(channels)
    return [only] if only in channels else []
