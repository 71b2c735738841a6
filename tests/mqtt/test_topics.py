"""Topic names, filters and the two tries (smartgo.mqtt.topics): the examples of MQTT 5.0 sections 4.7 and
4.8.2, then hypothesis against the one-line definition (matches) for both indexes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartgo.mqtt.topics import (MAX_TOPIC_BYTES, RetainedIndex, SubscriptionIndex, matches, split_share, valid_filter,
                                 valid_topic_name)

TOPICS = ["sport/tennis/player1", "sport/tennis/player1/ranking", "sport/tennis/player1/score/wimbledon",
          "sport", "sport/", "sport/tennis", "/finance", "finance", "$SYS/monitor/Clients", "$SYS", "/", "a//b"]


@pytest.mark.parametrize("name", ["sport/tennis/player1", "/", "a//b", "with space", "$SYS/x", "sport/", "é/ü",
                                  "a" * MAX_TOPIC_BYTES])
def test_valid_topic_names(name: str) -> None:
    assert valid_topic_name(name)


@pytest.mark.parametrize("name", ["", "a/+", "a/#", "+", "#", "sport+", "a\x00b", "\ud800", "a" * (MAX_TOPIC_BYTES + 1),
                                  "é" * (MAX_TOPIC_BYTES // 2 + 1)])
def test_invalid_topic_names(name: str) -> None:
    assert not valid_topic_name(name)


@pytest.mark.parametrize("flt", ["#", "+", "sport/tennis/player1/#", "sport/#", "sport/tennis/+", "+/tennis/#",
                                 "sport/+/player1", "+/+", "/+", "$SYS/#", "a//b", "/", "$share/g/a/+",
                                 "$share/consumer1/sport/tennis/+", "$share/g/#", "$share/g//"])
def test_valid_filters(flt: str) -> None:
    assert valid_filter(flt)


@pytest.mark.parametrize("flt", ["", "sport/tennis#", "sport/tennis/#/ranking", "sport+", "+sport", "#/a", "a/##",
                                 "a/++", "a\x00", "$share", "$share/", "$share/g", "$share/g/", "$share//a",
                                 "$share/g+/a", "$share/g#/a", "$share/g/a#"])
def test_invalid_filters(flt: str) -> None:
    assert not valid_filter(flt)


def test_split_share() -> None:
    assert split_share("$share/g/a/+") == ("g", "a/+")
    assert split_share("$share/g//x") == ("g", "/x")
    assert split_share("a/+") == (None, "a/+")
    assert split_share("$SYS/x") == (None, "$SYS/x")


# (filter, the TOPICS it matches): sections 4.7.1.2, 4.7.1.3 and 4.7.2
STANDARD = [
    ("sport/tennis/player1/#", {"sport/tennis/player1", "sport/tennis/player1/ranking",
                                "sport/tennis/player1/score/wimbledon"}),
    ("sport/#", {"sport", "sport/", "sport/tennis", "sport/tennis/player1", "sport/tennis/player1/ranking",
                 "sport/tennis/player1/score/wimbledon"}),
    ("sport/tennis/+", {"sport/tennis/player1"}),
    ("sport/+", {"sport/", "sport/tennis"}),
    ("+", {"sport", "finance"}),
    ("+/+", {"/finance", "sport/", "sport/tennis", "/"}),
    ("/+", {"/finance", "/"}),
    ("#", set(TOPICS) - {"$SYS/monitor/Clients", "$SYS"}),
    ("+/monitor/Clients", set()),
    ("$SYS/#", {"$SYS/monitor/Clients", "$SYS"}),
    ("$SYS/monitor/+", {"$SYS/monitor/Clients"}),
    ("+/tennis/#", {"sport/tennis", "sport/tennis/player1", "sport/tennis/player1/ranking",
                    "sport/tennis/player1/score/wimbledon"}),
    ("a/+/b", {"a//b"}),
    ("$share/g/sport/+", {"sport/", "sport/tennis"}),
    ("$share/g/#", set(TOPICS) - {"$SYS/monitor/Clients", "$SYS"}),
]


@pytest.mark.parametrize(("flt", "expected"), STANDARD)
def test_matches_the_standards_examples(flt: str, expected: set[str]) -> None:
    assert {t for t in TOPICS if matches(flt, t)} == expected


@pytest.mark.parametrize(("flt", "expected"), STANDARD)
def test_index_matches_the_standards_examples(flt: str, expected: set[str]) -> None:
    index: SubscriptionIndex[int] = SubscriptionIndex()
    index.add("c", flt, 1)
    got = set()
    for topic in TOPICS:
        plain, shared = index.match(topic)
        if plain or shared:
            got.add(topic)
    assert got == expected


def test_add_replaces_and_remove_prunes() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    assert index.add("c1", "a/+/c", "q0")
    assert not index.add("c1", "a/+/c", "q1")  # a resubscription replaces the options
    assert index.add("c2", "a/+/c", "q2")
    assert index.add("c1", "a/#", "q3")
    assert index.add("c2", "a/b/c", "q4")
    assert not index.add("c2", "a/b/c", "q5")
    assert len(index) == 4
    assert index.match("a/b/c") == ([("c2", "q5"), ("c1", "q3"), ("c1", "q1"), ("c2", "q2")], [])
    assert index.remove("c2", "a/b/c")
    assert not index.remove("c2", "a/b/c")
    assert not index.remove("c1", "a/b/c")
    assert len(index) == 3
    assert index.match("a/b/c") == ([("c1", "q3"), ("c1", "q1"), ("c2", "q2")], [])
    assert index.filters("c1") == ["a/+/c", "a/#"]
    assert index.remove("c1", "a/+/c")
    assert not index.remove("c1", "a/+/c")
    assert not index.remove("c1", "a/x")
    assert not index.remove("c9", "a/#")
    assert index.match("a/b/c") == ([("c1", "q3"), ("c2", "q2")], [])
    assert index.remove_owner("c1") == 1
    assert index.remove_owner("c1") == 0
    assert index.remove_owner("c2") == 1
    assert len(index) == 0
    assert index.match("a/b/c") == ([], [])
    assert index._root.children is None  # nothing left behind for a million unsubscribed devices
    assert not index._owners and not index._exact


def test_parent_of_multi_level_wildcard() -> None:
    index: SubscriptionIndex[int] = SubscriptionIndex()
    index.add("c", "a/b/#", 1)
    assert index.match("a/b") == ([("c", 1)], [])
    assert index.match("a") == ([], [])
    assert index.match("a/b/c/d") == ([("c", 1)], [])


def test_shared_groups() -> None:
    index: SubscriptionIndex[int] = SubscriptionIndex()
    index.add("m1", "$share/g1/devices/+/cmd", 1)
    index.add("m2", "$share/g1/devices/+/cmd", 2)
    index.add("m3", "$share/g2/devices/+/cmd", 3)
    index.add("m1", "$share/g1/devices/#", 4)
    index.add("p", "devices/42/cmd", 5)
    plain, shared = index.match("devices/42/cmd")
    assert plain == [("p", 5)]
    assert sorted(shared) == [("g1", "$share/g1/devices/#", [("m1", 4)]),
                              ("g1", "$share/g1/devices/+/cmd", [("m1", 1), ("m2", 2)]),
                              ("g2", "$share/g2/devices/+/cmd", [("m3", 3)])]
    assert index.remove_owner("m1") == 2
    assert index.match("devices/42/cmd")[1] == [("g1", "$share/g1/devices/+/cmd", [("m2", 2)]),
                                                ("g2", "$share/g2/devices/+/cmd", [("m3", 3)])]
    assert not index.remove("m2", "$share/g2/devices/+/cmd")  # another group's filter
    assert index.remove("m2", "$share/g1/devices/+/cmd")
    assert index.match("devices/42/cmd") == ([("p", 5)], [("g2", "$share/g2/devices/+/cmd", [("m3", 3)])])
    assert len(index) == 2
    assert index.remove_owner("p") + index.remove_owner("m3") == 2
    assert not index._owners and not index._exact and index._root.children is None


def test_shared_wildcard_does_not_match_dollar_topics() -> None:
    index: SubscriptionIndex[int] = SubscriptionIndex()
    index.add("m", "$share/g/#", 1)
    index.add("s", "$share/g/$SYS/#", 2)
    assert index.match("$SYS/x") == ([], [("g", "$share/g/$SYS/#", [("s", 2)])])


def test_invalid_filter_is_refused() -> None:
    index: SubscriptionIndex[int] = SubscriptionIndex()
    with pytest.raises(ValueError, match="invalid MQTT topic filter"):
        index.add("c", "a/#/b", 1)
    assert len(index) == 0


def test_match_visits_only_the_topics_branch() -> None:
    """Cost independent of other topics' subscribers: with 20,000 devices subscribed to their own topic and
    20,000 to a wildcard filter of their own branch, a match is one lookup of the topic among the plain
    filters, then one child per level in the trie (counted by dicts that record their lookups and scans)."""
    index: SubscriptionIndex[int] = SubscriptionIndex()
    for i in range(20000):
        index.add(f"d{i}", f"devices/{i}/cmd", i)
        index.add(f"w{i}", f"devices/{i}/+", i)
    lookups = []

    class Counting(dict):
        """Records each lookup, and a scan as "scan"."""

        def get(self, key, default=None):
            lookups.append(key)
            return super().get(key, default)

        def __iter__(self):
            lookups.append("scan")
            return super().__iter__()

        def values(self):
            lookups.append("scan")
            return super().values()

        def items(self):
            lookups.append("scan")
            return super().items()

    index._exact = Counting(index._exact)
    assert isinstance(index._root.children, tuple)  # one child: "devices"
    devices = index._root.children[1]
    assert isinstance(devices.children, dict)
    devices.children = Counting(devices.children)
    assert index.match("devices/42/cmd") == ([("d42", 42), ("w42", 42)], [])
    assert lookups == ["devices/42/cmd", "#", "+", "42"]


def test_retained_index() -> None:
    retained: RetainedIndex[str] = RetainedIndex()
    for topic in TOPICS:
        retained.set(topic, topic.upper())
    assert len(retained) == len(TOPICS)
    retained.set("sport", "again")
    assert len(retained) == len(TOPICS)
    assert retained.get("sport") == "again"
    assert retained.get("sport/tennis/player") is None
    assert retained.get("sport/tennis/player1/ranking/x") is None
    for flt, expected in STANDARD:
        if not flt.startswith("$share/"):
            assert {t for t, _ in retained.match(flt)} == expected, flt
    assert dict(retained.match("sport/tennis/+")) == {"sport/tennis/player1": "SPORT/TENNIS/PLAYER1"}
    assert retained.delete("sport/tennis/player1")
    assert not retained.delete("sport/tennis/player1")
    assert not retained.delete("sport/tennis/player9")
    assert retained.get("sport/tennis/player1") is None
    assert retained.get("sport/tennis/player1/ranking") == "SPORT/TENNIS/PLAYER1/RANKING"
    for topic in TOPICS:
        retained.delete(topic)
    assert len(retained) == 0
    assert retained.match("#") == []
    assert retained._root.children is None


# ---- hypothesis: both tries agree with matches() ----------------------------------------------------------------
LEVELS = ["a", "b", "", "$s"]
topic_names = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=4).map("/".join).filter(valid_topic_name)
plain_filters = st.builds(
    lambda levels, tail: "/".join(levels + tail),
    st.lists(st.sampled_from(LEVELS + ["+", "+"]), min_size=0, max_size=4),
    st.sampled_from([[], [], ["#"]])).filter(valid_filter)
filters = st.one_of(plain_filters, plain_filters.map(lambda f: "$share/g/" + f),
                    plain_filters.map(lambda f: "$share/h/" + f))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["c1", "c2", "c3"]), filters), max_size=12),
       st.lists(st.tuples(st.sampled_from(["c1", "c2", "c3"]), filters), max_size=6),
       st.lists(topic_names, min_size=1, max_size=8))
def test_index_equals_brute_force(subs: list[tuple[str, str]], unsubs: list[tuple[str, str]],
                                  topics: list[str]) -> None:
    index: SubscriptionIndex[int] = SubscriptionIndex()
    model: dict[tuple[str, str], int] = {}
    for n, (owner, flt) in enumerate(subs):
        assert index.add(owner, flt, n) == ((owner, flt) not in model)
        model[(owner, flt)] = n
    for owner, flt in unsubs:
        assert index.remove(owner, flt) == ((owner, flt) in model)
        model.pop((owner, flt), None)
    assert len(index) == len(model)
    for topic in topics:
        plain, shared = index.match(topic)
        assert sorted(plain) == sorted((o, v) for (o, f), v in model.items()
                                       if split_share(f)[0] is None and matches(f, topic))
        expected_shared: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for (owner, flt), v in model.items():  # model keeps subscription order within a group
            group = split_share(flt)[0]
            if group is not None and matches(flt, topic):
                expected_shared.setdefault((group, flt), []).append((owner, v))
        assert {(g, f): members for g, f, members in shared} == expected_shared
        assert len(shared) == len(expected_shared)


@settings(max_examples=300, deadline=None)
@given(st.lists(topic_names, max_size=12), st.lists(topic_names, max_size=4), plain_filters)
def test_retained_equals_brute_force(stored: list[str], deleted: list[str], flt: str) -> None:
    retained: RetainedIndex[int] = RetainedIndex()
    model: dict[str, int] = {}
    for n, topic in enumerate(stored):
        retained.set(topic, n)
        model[topic] = n
    for topic in deleted:
        assert retained.delete(topic) == (topic in model)
        model.pop(topic, None)
    assert len(retained) == len(model)
    assert sorted(retained.match(flt)) == sorted((t, v) for t, v in model.items() if matches(flt, t))
    for topic in model:
        assert retained.get(topic) == model[topic]
