"""Subscription expressions (FilterAPI.buildSubscriptionData): "*" takes everything, otherwise
"TagA || TagB" names the tags. The broker filters by tag hash (codeSet) and the client re-filters
by the tag string (tagsSet), because different tags can share a hash."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from smartgo.client.errors import ClientError
from smartgo.store.java_hash import java_hash
from smartgo.store.record import MessageExt

SUB_ALL = "*"


class SubscriptionError(ClientError, ValueError):
    """An expression that names no tag."""


@dataclass(slots=True)
class SubscriptionData:
    topic: str
    sub_string: str = SUB_ALL
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"

    @classmethod
    def build(cls, topic: str, expression: str | None = None, version_ms: int | None = None) -> SubscriptionData:
        sub = SubscriptionData(topic, sub_version=int(time.time() * 1000) if version_ms is None else version_ms)
        expr = (expression or "").strip()
        if not expr or expr == SUB_ALL:
            return sub
        sub.sub_string = expr
        for tag in expr.split("||"):
            tag = tag.strip()
            if tag and tag not in sub.tags_set:
                sub.tags_set.append(tag)
                sub.code_set.append(java_hash(tag))
        if not sub.tags_set:
            raise SubscriptionError(f"subscription expression {expression!r} names no tag")
        return sub

    @property
    def takes_all(self) -> bool:
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
        return {"classFilterMode": False, "codeSet": list(self.code_set), "expressionType": self.expression_type,
                "subString": self.sub_string, "subVersion": self.sub_version, "tagsSet": list(self.tags_set),
                "topic": self.topic}
