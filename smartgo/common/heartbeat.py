"""HeartbeatData as clients send it (HEART_BEAT's JSON body): the consumer groups with their
subscriptions and the producer groups of one client. The broker registers clients with it and the
ACL check reads the groups and topics a heartbeat needs from it; every field is checked
(BodyError names the first bad one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from smartgo.common.bodies import BodyError, Fields, as_int, parse_body

if TYPE_CHECKING:
    from smartgo.store.record import MessageExt

SUB_ALL = "*"
# Java's declaration order: the C++ client sends these enums as ordinals
CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                "CONSUME_FROM_TIMESTAMP")


@dataclass(slots=True)
class SubscriptionData:
    """One subscription of a consumer group (FilterAPI's SubscriptionData): what the client
    builds (smartgo.client.subscription.build_subscription) and sends in its heartbeat, and what
    the broker reads from it. The broker filters by the tag hash codes, the client again by the
    tags, since different tags can share a hash."""

    topic: str
    sub_string: str = SUB_ALL
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"
    class_filter_mode: bool = False

    @property
    def takes_all(self) -> bool:
        """Nothing left for the client to filter (every tag, or SQL92 the broker applied)."""
        return not self.tags_set

    def matches(self, msg: MessageExt) -> bool:
        """PullAPIWrapper's client-side filter: with tags named, only messages whose TAGS is one
        of them (a message without tags does not match)."""
        if not self.tags_set:
            return True
        tags = msg.properties.get("TAGS")
        return tags is not None and tags in self.tags_set

    def to_json(self) -> dict:
        """SubscriptionData as fastjson writes it in HeartbeatData."""
        return {"classFilterMode": self.class_filter_mode, "codeSet": list(self.code_set),
                "expressionType": self.expression_type, "subString": self.sub_string,
                "subVersion": self.sub_version, "tagsSet": list(self.tags_set), "topic": self.topic}


@dataclass(slots=True)
class ConsumerData:
    group: str
    consume_type: str
    message_model: str
    consume_from_where: str
    subscriptions: list[SubscriptionData]


@dataclass(slots=True)
class HeartbeatData:
    client_id: str
    consumers: list[ConsumerData]
    producers: list[str]


def parse_subscription(f: Fields) -> SubscriptionData:
    codes = [as_int(c, f"{f.body}: {f.path}.codeSet[{i}]") for i, c in enumerate(f.array("codeSet", []))]
    tags = f.array("tagsSet", [])
    if not all(isinstance(t, str) for t in tags):
        raise BodyError(f"{f.body}: {f.path}.tagsSet holds a non-string")
    return SubscriptionData(f.text("topic"), f.text("subString", SUB_ALL), tags, codes, f.integer("subVersion", 0),
                            f.text("expressionType", "TAG").upper(), f.flag("classFilterMode", False))


def parse_heartbeat(raw: bytes | None) -> HeartbeatData:
    """HeartbeatData JSON (facts D); BodyError names the first bad field."""
    hb = parse_body(raw, "HeartbeatData")
    consumers = []
    for c in hb.objects("consumerDataSet"):
        consumers.append(ConsumerData(c.text("groupName"), c.enum("consumeType", CONSUME_TYPES, "CONSUME_PASSIVELY"),
                                      c.enum("messageModel", MODELS, "CLUSTERING"),
                                      c.enum("consumeFromWhere", CONSUME_FROM, "CONSUME_FROM_LAST_OFFSET"),
                                      [parse_subscription(s) for s in c.objects("subscriptionDataSet")]))
    producers = [p.text("groupName") for p in hb.objects("producerDataSet")]
    return HeartbeatData(hb.text("clientID"), consumers, producers)
