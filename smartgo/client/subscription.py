"""Subscription expressions (FilterAPI.build): by tag, "*" takes everything, otherwise "TagA ||
TagB" names the tags. The broker filters by tag hash (codeSet) and the client re-filters by the
tag string (tagsSet), because different tags can share a hash. By SQL92
(MessageSelector.by_sql("a > 5 AND TAGS IN ('A', 'B')")) the broker evaluates the expression on
each message's properties and the client takes what it gets; the expression is compiled here
first, so a mistake shows at subscribe(). SubscriptionData itself (the fields and their JSON) is
the one the broker parses: smartgo.common.heartbeat."""

from __future__ import annotations

import time
from dataclasses import dataclass

from smartgo.client.errors import ClientError
from smartgo.common.heartbeat import SUB_ALL, SubscriptionData
from smartgo.filter import SQL92, TAG, SelectorError, compile_selector
from smartgo.store.java_hash import java_hash

__all__ = ["SUB_ALL", "MessageSelector", "SubscriptionData", "SubscriptionError", "build_subscription"]


class SubscriptionError(ClientError, ValueError):
    """An expression that names no tag, or SQL92 that does not compile."""


@dataclass(frozen=True, slots=True)
class MessageSelector:
    """What subscribe() takes besides a tag expression string (Java's MessageSelector)."""

    expression_type: str
    expression: str

    @classmethod
    def by_sql(cls, sql: str) -> MessageSelector:
        """Messages whose properties make the SQL92 expression TRUE (e.g. "a BETWEEN 0 AND 3")."""
        return cls(SQL92, sql)

    @classmethod
    def by_tag(cls, tags: str = SUB_ALL) -> MessageSelector:
        return cls(TAG, tags)


def build_subscription(topic: str, expression: str | MessageSelector | None = None,
                       version_ms: int | None = None) -> SubscriptionData:
    """FilterAPI.buildSubscriptionData: a tag expression's tags and their hash codes, or a SQL92
    expression compiled here first (SubscriptionError when it names no tag or does not compile)."""
    sub = SubscriptionData(topic, sub_version=int(time.time() * 1000) if version_ms is None else version_ms)
    if isinstance(expression, MessageSelector):
        if expression.expression_type != TAG:
            return _sql(sub, expression)
        expression = expression.expression
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


def _sql(sub: SubscriptionData, selector: MessageSelector) -> SubscriptionData:
    if selector.expression_type != SQL92:
        raise SubscriptionError(f"unknown expression type {selector.expression_type!r} (TAG or SQL92)")
    try:
        compile_selector(selector.expression)
    except SelectorError as exc:
        raise SubscriptionError(f"SQL92 expression {selector.expression!r:.200} does not compile: {exc}") from None
    sub.sub_string, sub.expression_type = selector.expression, SQL92
    return sub
