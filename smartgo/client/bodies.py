"""Admin response bodies as Java brokers write them with fastjson, which puts objects in key
position for maps keyed by MessageQueue (TopicStatsTable, ConsumeStats; facts D) and leaves
integer keys unquoted. `loads` reads all of that; MessageQueue-shaped keys become MessageQueue."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from smartgo.client.message import MessageQueue

_WS = re.compile(r"[ \t\n\r]*")
_decoder = json.JSONDecoder()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text

    def ws(self, i: int) -> int:
        return _WS.match(self.text, i).end()  # type: ignore[union-attr]

    def value(self, i: int) -> tuple[Any, int]:
        i = self.ws(i)
        c = self.text[i:i + 1]
        if c == "{":
            return self.obj(i + 1)
        if c == "[":
            return self.arr(i + 1)
        return _decoder.raw_decode(self.text, i)

    def obj(self, i: int) -> tuple[dict, int]:
        out: dict = {}
        i = self.ws(i)
        if self.text[i:i + 1] == "}":
            return out, i + 1
        while True:
            key, i = self.value(i)
            i = self.ws(i)
            if self.text[i:i + 1] != ":":
                raise ValueError(f"expected ':' at {i}")
            val, i = self.value(i + 1)
            out[_key(key)] = val
            i = self.ws(i)
            c = self.text[i:i + 1]
            if c == "}":
                return out, i + 1
            if c != ",":
                raise ValueError(f"expected ',' or '}}' at {i}")
            i += 1

    def arr(self, i: int) -> tuple[list, int]:
        out: list = []
        i = self.ws(i)
        if self.text[i:i + 1] == "]":
            return out, i + 1
        while True:
            val, i = self.value(i)
            out.append(val)
            i = self.ws(i)
            c = self.text[i:i + 1]
            if c == "]":
                return out, i + 1
            if c != ",":
                raise ValueError(f"expected ',' or ']' at {i}")
            i += 1


def _key(key: Any) -> Any:
    if isinstance(key, dict):
        if {"topic", "brokerName", "queueId"} <= key.keys():
            return MessageQueue.from_json(key)
        return tuple(sorted((k, json.dumps(v)) for k, v in key.items()))
    if isinstance(key, list):
        return tuple(key)
    return key


def loads(data: bytes | str) -> Any:
    """Parse a fastjson body; ValueError when it is not one."""
    text = data if isinstance(data, str) else data.decode("utf-8")
    try:
        value, end = _Parser(text).value(0)
    except (IndexError, json.JSONDecodeError) as exc:
        raise ValueError(f"undecodable JSON body: {exc}") from None
    if _WS.match(text, end).end() != len(text):  # type: ignore[union-attr]
        raise ValueError(f"trailing data after the JSON body at {end}")
    return value


@dataclass(slots=True)
class QueueStatus:
    queue: MessageQueue
    min_offset: int
    max_offset: int
    last_update_timestamp: int = 0

    def to_json(self) -> dict:
        return {"broker_name": self.queue.broker_name, "queue_id": self.queue.queue_id,
                "min_offset": self.min_offset, "max_offset": self.max_offset,
                "last_update_timestamp": self.last_update_timestamp}


@dataclass(slots=True)
class QueueProgress:
    queue: MessageQueue
    broker_offset: int
    consumer_offset: int
    last_timestamp: int = 0

    @property
    def lag(self) -> int:
        return max(0, self.broker_offset - self.consumer_offset)

    def to_json(self) -> dict:
        return {"topic": self.queue.topic, "broker_name": self.queue.broker_name, "queue_id": self.queue.queue_id,
                "broker_offset": self.broker_offset, "consumer_offset": self.consumer_offset, "lag": self.lag,
                "last_timestamp": self.last_timestamp}


@dataclass(slots=True)
class ConsumeStats:
    queues: list[QueueProgress] = field(default_factory=list)
    consume_tps: float = 0.0

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)


def _queue_map(obj: Any, what: str) -> dict:
    table = obj.get("offsetTable") if isinstance(obj, dict) else None
    if not isinstance(table, dict) or not all(isinstance(k, MessageQueue) for k in table):
        raise ValueError(f"{what}: offsetTable is not a map keyed by message queues")
    return table


def parse_reset_offsets(data: bytes) -> dict[MessageQueue, int]:
    """ResetOffsetBody: {"offsetTable": {MessageQueue: offset}} (INVOKE_BROKER_TO_RESET_OFFSET's answer,
    RESET_CONSUMER_CLIENT_OFFSET's body)."""
    return {mq: int(offset) for mq, offset in _queue_map(loads(data), "reset offsets").items()}


def parse_topic_stats(data: bytes) -> list[QueueStatus]:
    """TopicStatsTable: {"offsetTable": {MessageQueue: {minOffset, maxOffset, lastUpdateTimestamp}}}."""
    table = _queue_map(loads(data), "topic stats")
    return sorted((QueueStatus(mq, int(v["minOffset"]), int(v["maxOffset"]), int(v.get("lastUpdateTimestamp", 0)))
                   for mq, v in table.items()), key=lambda s: s.queue)


def parse_consume_stats(data: bytes) -> ConsumeStats:
    """ConsumeStats: {"consumeTps": x, "offsetTable": {MessageQueue: {brokerOffset, consumerOffset,
    lastTimestamp}}}."""
    obj = loads(data)
    table = _queue_map(obj, "consume stats")
    queues = sorted((QueueProgress(mq, int(v["brokerOffset"]), int(v["consumerOffset"]), int(v.get("lastTimestamp", 0)))
                     for mq, v in table.items()), key=lambda q: q.queue)
    return ConsumeStats(queues, float(obj.get("consumeTps", 0.0)))
