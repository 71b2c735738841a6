"""Queue locks of orderly consumers (RocketMQ's RebalanceLockManager): LOCK_BATCH_MQ (41) and
UNLOCK_BATCH_MQ (42).

A queue of a group is held by one client id at a time; a lock lasts queue_lock_lease (60 s,
rocketmq.broker.rebalance.lockMaxLiveTime) from its last renewal, after which another client
may take it. Owned by the broker actor; in memory only (consumers re-lock every 20 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from smartgo.common.bodies import Fields, parse_body

Queue = tuple[str, str, int]          # (topic, broker name, queue id)


@dataclass(slots=True)
class LockEntry:
    client_id: str
    renewed: float


@dataclass(slots=True)
class LockRequest:
    client_id: str
    group: str
    queues: list[Queue]


def parse_lock_body(raw: bytes | None, what: str) -> LockRequest:
    """LockBatchRequestBody / UnlockBatchRequestBody; BodyError names a bad field."""
    body = parse_body(raw, what)
    return LockRequest(body.text("clientId"), body.text("consumerGroup"),
                       [queue_from(q) for q in body.objects("mqSet")])


def queue_json(q: Queue) -> dict:
    return {"brokerName": q[1], "queueId": q[2], "topic": q[0]}


def queue_from(f: Fields) -> Queue:
    return f.text("topic"), f.text("brokerName"), f.integer("queueId")


class RebalanceLocks:
    def __init__(self, lease: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease = lease
        self.clock = clock
        self.table: dict[str, dict[Queue, LockEntry]] = {}

    def try_lock(self, group: str, queues: list[Queue], client_id: str) -> list[Queue]:
        """The queues now held by client_id: its own (renewed), free ones and expired ones."""
        now = self.clock()
        held = self.table.setdefault(group, {})
        locked = []
        for q in queues:
            entry = held.get(q)
            if entry is None or entry.client_id == client_id or now - entry.renewed > self.lease:
                held[q] = LockEntry(client_id, now)
                locked.append(q)
        return locked

    def unlock(self, group: str, queues: list[Queue], client_id: str) -> None:
        held = self.table.get(group)
        if not held:
            return
        for q in queues:
            entry = held.get(q)
            if entry is not None and entry.client_id == client_id:
                del held[q]
        if not held:
            del self.table[group]
