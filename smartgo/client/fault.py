"""Latency fault tolerance (Java's MQFaultStrategy + LatencyFaultToleranceImpl): a broker whose
send failed, or answered slowly, is left out of queue selection for a while.

The time out is looked up from the send's latency: the last entry of LATENCY_MAX_MS that the
latency reaches gives the matching NOT_AVAILABLE_MS. A failure counts as a 10 s latency
("isolation"), so it keeps the broker out for 10 s - unless it succeeds meanwhile: every send,
good or bad, updates the broker's entry, and a later fast success makes it available again at
once. When every broker is out, the least bad one is still used (pick_one_at_least).

The tables are 5.x's. 4.x's counted a failure as 30 s and kept the broker out for 10 minutes: a
broker restarted after a crash then took no sends from a producer that had seen it fail for
those 10 minutes, while the others carried its share (tests/client/test_scale_out_e2e.py). A dead
broker costs one failed attempt every 10 s instead, which the send retries on another broker.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

LATENCY_MAX_MS = (50, 100, 550, 1800, 3000, 5000, 15000)
NOT_AVAILABLE_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)
ISOLATION_LATENCY_MS = 10000


def not_available_duration(latency_ms: float) -> int:
    for limit, duration in zip(reversed(LATENCY_MAX_MS), reversed(NOT_AVAILABLE_MS)):
        if latency_ms >= limit:
            return duration
    return 0


@dataclass(slots=True)
class FaultItem:
    name: str
    latency_ms: float
    available_at_ms: float

    def sort_key(self, now_ms: float) -> tuple:
        """Java's FaultItem.compareTo: available first, then lower latency, then sooner."""
        return (now_ms < self.available_at_ms, self.latency_ms, self.available_at_ms)


class LatencyFaultTolerance:
    def __init__(self, clock: Callable[[], float] = time.monotonic, enabled: bool = True) -> None:
        self._clock = clock
        self.enabled = enabled
        self._items: dict[str, FaultItem] = {}
        self._worst = itertools.count(random.randrange(1 << 16))

    def _now_ms(self) -> float:
        return self._clock() * 1000.0

    def update(self, broker: str, latency_ms: float, isolation: bool = False) -> None:
        """Record a send's outcome: its latency, or a failure (isolation)."""
        if not self.enabled:
            return
        duration = not_available_duration(ISOLATION_LATENCY_MS if isolation else latency_ms)
        if duration == 0 and broker not in self._items:
            return  # the common case: a fast send to a healthy broker costs no bookkeeping
        self._items[broker] = FaultItem(broker, latency_ms, self._now_ms() + duration)

    def is_available(self, broker: str) -> bool:
        item = self._items.get(broker)
        return item is None or self._now_ms() >= item.available_at_ms

    def remove(self, broker: str) -> None:
        self._items.pop(broker, None)

    def pick_one_at_least(self) -> str | None:
        """A broker to use when none is available: a random one of the better half."""
        items = list(self._items.values())
        if not items:
            return None
        random.shuffle(items)
        now = self._now_ms()
        items.sort(key=lambda it: it.sort_key(now))
        half = len(items) // 2
        return items[0].name if half <= 0 else items[next(self._worst) % half].name
