"""What a pull filters by (4.x's ExpressionMessageFilter with the broker half of
ConsumerFilterManager), and CHECK_CLIENT_CONFIG (46), in a net actor.

A TAG subscription filters by the ConsumeQueue's tag hash. A SQL92 subscription
(MessageSelector.bySql) is evaluated on each candidate record's properties, read from the
mapped CommitLog; a message matches only when the expression is TRUE (an evaluation error or
NULL does not match). Expressions are compiled once per net actor and kept by their text, since
every pull of a group repeats it, within a budget of text: a compiled expression takes ~30x its
text, and a client sending ever new 64 KiB expressions must not grow the net actor without bound.
`enable_property_filter` off answers SQL92 as a 4.x broker with enablePropertyFilter=false does.
4.x's optional bloom-filter bitmap in ConsumeQueueExt is not kept: it only saves reading records
that cannot match.

A Java push consumer sends CHECK_CLIENT_CONFIG for every non-TAG subscription at its start, and
refuses to start unless the broker answers SUCCESS; a broker that cannot compile the expression
answers SUBSCRIPTION_PARSE_FAILED with the reason, so the mistake shows at the client's start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from smartgo.common.bodies import BodyError, Fields, parse_body
from smartgo.filter import SQL92, TAG, SelectorError, compile_selector, is_tag_type
from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager
from smartgo.store.java_hash import tags_code
from smartgo.store.record import decode_properties

log = logging.getLogger(__name__)

CACHE_CHARS = 1 << 20       # expression text kept compiled per net actor (~30x that in memory, worst case)
ENTRY_CHARS = 100           # what an entry counts besides its text


class FilterError(Exception):
    """An expression this broker cannot filter by: the message is the reason."""


@dataclass(frozen=True, slots=True)
class MessageFilter:
    codes: frozenset[int] | None                 # tag hash codes; None: any tag
    match: Callable[[bytes], bool] | None        # on a record's raw properties; None: every record


EVERYTHING = MessageFilter(None, None)


def tag_codes(expression: str | None) -> frozenset[int] | None:
    """FilterAPI.buildSubscriptionData for TAG: None reads every message ("*" or empty)."""
    if expression is None or expression.strip() in ("", "*"):
        return None
    tags = [t.strip() for t in expression.split("||") if t.strip()]
    return frozenset(tags_code(t) for t in tags) if tags else None


def _property_match(expression: str) -> Callable[[bytes], bool]:
    matches = compile_selector(expression).matches
    return lambda props: matches(decode_properties(props))


class Filters:
    """Compiled filters by (expression type, expression) for one net actor."""

    def __init__(self, property_filter: bool, budget: int = CACHE_CHARS) -> None:
        self.property_filter = property_filter
        # a failure is kept as its reason: raising one exception object again and again would
        # chain every raise's frames onto its traceback
        self._cache: dict[tuple[str, str | None], MessageFilter | str] = {}
        self._budget = budget
        self._chars = 0

    def unsupported(self, expression_type: str) -> str | None:
        """The remark of a broker that does not filter by this type (checked before parsing)."""
        if is_tag_type(expression_type) or self.property_filter:
            return None
        return f"The broker does not support consumer to filter message by {expression_type}"

    def get(self, expression_type: str, expression: str | None) -> MessageFilter:
        """The filter; FilterError when the expression does not compile or the type is unknown."""
        key = (expression_type, expression)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._build(expression_type, expression)
            self._chars += _cost(key)
            while self._chars > self._budget and len(self._cache) > 1:     # the oldest go: they recompile
                oldest = next(iter(self._cache))
                del self._cache[oldest]
                self._chars -= _cost(oldest)
        if isinstance(got, str):
            raise FilterError(got)
        return got

    @staticmethod
    def _build(expression_type: str, expression: str | None) -> MessageFilter | str:
        """The filter, or why there is none."""
        if is_tag_type(expression_type):
            codes = tag_codes(expression)
            return EVERYTHING if codes is None else MessageFilter(codes, None)
        if expression_type != SQL92:
            return f"unknown expression type {expression_type!r} (TAG or SQL92)"
        try:
            return MessageFilter(None, _property_match(expression or ""))
        except SelectorError as exc:
            return f"invalid SQL92 expression {expression!r:.200}: {exc}"


def _cost(key: tuple[str, str | None]) -> int:
    return len(key[1] or "") + ENTRY_CHARS


class CheckClientConfigProcessor:
    """CHECK_CLIENT_CONFIG: CheckClientRequestBody {clientId, group, subscriptionData}."""

    def __init__(self, filters: Filters) -> None:
        self.filters = filters

    @eager
    async def process(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            body = parse_body(request.body_bytes(), "CheckClientRequestBody")
            raw = body.obj.get("subscriptionData")
            if raw is None:
                return request.make_response(ResponseCode.SUCCESS)
            sub = Fields(raw, "subscriptionData", body.body)
            expression_type, expression = sub.text("expressionType", TAG), sub.text("subString", "")
        except BodyError as exc:
            log.warning("%s: CHECK_CLIENT_CONFIG: %s", conn, exc)
            return request.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
        if is_tag_type(expression_type):
            return request.make_response(ResponseCode.SUCCESS)
        remark = self.filters.unsupported(expression_type)
        if remark is not None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark)
        try:
            self.filters.get(expression_type, expression)
        except FilterError as exc:
            log.warning("%s: CHECK_CLIENT_CONFIG of group %s: %s", conn, body.obj.get("group"), exc)
            return request.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        return request.make_response(ResponseCode.SUCCESS)
