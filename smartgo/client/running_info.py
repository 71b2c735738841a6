"""What a consumer tells an operator about itself through its brokers (Java's ConsumerRunningInfo,
ConsumerStatsManager and ConsumeMessageDirectlyResult).

A broker relays GET_CONSUMER_RUNNING_INFO (307) and CONSUME_MESSAGE_DIRECTLY (309) from a tool
(mqadmin consumerStatus, the dashboard's client view, `smartgo admin consumer-status`) to one
consumer, and relays its answer back. The bodies are fastjson's: `mqTable` is keyed by
MessageQueue objects, as Java tools read it.
"""

from __future__ import annotations

import enum
import re
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smartgo.client import bodies
from smartgo.client.message import MessageQueue
from smartgo.net import fastjson

PROP_NAMESERVER_ADDR = "PROP_NAMESERVER_ADDR"
PROP_THREADPOOL_CORE_SIZE = "PROP_THREADPOOL_CORE_SIZE"
PROP_CONSUME_ORDERLY = "PROP_CONSUMEORDERLY"
PROP_CONSUME_TYPE = "PROP_CONSUME_TYPE"
PROP_CLIENT_VERSION = "PROP_CLIENT_VERSION"
PROP_CONSUMER_START_TIMESTAMP = "PROP_CONSUMER_START_TIMESTAMP"

CONSUME_ACTIVELY, CONSUME_PASSIVELY = "CONSUME_ACTIVELY", "CONSUME_PASSIVELY"    # ConsumeType: pull, push
MINUTE, HOUR = 60, 3600
_INTEGER = re.compile(r"-?\d+")


class CMResult(str, enum.Enum):
    """ConsumeMessageDirectlyResult.consumeResult."""
    CR_SUCCESS = "CR_SUCCESS"
    CR_LATER = "CR_LATER"
    CR_ROLLBACK = "CR_ROLLBACK"
    CR_COMMIT = "CR_COMMIT"
    CR_THROW_EXCEPTION = "CR_THROW_EXCEPTION"
    CR_RETURN_NULL = "CR_RETURN_NULL"


class _Window:
    """Values added over the last `span` seconds, kept in `step`-second buckets [start, sum, n]."""

    __slots__ = ("span", "step", "buckets")

    def __init__(self, span: int, step: int) -> None:
        self.span, self.step = span, step
        self.buckets: deque[list] = deque()

    def add(self, value: float, now: float, n: int = 1) -> None:
        """value: the sum of n added values."""
        start = int(now // self.step) * self.step
        if self.buckets and self.buckets[-1][0] == start:
            last = self.buckets[-1]
            last[1] += value
            last[2] += n
        else:
            self.buckets.append([start, value, n])
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self.buckets and self.buckets[0][0] <= now - self.span - self.step:
            self.buckets.popleft()

    def totals(self, now: float) -> tuple[float, int]:
        """(sum of values, number of adds) within the span."""
        self._trim(now)
        edge = now - self.span
        total, n = 0.0, 0
        for start, value, count in self.buckets:
            if start + self.step > edge:
                total += value
                n += count
        return total, n


class _TopicStats:
    __slots__ = ("pull_rt", "pulled", "ok", "failed", "failed_hour")

    def __init__(self) -> None:
        self.pull_rt = _Window(MINUTE, 1)
        self.pulled = _Window(MINUTE, 1)
        self.ok = _Window(MINUTE, 1)
        self.failed = _Window(MINUTE, 1)
        self.failed_hour = _Window(HOUR, MINUTE)


class ConsumerStats:
    """Per-topic pull and consume rates over the last minute (ConsumerStatsManager.consumeStatus):
    what statusTable reports. Fed on the consumer's loop; no locks. A consumed message is only
    added up (`consumed`); `fold` puts the sums into the windows, with the listener time of that
    interval (the consumer folds every second). consumeRT is the consumer's average listener time,
    the same for each of its topics (its workers time calls, not topics: that keeps the cost off
    them)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since = clock()
        self._topics: dict[str, _TopicStats] = {}
        self._pending: dict[str, list[int]] = {}     # topic -> [succeeded, failed] since the last fold
        self._consume_rt = _Window(MINUTE, 1)

    def _of(self, topic: str) -> _TopicStats:
        stats = self._topics.get(topic)
        if stats is None:
            stats = self._topics[topic] = _TopicStats()
        return stats

    def pulled(self, topic: str, msgs: int, rt_ms: float) -> None:
        now, s = self._clock(), self._of(topic)
        s.pull_rt.add(rt_ms, now)
        s.pulled.add(msgs, now)

    def consumed(self, topic: str, ok: bool) -> None:
        acc = self._pending.get(topic)
        if acc is None:
            acc = self._pending[topic] = [0, 0]
        acc[not ok] += 1

    def fold(self, listener_ms: float) -> None:
        """The messages consumed since the last fold, and the listener's time for them."""
        if not self._pending:
            return
        now, n = self._clock(), 0
        for topic, (ok, failed) in self._pending.items():
            s = self._of(topic)
            n += ok + failed
            if ok:
                s.ok.add(ok, now)
            if failed:
                s.failed.add(failed, now)
                s.failed_hour.add(failed, now)
        self._consume_rt.add(listener_ms, now, n)
        self._pending.clear()

    def status(self, topic: str) -> dict:
        """ConsumeStatus: average RTs in ms, TPS per second of the last minute (of the time since
        the consumer started when that is shorter), failures of the last hour."""
        now = self._clock()
        s = self._topics.get(topic) or _TopicStats()
        seconds = max(1.0, min(float(MINUTE), now - self._since))

        def avg(w: _Window) -> float:
            total, n = w.totals(now)
            return round(total / n, 3) if n else 0.0

        def tps(w: _Window) -> float:
            return round(w.totals(now)[0] / seconds, 3)
        return {"pullRT": avg(s.pull_rt), "pullTPS": tps(s.pulled), "consumeRT": avg(self._consume_rt),
                "consumeOKTPS": tps(s.ok), "consumeFailedTPS": tps(s.failed),
                "consumeFailedMsgs": int(s.failed_hour.totals(now)[0])}


def thread_stacks() -> str:
    """Every thread's stack (what jstackEnable asks a Java consumer for)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f'"{names.get(ident, ident)}"\n' + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


@dataclass(slots=True)
class RunningInfo:
    """A decoded ConsumerRunningInfo (a Java, C++ or SmartGo consumer's)."""
    properties: dict[str, object] = field(default_factory=dict)  # SmartGo's own carry numbers as numbers
    subscriptions: list[dict] = field(default_factory=list)
    queues: dict[MessageQueue, dict] = field(default_factory=dict)
    status: dict[str, dict] = field(default_factory=dict)
    jstack: str | None = None

    def to_json(self) -> dict:
        return {"properties": self.properties, "subscriptions": self.subscriptions,
                "queues": [{"topic": mq.topic, "broker_name": mq.broker_name, "queue_id": mq.queue_id, **info}
                           for mq, info in sorted(self.queues.items())],
                "status": self.status, "jstack": self.jstack}


def encode_running_info(info: RunningInfo) -> bytes:
    """ConsumerRunningInfo as fastjson writes it (the orders of its TreeMaps and TreeSet kept:
    queues, topics and subscriptions sorted)."""
    head: dict[str, Any] = {"properties": {k: str(v) for k, v in info.properties.items()},
                            "statusTable": dict(sorted(info.status.items())),
                            "subscriptionSet": sorted(info.subscriptions,
                                                      key=lambda s: (s.get("topic", ""), s.get("subString", "")))}
    if info.jstack is not None:
        head["jstack"] = info.jstack
    table = fastjson.dumps_keyed((mq.to_json(), q) for mq, q in sorted(info.queues.items()))
    return fastjson.dumps(head)[:-1] + b',"mqTable":' + table + b"}"


def parse_running_info(data: bytes) -> RunningInfo:
    """ConsumerRunningInfo; ValueError if it is not one. The C++ client writes `"mqTable":}` when it
    holds no queue (its encoder drops the brace): that reads as no queues. Integers it writes as
    strings in mqTable are read as integers."""
    text = data.decode("utf-8", "replace")
    obj = bodies.loads(text.replace('"mqTable":}', '"mqTable":{}', 1))
    if not isinstance(obj, dict):
        raise ValueError("ConsumerRunningInfo is not a JSON object")
    table, props, subs, status = (obj.get(k, empty) for k, empty in (
        ("mqTable", {}), ("properties", {}), ("subscriptionSet", []), ("statusTable", {})))
    if not isinstance(table, dict) or not all(isinstance(k, MessageQueue) for k in table):
        raise ValueError("ConsumerRunningInfo: mqTable is not a map keyed by message queues")
    if not isinstance(props, dict) or not isinstance(subs, list) or not isinstance(status, dict):
        raise ValueError("ConsumerRunningInfo: properties, subscriptionSet or statusTable has the wrong type")
    queues = {mq: {k: _number(v) for k, v in q.items()} if isinstance(q, dict) else q for mq, q in table.items()}
    return RunningInfo({str(k): str(v) for k, v in props.items()}, subs, queues, status, obj.get("jstack"))


def _number(value: Any) -> Any:
    """The C++ client writes ProcessQueueInfo's longs as strings."""
    return int(value) if isinstance(value, str) and _INTEGER.fullmatch(value) else value


def encode_direct_result(result: CMResult, spent_ms: int, remark: str | None = None, order: bool = False,
                         auto_commit: bool = True) -> bytes:
    """ConsumeMessageDirectlyResult."""
    body: dict[str, Any] = {"autoCommit": auto_commit, "consumeResult": result.value, "order": order,
                            "spentTimeMills": spent_ms}
    if remark is not None:
        body["remark"] = remark
    return fastjson.dumps(body)


def parse_direct_result(data: bytes) -> dict:
    """ConsumeMessageDirectlyResult as a dict; ValueError if it is not one."""
    obj = bodies.loads(data)
    if not isinstance(obj, dict) or "consumeResult" not in obj:
        raise ValueError(f"not a ConsumeMessageDirectlyResult: {obj!r:.200}")
    return obj
