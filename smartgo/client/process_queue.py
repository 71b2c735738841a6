"""ProcessQueue: what a consumer has pulled from one queue and not yet finished consuming.

The committed offset of a queue is the smallest offset still in flight (or one past the largest
pulled when nothing is), so a crash re-delivers unfinished messages rather than skipping them.
Pulls append in offset order, so the insertion-ordered dict is also offset-ordered.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterable

from smartgo.store.record import MessageExt

#: A lock is held 30 s client-side (the broker's lease is 60 s) and renewed every 20 s.
LOCK_MAX_LIVE = 30.0


class ProcessQueue:
    __slots__ = ("msgs", "consuming", "msg_size", "max_offset", "next_offset", "dropped", "locked",
                 "last_lock_time", "consume_lock", "orderly_task", "pull_task", "suggested_broker_id",
                 "last_pull_ms", "last_consume_ms", "__weakref__")

    def __init__(self, next_offset: int) -> None:
        self.msgs: OrderedDict[int, MessageExt] = OrderedDict()
        #: Orderly consumption: messages taken out and being consumed now.
        self.consuming: OrderedDict[int, MessageExt] = OrderedDict()
        self.msg_size = 0
        self.max_offset = -1
        self.next_offset = next_offset
        self.dropped = False
        self.locked = False
        self.last_lock_time = 0.0
        self.consume_lock = asyncio.Lock()
        self.orderly_task: asyncio.Task | None = None
        self.pull_task: asyncio.Task | None = None
        self.suggested_broker_id = 0
        self.last_pull_ms = 0         # wall clock of the last pull sent, and of the last message consumed
        self.last_consume_ms = 0

    @property
    def count(self) -> int:
        return len(self.msgs) + len(self.consuming)

    @property
    def span(self) -> int:
        """Offset distance between the oldest and newest cached message."""
        if not self.msgs:
            return 0
        return next(reversed(self.msgs)) - next(iter(self.msgs))

    def info(self, commit_offset: int) -> dict:
        """ProcessQueueInfo (ProcessQueue.fillProcessQueueInfo): what an operator sees of the queue."""
        cached = list(self.msgs) + list(self.consuming)
        return {"cachedMsgCount": len(cached), "cachedMsgMaxOffset": max(cached, default=0),
                "cachedMsgMinOffset": min(cached, default=0), "cachedMsgSizeInMiB": self.msg_size // (1024 * 1024),
                "commitOffset": commit_offset, "droped": self.dropped, "lastConsumeTimestamp": self.last_consume_ms,
                "lastLockTimestamp": int((time.time() - time.monotonic() + self.last_lock_time) * 1000)
                if self.last_lock_time else 0,
                "lastPullTimestamp": self.last_pull_ms, "locked": self.locked, "transactionMsgCount": 0,
                "transactionMsgMaxOffset": 0, "transactionMsgMinOffset": 0, "tryUnlockTimes": 0}

    def lock_expired(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) - self.last_lock_time > LOCK_MAX_LIVE

    def put(self, msgs: Iterable[MessageExt]) -> None:
        table = self.msgs
        for msg in msgs:
            offset = msg.queue_offset
            if offset not in table:
                table[offset] = msg
                self.msg_size += len(msg.body)
                if offset > self.max_offset:
                    self.max_offset = offset

    def remove(self, msgs: Iterable[MessageExt]) -> int:
        """Forget consumed messages; the offset to commit (-1 if there is nothing to commit).
        With nothing left in the cache, every offset below the next pull's is done - consumed, or
        skipped by the broker's tag filter - so that is the offset (a queue whose last messages
        were filtered out shows no lag once the rest is consumed)."""
        table = self.msgs
        for msg in msgs:
            if table.pop(msg.queue_offset, None) is not None:
                self.msg_size -= len(msg.body)
        if table:
            return next(iter(table))
        return max(self.max_offset + 1, self.next_offset) if self.max_offset >= 0 else -1

    # -- orderly ----------------------------------------------------------------------------------

    def take(self, n: int) -> list[MessageExt]:
        """Move the n oldest messages into `consuming` and return them."""
        out: list[MessageExt] = []
        while self.msgs and len(out) < n:
            offset, msg = self.msgs.popitem(last=False)
            self.consuming[offset] = msg
            out.append(msg)
        return out

    def commit(self) -> int:
        """Finish the consuming messages; the offset to commit (-1 when none): past the last of
        them, or the first message put back to be consumed again if that is lower (a batch
        whose later messages failed)."""
        if not self.consuming:
            return -1
        last = next(reversed(self.consuming))
        for msg in self.consuming.values():
            self.msg_size -= len(msg.body)
        self.consuming.clear()
        return min(last + 1, next(iter(self.msgs))) if self.msgs else last + 1

    def make_again(self, msgs: Iterable[MessageExt]) -> None:
        """Put consuming messages back at the front, to be consumed again in order."""
        back = OrderedDict((m.queue_offset, m) for m in msgs)
        for offset in back:
            self.consuming.pop(offset, None)
        back.update(self.msgs)
        self.msgs = back
