"""MQTT topic names and filters (MQTT 5.0 section 4.7, shared subscriptions 4.8.2) and the two tables that
route by them: SubscriptionIndex (which sessions get a publish) and RetainedIndex (which retained messages a
new subscription gets). Neither scans the subscribers or retained topics of other branches: a plain filter
is one dict lookup of the topic, a wildcard filter a walk of a trie over levels, O(levels x wildcard
branches). A million devices each on devices/<id>/cmd cost one lookup to route devices/42/cmd.
benchmarks/bench_mqtt_topics.py measures time and bytes per subscription at a million devices."""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar

__all__ = ["MAX_TOPIC_BYTES", "SHARE_PREFIX", "valid_topic_name", "valid_filter", "split_share", "matches",
           "SubscriptionIndex", "RetainedIndex"]

#: A topic name or filter is a UTF-8 string with a 2-byte length (MQTT 5.0 section 1.5.4).
MAX_TOPIC_BYTES = 65535
SHARE_PREFIX = "$share/"

V = TypeVar("V")
#: pop()'s default: tells "no such member" from a member whose value is None
_GONE = object()
R = TypeVar("R")

#: (owner, value) of each subscriber of a match.
Subscriber = tuple[Hashable, V]


def _valid_string(text: str) -> bool:
    """Non-empty, no U+0000 (MQTT-4.7.3-1, -2), at most MAX_TOPIC_BYTES once encoded; the encode also
    refuses lone surrogates, which are not well-formed UTF-8 (MQTT-1.5.4-1)."""
    if not text or "\x00" in text:
        return False
    if text.isascii():
        return len(text) <= MAX_TOPIC_BYTES
    try:
        return len(text.encode("utf-8")) <= MAX_TOPIC_BYTES
    except UnicodeEncodeError:
        return False


def valid_topic_name(topic: str) -> bool:
    """A PUBLISH topic: no wildcard characters (MQTT-4.7.1-1); empty levels are allowed ("/", "a//b")."""
    return _valid_string(topic) and "+" not in topic and "#" not in topic


def split_share(topic_filter: str) -> tuple[str | None, str]:
    """("$share/g/a/+") -> ("g", "a/+"); a plain filter -> (None, filter). A filter starting $share/ without
    a second "/" gives (group, "") so valid_filter refuses it."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    group, _, inner = topic_filter[len(SHARE_PREFIX):].partition("/")
    return group, inner


def _valid_levels(topic_filter: str) -> bool:
    """+ occupies a whole level (MQTT-4.7.1-3); # a whole level and the last one (MQTT-4.7.1-2)."""
    if "+" not in topic_filter and "#" not in topic_filter:
        return True
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if len(level) > 1 and ("+" in level or "#" in level):
            return False
        if level == "#" and i != last:
            return False
    return True


def valid_filter(topic_filter: str) -> bool:
    """A SUBSCRIBE / UNSUBSCRIBE filter, shared ones included: $share/<group>/<filter> with a group of at least
    one character without / + # and a valid filter after it (MQTT-4.8.2-1, -2). A first level "$share" is
    reserved for that form: "$share" and "$share/g" alone are refused."""
    if not _valid_string(topic_filter):
        return False
    if topic_filter == "$share":
        return False
    group, inner = split_share(topic_filter)
    if group is not None and (not group or "+" in group or "#" in group or not inner):
        return False
    return _valid_levels(inner)


def matches(topic_filter: str, topic: str) -> bool:
    """Does a (valid) filter match a (valid) topic name? A shared filter matches as its inner filter. A topic
    starting with $ is not matched by a filter starting with + or # (MQTT-4.7.2-1)."""
    topic_filter = split_share(topic_filter)[1]
    if topic[:1] == "$" and topic_filter[:1] in ("+", "#"):
        return False
    flevels = topic_filter.split("/")
    tlevels = topic.split("/")
    for i, flevel in enumerate(flevels):
        if flevel == "#":
            return True  # also the parent level: "a/#" matches "a" (i == len(tlevels))
        if i >= len(tlevels):
            return False
        if flevel != "+" and flevel != tlevels[i]:
            return False
    return len(flevels) == len(tlevels)


def _exact(topic_filter: str) -> bool:
    return "+" not in topic_filter and "#" not in topic_filter


def _levels(text: str) -> list[str]:
    """Levels interned: a million levels named "status" share one string, and lookups hit the identity test."""
    return [sys.intern(level) for level in text.split("/")]


#: The plain subscribers of one filter: (owner, value) while there is one - a tuple costs 56 bytes where a
#: dict costs 184, and most device filters have one subscriber - then a dict owner -> value.
Members = tuple[Hashable, object] | dict[Hashable, object]


def _with(members: Members | None, owner: Hashable, value: object) -> tuple[Members, bool]:
    """members with owner's value set, and whether owner is new."""
    if members is None:
        return (owner, value), True
    if isinstance(members, tuple):
        if members[0] == owner:
            return (owner, value), False
        return {members[0]: members[1], owner: value}, True
    new = owner not in members
    members[owner] = value
    return members, new


def _without(members: Members | None, owner: Hashable) -> tuple[Members | None, bool]:
    """members without owner (None when none is left), and whether owner was one."""
    if members is None:
        return None, False
    if isinstance(members, tuple):
        return (None, True) if members[0] == owner else (members, False)
    if owner not in members:
        return members, False
    del members[owner]
    return (next(iter(members.items())) if len(members) == 1 else members), True


def _extend(plain: list, members: Members | None) -> None:
    if members is None:
        return
    if isinstance(members, tuple):
        plain.append(members)
    else:
        plain.extend(members.items())


class _Node:
    """One level of the subscription trie. Each slot stays None until needed: most nodes of a device tree
    are a path (children) or a leaf (subs), rarely both, and shared groups are rarer still. children is
    (level, child) while there is one - most levels under a device's own one have a single child - then a
    dict level -> child."""

    __slots__ = ("children", "subs", "shared")

    def __init__(self) -> None:
        self.children: tuple[str, _Node] | dict[str, _Node] | None = None
        #: the plain subscriptions whose filter ends here
        self.subs: Members | None = None
        #: share group -> (the whole $share filter, owner -> value in subscription order)
        self.shared: dict[str, tuple[str, dict[Hashable, object]]] | None = None

    def empty(self) -> bool:
        return self.children is None and self.subs is None and not self.shared


class _RetainedNode:
    """One level of the retained trie (children as in _Node); topic is set (with value) when a retained
    message ends here."""

    __slots__ = ("children", "topic", "value")

    def __init__(self) -> None:
        self.children: tuple[str, _RetainedNode] | dict[str, _RetainedNode] | None = None
        self.topic: str | None = None
        self.value: object = None

    def empty(self) -> bool:
        return self.children is None and self.topic is None


N = TypeVar("N", _Node, _RetainedNode)


def _descend(node: N, levels: list[str]) -> N:
    """The node of levels under node, made on the way where missing."""
    for level in levels:
        children = node.children
        if isinstance(children, dict):
            child = children.get(level)
            if child is None:
                child = children[level] = type(node)()
        elif children is None:
            child = type(node)()
            node.children = (level, child)
        elif children[0] == level:
            child = children[1]
        else:
            child = type(node)()
            node.children = {children[0]: children[1], level: child}
        node = child
    return node


def _child(node: N, level: str) -> N | None:
    children = node.children
    if isinstance(children, dict):
        return children.get(level)
    return children[1] if children is not None and children[0] == level else None


def _items(node: N) -> Iterable[tuple[str, N]]:
    children = node.children
    if isinstance(children, dict):
        return children.items()
    return () if children is None else (children,)


def _walk(node: N, levels: list[str]) -> tuple[N, list[tuple[N, str]]] | None:
    """The node of levels and the (parent, level) pairs that lead to it; None if it does not exist."""
    path = []
    for level in levels:
        child = _child(node, level)
        if child is None:
            return None
        path.append((node, level))
        node = child
    return node, path


def _prune(node: N, path: list[tuple[N, str]]) -> None:
    """Drop node and its ancestors while they hold nothing, so removals leave no empty branch behind."""
    for parent, level in reversed(path):
        if not node.empty():
            return
        children = parent.children
        if isinstance(children, dict):
            del children[level]
            if len(children) == 1:
                parent.children = next(iter(children.items()))
        else:
            parent.children = None
        node = parent


class SubscriptionIndex(Generic[V]):
    """Subscriptions by filter, each held by an owner (a session) with a value (its options). An owner has at
    most one subscription per filter (MQTT-3.8.4-3: a second SUBSCRIBE replaces the first). Plain filters
    without wildcards - one per device, the bulk of them - are not in the trie: a dict keyed by the filter
    finds them in one lookup of the topic and costs no node per level."""

    __slots__ = ("_root", "_exact", "_owners", "_count")

    def __init__(self) -> None:
        self._root = _Node()
        #: plain filter without + or # -> its subscribers
        self._exact: dict[str, Members] = {}
        #: owner -> the filter of its one subscription, or a dict of its filters once it has several: most
        #: devices subscribe to one filter, and a str costs nothing (the caller holds it too) where a dict
        #: costs 184 bytes
        self._owners: dict[Hashable, str | dict[str, None]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, owner: Hashable, topic_filter: str, value: V) -> bool:
        """Subscribe; True if new, False if the owner had this filter (its value is replaced).
        ValueError on an invalid filter."""
        if not valid_filter(topic_filter):
            raise ValueError(f"invalid MQTT topic filter {topic_filter!r}")
        group, inner = split_share(topic_filter)
        if group is None and _exact(inner):
            self._exact[topic_filter], new = _with(self._exact.get(topic_filter), owner, value)
        else:
            node = _descend(self._root, _levels(inner))
            if group is None:
                node.subs, new = _with(node.subs, owner, value)
            else:
                if node.shared is None:
                    node.shared = {}
                entry = node.shared.get(group)
                if entry is None:
                    entry = node.shared[group] = (topic_filter, {})
                new = owner not in entry[1]
                entry[1][owner] = value
        if new:
            self._count += 1
            held = self._owners.get(owner)
            if held is None:
                self._owners[owner] = topic_filter
            elif isinstance(held, str):
                self._owners[owner] = {held: None, topic_filter: None}
            else:
                held[topic_filter] = None
        return new

    def remove(self, owner: Hashable, topic_filter: str) -> bool:
        """Unsubscribe; False if the owner had no such subscription. Emptied nodes are pruned, so an
        unsubscribed device leaves nothing behind."""
        group, inner = split_share(topic_filter)
        if group is None and _exact(inner):
            members, gone = _without(self._exact.get(topic_filter), owner)
            if not gone:
                return False
            if members is None:
                del self._exact[topic_filter]
            else:
                self._exact[topic_filter] = members
        else:
            found = _walk(self._root, inner.split("/"))
            if found is None:
                return False
            node, path = found
            if group is None:
                node.subs, gone = _without(node.subs, owner)
            else:
                entry = node.shared.get(group) if node.shared else None
                gone = entry is not None and entry[1].pop(owner, _GONE) is not _GONE
                if entry is not None and not entry[1]:
                    del node.shared[group]  # type: ignore[union-attr]  # entry came from it
                    if not node.shared:
                        node.shared = None
            if not gone:
                return False
            _prune(node, path)
        self._count -= 1
        held = self._owners[owner]
        if isinstance(held, str) or len(held) == 1:
            del self._owners[owner]
        else:
            del held[topic_filter]
        return True

    def remove_owner(self, owner: Hashable) -> int:
        """Drop every subscription of an owner (a session that ended); returns how many."""
        filters = self.filters(owner)
        for topic_filter in filters:
            self.remove(owner, topic_filter)
        return len(filters)

    def filters(self, owner: Hashable) -> list[str]:
        """The filters an owner subscribes to, in subscription order."""
        held = self._owners.get(owner)
        if held is None:
            return []
        return [held] if isinstance(held, str) else list(held)

    def match(self, topic: str) -> tuple[list[Subscriber[V]], list[tuple[str, str, list[Subscriber[V]]]]]:
        """The subscriptions a publish to a valid topic name reaches: (plain (owner, value) pairs - an owner
        with several matching filters appears once per filter -, then one (group, $share filter, members)
        per shared subscription, members in subscription order: the caller picks one of them)."""
        plain: list[Subscriber[V]] = []
        _extend(plain, self._exact.get(topic))
        shared: list[tuple[str, str, list[Subscriber[V]]]] = []
        nodes = [self._root]
        wildcards = topic[:1] != "$"  # MQTT-4.7.2-1: no leading + or # for $-topics
        for level in topic.split("/"):
            following: list[_Node] = []
            for node in nodes:
                children = node.children
                if children is None:
                    continue
                if isinstance(children, tuple):  # one child: no dict lookups
                    key, child = children
                    if key == level or (wildcards and key == "+"):
                        following.append(child)
                    elif wildcards and key == "#":
                        self._collect(child, plain, shared)
                    continue
                if wildcards:
                    multi = children.get("#")
                    if multi is not None:
                        self._collect(multi, plain, shared)
                    single = children.get("+")
                    if single is not None:
                        following.append(single)
                named = children.get(level)
                if named is not None:
                    following.append(named)
            if not following:
                return plain, shared
            nodes = following
            wildcards = True
        for node in nodes:
            self._collect(node, plain, shared)
            multi = _child(node, "#")
            if multi is not None:  # "a/#" also matches "a"
                self._collect(multi, plain, shared)
        return plain, shared

    @staticmethod
    def _collect(node: _Node, plain: list, shared: list) -> None:
        _extend(plain, node.subs)
        if node.shared:
            for group, (topic_filter, members) in node.shared.items():
                shared.append((group, topic_filter, list(members.items())))


class RetainedIndex(Generic[R]):
    """The retained message of each topic (one per topic, MQTT-3.3.1-5), found by filter for a new
    subscription. Plain filters only: retained messages are not sent for shared subscriptions (MQTT 5.0
    section 4.8.2), so the caller strips nothing and asks nothing for them."""

    __slots__ = ("_root", "_count")

    def __init__(self) -> None:
        self._root = _RetainedNode()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def set(self, topic: str, value: R) -> None:
        """Retain value for a valid topic name, replacing the one before."""
        node = _descend(self._root, _levels(topic))
        if node.topic is None:
            self._count += 1
        node.topic = topic
        node.value = value

    def get(self, topic: str) -> R | None:
        found = _walk(self._root, topic.split("/"))
        return None if found is None else found[0].value  # type: ignore[return-value]  # the untyped node holds an R where it holds a topic

    def delete(self, topic: str) -> bool:
        """Forget a topic's retained message (an empty retained payload, MQTT-3.3.1-6); False if none.
        Emptied nodes are pruned."""
        found = _walk(self._root, topic.split("/"))
        if found is None or found[0].topic is None:
            return False
        node, path = found
        node.topic = None
        node.value = None
        self._count -= 1
        _prune(node, path)
        return True

    def match(self, topic_filter: str) -> list[tuple[str, R]]:
        """(topic, value) of every retained message a valid plain filter matches. Only the branches the
        filter names are walked; + and # at the first level skip $-topics (MQTT-4.7.2-1)."""
        found: list[tuple[str, R]] = []
        levels = topic_filter.split("/")
        last = len(levels)
        stack: list[tuple[_RetainedNode, int]] = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            if depth == last:
                if node.topic is not None:
                    found.append((node.topic, node.value))  # type: ignore[arg-type]  # an R where a topic is
                continue
            level = levels[depth]
            if level == "#":
                if node.topic is not None:  # "a/#" matches "a" (the root holds no topic)
                    found.append((node.topic, node.value))  # type: ignore[arg-type]  # an R where a topic is
                for child in self._children(node, depth):
                    found.extend(self._subtree(child))
            elif level == "+":
                stack.extend((child, depth + 1) for child in self._children(node, depth))
            else:
                named = _child(node, level)
                if named is not None:
                    stack.append((named, depth + 1))
        return found

    @staticmethod
    def _children(node: _RetainedNode, depth: int) -> Iterator[_RetainedNode]:
        """The children a wildcard at this depth reaches: not the $ ones at the first level."""
        return (child for level, child in _items(node) if depth or level[:1] != "$")

    @staticmethod
    def _subtree(node: _RetainedNode) -> Iterator[tuple[str, R]]:
        stack = [node]
        while stack:
            node = stack.pop()
            if node.topic is not None:
                yield node.topic, node.value  # type: ignore[misc]  # an R where a topic is
            stack.extend(child for _, child in _items(node))
