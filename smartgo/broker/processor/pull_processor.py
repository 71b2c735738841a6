"""PULL_MESSAGE (11) in a net actor, with long polling through the hold actor.

Checks, in PullMessageProcessor's order: the broker may be read (brokerPermission); the
consumer group exists (created on first sight when groups are auto-created: the broker actor is
told, the pull goes on with the defaults) and may consume; the topic exists, may be read, has
the queue; the subscription comes from the request (FLAG_SUBSCRIPTION) or from what the group
registered by HEART_BEAT - the group state the broker actor publishes to this net actor
(smartgo.broker.managers.subscriptions) - with SUBSCRIPTION_NOT_EXIST / SUBSCRIPTION_NOT_LATEST when
that is missing or older than the pull's subVersion. A pull with FLAG_COMMIT_OFFSET commits its
commitOffset for the group (master only; coalesced per loop iteration on the request channel).

A pull reads the ConsumeQueue and the CommitLog straight from the mapped files, bounded by the
queue's published max offset and the written position, and answers with the raw records as
memoryviews (no copy through another actor, none into the socket buffer's way). Response
codes follow the reference's edge-case table (PullMessageProcessor + GetMessageStatus);
suggestWhichBrokerId, nextBeginOffset, minOffset and maxOffset are in every answer, the remark
is the status name. suggestWhichBrokerId is 0 (the master), or 1 under slave_read_enable when the
records served lie beyond the in-memory window (4.x's suggestPullingFromSlave), on a master and on
a slave alike: a lagging consumer reads its backlog at the slave and comes back once it is recent.
A PULL_OFFSET_MOVED answer also stores an OffsetMovedEvent in OFFSET_MOVED_EVENT (tag and key:
the group), as 4.x does. Each answer counts in the net actor's statistics (messages and bytes per
group and topic; latency from arrival, or from the last wake-up of a parked pull, to the answer).

A pull with the suspend flag that finds nothing (PULL_NOT_FOUND) is parked: the hold actor gets
its token, queue, offset and deadline (now + suspendTimeoutMillis) and hands the token back when
something arrives or the deadline passes; the pull then runs again and is answered, within
the loop turn's budget (a wake of every queue at once is answered over several turns). If the
hold actor restarts, parked pulls are parked again; past its deadline (plus a grace) a pull is
answered here whatever happened to the hold actor.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from smartgo.broker.processor.message_filter import FilterError
from smartgo.broker.rings import WAKE_ARRIVED, Batcher, iter_wakes, monotonic_ms, park_record
from smartgo.broker.managers.topics import OFFSET_MOVED_EVENT
from smartgo.filter import is_tag_type
from smartgo.net import fastjson
from smartgo.net.codes import PullSysFlag, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager
from smartgo.store.reads import GetStatus

if TYPE_CHECKING:
    from smartgo.broker.actors.net_actor import NetActor
    from smartgo.broker.managers.subscriptions import GroupState, RegisteredSub

DEADLINE_GRACE_MS = 2000          # after its deadline a parked pull is answered here, hold or no hold
SLOW_CONSUMER_BROKER = "1"      # whichBrokerWhenConsumeSlowly's default: the first slave
RELEASE_EVERY = 16 << 20          # bytes served between drops of the reader's pages from RSS (~ as many mapped)

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
    sub_version: int


def parse_header(r: RemotingCommand) -> PullHeader:
    """PullMessageRequestHeader; HeaderFieldError names a missing or malformed field."""
    return PullHeader(r.ext_str("consumerGroup"), r.ext_str("topic"), r.ext_int("queueId"), r.ext_int("queueOffset"),
                      r.ext_int("maxMsgNums"), r.ext_int("sysFlag"), r.ext_int("commitOffset"),
                      r.ext_int("suspendTimeoutMillis"), r.ext_str("subscription", None),
                      r.ext_str("expressionType", "TAG"), r.ext_int("subVersion", 0))


@dataclass(slots=True)
class ParkedPull:
    conn: Connection
    request: RemotingCommand
    header: PullHeader
    deadline: int                 # CLOCK_MONOTONIC ms


class PullProcessor:
    def __init__(self, net: NetActor) -> None:
        self.view = net.view
        self.sends = net.sends
        self.groups = net.groups
        self.link = net.link
        self.stats = net.stats
        self.broker_name = net.config.broker_name
        self.is_master = net.config.role == "master"
        self.slave_read = net.config.slave_read_enable
        self.auto_create_groups = net.config.auto_create_subscription_group
        self.parks = Batcher(net.park_ring)       # a full ring (hold down): the deadline sweep answers them
        self.parked: dict[int, ParkedPull] = {}
        self.budget = net.budget
        self._woken: deque[tuple[ParkedPull, bool]] = deque()     # and whether each may park again
        self._deferred = False                                    # the budget resumes _answer_woken
        self._tokens = itertools.count(1)
        self.filters = net.filters
        self._served = 0
        self.seen_groups: set[str] = set()        # unknown groups the broker actor was told of

    @eager
    async def process(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        start = time.perf_counter()
        response = self.run(conn, request, parse_header(request), None, True)
        if response is not None:
            self.stats.pull.observe((time.perf_counter() - start) * 1000.0)
        return response

    def _check_group(self, h: PullHeader, request: RemotingCommand) -> RemotingCommand | GroupState:
        if self.view.unreadable.get():
            return request.make_response(ResponseCode.NO_PERMISSION,
                                         f"the broker[{self.broker_name}] pulling message is forbidden")
        group = self.groups.get(h.group)
        if not group.configured:
            if not self.auto_create_groups:
                return request.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                             f"subscription group [{h.group}] does not exist")
            if h.group not in self.seen_groups:
                self.seen_groups.add(h.group)
                self.link.event("group_seen", group=h.group)
        elif not group.consume_enable:
            return request.make_response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {h.group}")
        return group

    def _registered(self, h: PullHeader, group: GroupState,
                    request: RemotingCommand) -> RemotingCommand | RegisteredSub:
        """The subscription the group registered for the topic (a pull without FLAG_SUBSCRIPTION)."""
        if group.model is None:
            return request.make_response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                         f"the consumer's group info not exist (group {h.group} has no consumer "
                                         "registered by heartbeat)")
        if group.model == "BROADCASTING" and not group.broadcast_enable:
            return request.make_response(ResponseCode.NO_PERMISSION,
                                         f"the consumer group[{h.group}] can not consume by broadcast way")
        sub = group.subs.get(h.topic)
        if sub is None:
            return request.make_response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                         f"the consumer's subscription not exist (group {h.group}, topic {h.topic})")
        if sub.version < h.sub_version:
            return request.make_response(ResponseCode.SUBSCRIPTION_NOT_LATEST,
                                         f"the consumer's subscription not latest (registered {sub.version}, "
                                         f"pull {h.sub_version})")
        return sub

    def run(self, conn: Connection, request: RemotingCommand, h: PullHeader, deadline: int | None,
            may_suspend: bool) -> RemotingCommand | None:
        """The pull itself; None when it was parked (the answer comes later)."""
        view = self.view
        group = self._check_group(h, request)
        if isinstance(group, RemotingCommand):
            return group
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
        flagged = h.sys_flag & PullSysFlag.SUBSCRIPTION
        if flagged:
            expression_type, expression = h.expression_type, h.subscription
        else:
            sub = self._registered(h, group, request)
            if isinstance(sub, RemotingCommand):
                return sub
            expression_type, expression = sub.expression_type, sub.expression
        remark = self.filters.unsupported(expression_type)
        if remark is not None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark)
        if not flagged and is_tag_type(expression_type):
            codes, match = sub.codes, None  # type: ignore[union-attr]  # not flagged: the codeSet the client registered
        else:
            try:
                f = self.filters.get(expression_type, expression)
            except FilterError as exc:
                if flagged:
                    return request.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                                 f"parse the consumer's subscription failed: {exc}")
                return request.make_response(ResponseCode.FILTER_DATA_NOT_EXIST, "The broker's consumer filter "
                                             f"data is not exist!Your expression may be wrong! ({exc})")
            codes, match = f.codes, f.match
        if deadline is None and h.sys_flag & PullSysFlag.COMMIT_OFFSET and self.is_master:
            self.link.commit_offset(h.group, h.topic, h.queue_id, h.commit_offset)
        reader = view.fresh_reader()
        max_offset = view.max_offset(h.topic, h.queue_id)
        written = view.written.get()
        r = reader.get_messages(h.topic, h.queue_id, h.offset, h.max_nums, max_offset, written, codes, match)
        if r.status in _EMPTY_QUEUE:
            code = ResponseCode.PULL_OFFSET_MOVED if h.offset != 0 else ResponseCode.PULL_NOT_FOUND
        else:
            code = _CODES[r.status]
        if code == ResponseCode.PULL_NOT_FOUND and may_suspend and h.sys_flag & PullSysFlag.SUSPEND:
            self.park(conn, request, h, monotonic_ms() + h.suspend_ms if deadline is None else deadline)
            return None
        cold = self.slave_read and r.buffers and not reader.in_memory(r.max_phys_offset_pulling, written)
        ext = {"suggestWhichBrokerId": SLOW_CONSUMER_BROKER if cold else "0",
               "nextBeginOffset": str(r.next_begin_offset), "minOffset": str(r.min_offset),
               "maxOffset": str(r.max_offset)}
        if code != ResponseCode.SUCCESS:
            self.stats.pulled(h.group, h.topic, 0, 0)
            if code == ResponseCode.PULL_OFFSET_MOVED and self.is_master:
                self._offset_moved(conn, request, h, r.next_begin_offset)
            return request.make_response(code, r.status.value, ext)
        self.stats.pulled(h.group, h.topic, len(r.buffers), r.buffer_total_size)
        self._served += r.buffer_total_size
        if self._served >= RELEASE_EVERY:
            self._served = 0
            asyncio.get_running_loop().call_soon(reader.release_pages)   # after this write took the views
        return request.make_response(code, r.status.value, ext, r.buffers)

    def _offset_moved(self, conn: Connection, request: RemotingCommand, h: PullHeader, new_offset: int) -> None:
        """An OffsetMovedEvent in OFFSET_MOVED_EVENT queue 0, tagged and keyed with the group
        (PullMessageProcessor.generateOffsetMovedEvent): operators subscribe to it to see which
        consumers had their offset moved. Stored through the send path; nobody awaits it."""
        event = fastjson.dumps({"consumerGroup": h.group, "messageQueue": {
            "brokerName": self.broker_name, "queueId": h.queue_id, "topic": h.topic},
            "offsetNew": new_offset, "offsetRequest": h.offset})
        record = self.sends.own_record(OFFSET_MOVED_EVENT, event, {"TAGS": h.group, "KEYS": h.group})
        self.sends.store_own(conn, request, OFFSET_MOVED_EVENT, 0, record)

    # ---- long polling -----------------------------------------------------------------------------------
    def park(self, conn: Connection, request: RemotingCommand, h: PullHeader, deadline: int) -> None:
        token = next(self._tokens)
        self.parked[token] = ParkedPull(conn, request, h, deadline)
        self._send_park(token, self.parked[token])

    def _send_park(self, token: int, p: ParkedPull) -> None:
        self.parks.put(park_record(token, p.deadline, p.header.offset, p.header.queue_id, p.header.topic.encode()))

    def on_wakes(self, records: list[memoryview]) -> None:
        now = monotonic_ms()
        woken = self._woken
        for mv in records:
            for token, reason in iter_wakes(mv):
                p = self.parked.pop(token, None)
                if p is not None:
                    woken.append((p, reason == WAKE_ARRIVED and now < p.deadline))
        if not self._deferred:
            self._answer_woken()

    def _answer_woken(self) -> None:
        """Run the woken pulls again while the turn's budget lasts; the rest next turn."""
        self._deferred = False
        woken, budget = self._woken, self.budget
        while woken:
            if not budget.take():
                self._deferred = True
                budget.defer(self._answer_woken)
                return
            self._answer(*woken.popleft())

    def _answer(self, p: ParkedPull, may_suspend: bool) -> None:
        if p.conn.closed:
            return
        start = time.perf_counter()
        try:
            response = self.run(p.conn, p.request, p.header, p.deadline, may_suspend)
        except Exception as exc:
            response = p.request.make_response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if response is not None:
            p.conn.send(response)
            self.stats.pull.observe((time.perf_counter() - start) * 1000.0)

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
        woken = [p for p, _ in self._woken]
        self._woken.clear()
        for p in [*parked.values(), *woken]:
            self._answer(p, False)
