"""PULL_MESSAGE (11) in a net actor, with long polling through the hold actor.

A pull reads the ConsumeQueue and the CommitLog straight from the mapped files, bounded by the
queue's published max offset and the written position, and answers with the raw records as
memoryviews (no copy through another actor, none into the socket buffer's way). Response
codes follow the reference's edge-case table (PullMessageProcessor + GetMessageStatus);
suggestWhichBrokerId, nextBeginOffset, minOffset and maxOffset are in every answer, the remark
is the status name.

A pull with the suspend flag that finds nothing (PULL_NOT_FOUND) is parked: the hold actor gets
its token, queue, offset and deadline (now + suspendTimeoutMillis) and hands the token back when
something arrives or the deadline passes; the pull then runs again and is answered. If the hold
actor restarts, parked pulls are parked again; past its deadline (plus a grace) a pull is
answered here whatever happened to the hold actor.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from smartgo.broker.rings import WAKE_ARRIVED, Batcher, iter_wakes, monotonic_ms, park_record
from smartgo.net.codes import PullSysFlag, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager
from smartgo.store.java_hash import tags_code
from smartgo.store.reads import GetStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from smartgo.broker.net_actor import NetActor

DEADLINE_GRACE_MS = 2000          # after its deadline a parked pull is answered here, hold or no hold
RELEASE_EVERY = 64 << 20          # bytes served between drops of the reader's pages from RSS

_CODES = {
    GetStatus.FOUND: ResponseCode.SUCCESS,
    GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}
_EMPTY_QUEUE = (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE)


@dataclass(slots=True)
class PullHeader:
    group: str
    topic: str
    queue_id: int
    offset: int
    max_nums: int
    sys_flag: int
    commit_offset: int
    suspend_ms: int
    subscription: str | None
    expression_type: str


def parse_header(r: RemotingCommand) -> PullHeader:
    """PullMessageRequestHeader; HeaderFieldError names a missing or malformed field."""
    return PullHeader(r.ext_str("consumerGroup"), r.ext_str("topic"), r.ext_int("queueId"), r.ext_int("queueOffset"),
                      r.ext_int("maxMsgNums"), r.ext_int("sysFlag"), r.ext_int("commitOffset"),
                      r.ext_int("suspendTimeoutMillis"), r.ext_str("subscription", None),
                      r.ext_str("expressionType", "TAG"))


def tag_codes(expression: str | None) -> frozenset[int] | None:
    """FilterAPI.buildSubscriptionData for TAG: None reads every message ("*" or empty)."""
    if expression is None or expression.strip() in ("", "*"):
        return None
    tags = [t.strip() for t in expression.split("||") if t.strip()]
    return frozenset(tags_code(t) for t in tags) if tags else None


@dataclass(slots=True)
class ParkedPull:
    conn: Connection
    request: RemotingCommand
    header: PullHeader
    deadline: int                 # CLOCK_MONOTONIC ms


class PullProcessor:
    def __init__(self, net: NetActor) -> None:
        self.view = net.view
        self.parks = Batcher(net.park_ring)       # a full ring (hold down): the deadline sweep answers them
        self.parked: dict[int, ParkedPull] = {}
        self._tokens = itertools.count(1)
        self._filters: dict[str, frozenset[int] | None] = {}
        self._served = 0
        # The control-plane seam: the subscription a consumer group registered with HEART_BEAT
        # for a topic (expression), used when a pull carries none. Until that issue lands nobody
        # registers any, and such a pull reads every tag ("*").
        self.registered_subscription: Callable[[str, str], str | None] = lambda group, topic: None

    @eager
    async def process(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        # The offset a pull carries (FLAG_COMMIT_OFFSET, header commitOffset) belongs to the control
        # plane's offset table (the next issue), which will take it from here over the channel.
        return self.run(conn, request, parse_header(request), None, True)

    def run(self, conn: Connection, request: RemotingCommand, h: PullHeader, deadline: int | None,
            may_suspend: bool) -> RemotingCommand | None:
        """The pull itself; None when it was parked (the answer comes later)."""
        view = self.view
        cfg = view.topic(h.topic)
        if cfg is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                         f"topic[{h.topic}] not exist, apply first please!")
        if not cfg.readable:
            return request.make_response(ResponseCode.NO_PERMISSION,
                                         f"the topic[{h.topic}] pulling message is forbidden")
        if not 0 <= h.queue_id < cfg.read_queues:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"queueId[{h.queue_id}] is illegal, topic:[{h.topic}] topicConfig."
                                         f"readQueueNums:[{cfg.read_queues}] consumer:[{conn.remote_address}]")
        if h.expression_type != "TAG":
            return request.make_response(ResponseCode.SYSTEM_ERROR, "The broker does not support consumer to "
                                         f"filter message by {h.expression_type}")
        expression = h.subscription if h.sys_flag & PullSysFlag.SUBSCRIPTION else \
            self.registered_subscription(h.group, h.topic)
        codes = self._filters.get(expression) if expression is not None else None
        if expression is not None and expression not in self._filters:
            codes = self._filters[expression] = tag_codes(expression)
            if len(self._filters) > 10_000:
                self._filters.clear()
        reader = view.fresh_reader()
        max_offset = view.max_offset(h.topic, h.queue_id)
        r = reader.get_messages(h.topic, h.queue_id, h.offset, h.max_nums, max_offset, view.written.get(), codes)
        if r.status in _EMPTY_QUEUE:
            code = ResponseCode.PULL_OFFSET_MOVED if h.offset != 0 else ResponseCode.PULL_NOT_FOUND
        else:
            code = _CODES[r.status]
        if code == ResponseCode.PULL_NOT_FOUND and may_suspend and h.sys_flag & PullSysFlag.SUSPEND:
            self.park(conn, request, h, monotonic_ms() + h.suspend_ms if deadline is None else deadline)
            return None
        ext = {"suggestWhichBrokerId": "0", "nextBeginOffset": str(r.next_begin_offset),
               "minOffset": str(r.min_offset), "maxOffset": str(r.max_offset)}
        if code != ResponseCode.SUCCESS:
            return request.make_response(code, r.status.value, ext)
        self._served += r.buffer_total_size
        if self._served >= RELEASE_EVERY:
            self._served = 0
            asyncio.get_running_loop().call_soon(reader.release_pages)   # after this write took the views
        return request.make_response(code, r.status.value, ext, r.buffers)

    # ---- long polling -----------------------------------------------------------------------------------
    def park(self, conn: Connection, request: RemotingCommand, h: PullHeader, deadline: int) -> None:
        token = next(self._tokens)
        self.parked[token] = ParkedPull(conn, request, h, deadline)
        self._send_park(token, self.parked[token])

    def _send_park(self, token: int, p: ParkedPull) -> None:
        self.parks.put(park_record(token, p.deadline, p.header.offset, p.header.queue_id, p.header.topic.encode()))

    def on_wakes(self, records: list[memoryview]) -> None:
        now = monotonic_ms()
        for mv in records:
            for token, reason in iter_wakes(mv):
                p = self.parked.pop(token, None)
                if p is not None:
                    self._answer(p, reason == WAKE_ARRIVED and now < p.deadline)

    def _answer(self, p: ParkedPull, may_suspend: bool) -> None:
        if p.conn.closed:
            return
        try:
            response = self.run(p.conn, p.request, p.header, p.deadline, may_suspend)
        except Exception as exc:
            response = p.request.make_response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if response is not None:
            p.conn.send(response)

    def repark_all(self) -> None:
        """The hold actor (re)started empty: hand it every pull still parked here."""
        for token, p in self.parked.items():
            self._send_park(token, p)

    def housekeep(self, now_ms: int) -> None:
        """Answer pulls past their deadline whatever the hold actor does (it may be down)."""
        late = [t for t, p in self.parked.items() if now_ms > p.deadline + DEADLINE_GRACE_MS or p.conn.closed]
        for token in late:
            self._answer(self.parked.pop(token), False)

    def answer_all(self) -> None:
        """At stop: every parked pull gets its answer now."""
        parked, self.parked = self.parked, {}
        for p in parked.values():
            self._answer(p, False)
