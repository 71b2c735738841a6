"""RocketMQ 4.x's BrokerStatsManager items, served by VIEW_BROKER_STATS_DATA (315): what the
dashboard's charts and mqadmin statsAll read.

An item is a (statsName, statsKey) pair with two running counters, `value` (messages or bytes)
and `times` (requests), and three snapshot lists, as in 4.x's StatsItem: one every 10 s kept 7
deep (the last minute), one every 10 min kept 7 deep (the last hour), one every hour kept 25
deep (the last day). A list's first snapshot is preceded by a zero one interval earlier, so an
item's first window counts everything it has seen. The figures of a list are 4.x's: sum = last -
first value, tps = sum per second between them, avgpt = sum per request (0 without requests).

The broker actor adds the net actors' per-second deltas (StatsBook.add) and samples on its
one-second tick; an item is created by its first count, as in 4.x.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"          # key: topic
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"          # key: topic@group
GROUP_GET_SIZE = "GROUP_GET_SIZE"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"        # key: the cluster name; 4.x counts no requests here
BROKER_GET_NUMS = "BROKER_GET_NUMS"
NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, BROKER_PUT_NUMS, BROKER_GET_NUMS)

#: (interval ms, snapshots kept) of the minute, hour and day lists (StatsItemSet.init)
RESOLUTIONS = ((10_000, 7), (600_000, 7), (3_600_000, 25))


def group_key(topic: str, group: str) -> str:
    """BrokerStatsManager.buildStatsKey."""
    return f"{topic}@{group}"


@dataclass(slots=True)
class StatsItem:
    value: int = 0
    times: int = 0
    snapshots: tuple[deque, ...] = field(
        default_factory=lambda: tuple(deque(maxlen=keep) for _, keep in RESOLUTIONS))

    def sample(self, resolution: int, now_ms: int, interval_ms: int) -> None:
        snaps = self.snapshots[resolution]
        if not snaps:
            snaps.append((now_ms - interval_ms, 0, 0))
        snaps.append((now_ms, self.times, self.value))

    def figures(self, resolution: int) -> dict:
        """BrokerStatsItem {avgpt, sum, tps} over the list (StatsItem.computeStatsData)."""
        snaps = self.snapshots[resolution]
        if not snaps:
            return {"avgpt": 0.0, "sum": 0, "tps": 0.0}
        (t0, times0, value0), (t1, times1, value1) = snaps[0], snaps[-1]
        total = value1 - value0
        tps = total * 1000.0 / (t1 - t0) if t1 > t0 else 0.0
        return {"avgpt": total / (times1 - times0) if times1 > times0 else 0.0, "sum": total, "tps": tps}

    def stats_data(self) -> dict:
        """BrokerStatsData, the body of VIEW_BROKER_STATS_DATA."""
        day, hour, minute = (self.figures(r) for r in (2, 1, 0))
        return {"statsDay": day, "statsHour": hour, "statsMinute": minute}


class StatsItems:
    """Every item by name and key, and when each resolution samples next (all at start, then
    every interval, as 4.x's schedules with no initial delay). minute_ms replaces the minute
    list's 10 s (the stats_sample_interval setting)."""

    def __init__(self, now: float, minute_ms: int = RESOLUTIONS[0][0]) -> None:
        self.table: dict[str, dict[str, StatsItem]] = {name: {} for name in NAMES}
        self.intervals_ms = (minute_ms, *(interval for interval, _ in RESOLUTIONS[1:]))
        self._next = [now] * len(RESOLUTIONS)

    def add(self, name: str, key: str, value: int, times: int) -> None:
        items = self.table[name]
        item = items.get(key)
        if item is None:
            item = items[key] = StatsItem()
        item.value += value
        item.times += times

    def get(self, name: str, key: str) -> StatsItem | None:
        items = self.table.get(name)
        return None if items is None else items.get(key)

    def tick(self, now: float, now_ms: int) -> None:
        """Sample each resolution that is due (now: monotonic seconds)."""
        for r, interval_ms in enumerate(self.intervals_ms):
            if now < self._next[r]:
                continue
            nxt = self._next[r] + interval_ms / 1000
            self._next[r] = nxt if nxt > now else now + interval_ms / 1000   # after a stall: no burst
            for items in self.table.values():
                for item in items.values():
                    item.sample(r, now_ms, interval_ms)

    def minute_tps(self, name: str, key: str) -> float:
        item = self.get(name, key)
        return 0.0 if item is None else item.figures(0)["tps"]
