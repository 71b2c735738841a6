"""RocketMQ 4.x's BrokerStatsManager items, served by VIEW_BROKER_STATS_DATA (315): what the
dashboard's charts and mqadmin statsAll read.

An item is a (statsName, statsKey) pair with two running counters, `value` (messages or bytes)
and `times` (requests), and three snapshot lists, as in 4.x's StatsItem: one every 10 s kept 7
deep (the last minute), one every 10 min kept 7 deep (the last hour), one every hour kept 25
deep (the last day). The figures of a list are 4.x's: sum = last - first value, tps = sum per
second between them, avgpt = sum per request (0 without requests).

Two departures keep a young item's hour and day sums from reading 0, or from falling back to the
minute's sum and dropping when the minute rolls over (mqadmin statsAll's 24H SUM): 4.x starts a
list only at that list's first sample after the item's birth (up to an hour later for the day),
here an item is born with a zero in each list at that list's last sample; and a list's figures
end at the item's freshest snapshot (the minute list's, normally), not at the list's own last
one, so whatever is counted shows in every window within one minute-list sample.

The broker actor adds the net actors' per-second deltas (StatsBook.add) and samples on its
one-second tick; an item is created by its first count, as in 4.x.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"          # key: topic
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"          # key: topic@group
GROUP_GET_SIZE = "GROUP_GET_SIZE"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"        # key: the cluster name; 4.x counts no requests here
BROKER_GET_NUMS = "BROKER_GET_NUMS"
NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, BROKER_PUT_NUMS, BROKER_GET_NUMS)

#: (interval ms, snapshots kept) of the minute, hour and day lists (StatsItemSet.init)
RESOLUTIONS = ((10_000, 7), (600_000, 7), (3_600_000, 25))


def _time(snapshot: tuple[int, int, int]) -> int:
    return snapshot[0]


def group_key(topic: str, group: str) -> str:
    """BrokerStatsManager.buildStatsKey."""
    return f"{topic}@{group}"


@dataclass(slots=True)
class StatsItem:
    snapshots: tuple[deque, ...]            # (ms, times, value) per resolution, oldest first
    value: int = 0
    times: int = 0

    @classmethod
    def born(cls, sampled_ms: list[int]) -> StatsItem:
        """A new item whose lists start with a zero at each list's last sample (as if the item had
        been there, empty), so its first counts are in every window from the next sample on."""
        return cls(tuple(deque([(ms, 0, 0)], maxlen=keep) for ms, (_, keep) in zip(sampled_ms, RESOLUTIONS)))

    def sample(self, resolution: int, now_ms: int) -> None:
        self.snapshots[resolution].append((now_ms, self.times, self.value))

    def figures(self, resolution: int) -> dict:
        """BrokerStatsItem {avgpt, sum, tps} from the list's first snapshot to the item's freshest
        one (StatsItem.computeStatsData, which ends at the list's own last)."""
        t0, times0, value0 = self.snapshots[resolution][0]
        t1, times1, value1 = max((snaps[-1] for snaps in self.snapshots), key=_time)
        total = value1 - value0
        tps = total * 1000.0 / (t1 - t0) if t1 > t0 else 0.0
        return {"avgpt": total / (times1 - times0) if times1 > times0 else 0.0, "sum": total, "tps": tps}

    def stats_data(self) -> dict:
        """BrokerStatsData, the body of VIEW_BROKER_STATS_DATA."""
        day, hour, minute = (self.figures(r) for r in (2, 1, 0))
        return {"statsDay": day, "statsHour": hour, "statsMinute": minute}


class StatsItems:
    """Every item by name and key, when each resolution sampled last (wall ms; one interval
    before the start at first) and when it samples next (all at start, then every interval, as
    4.x's schedules with no initial delay). minute_ms replaces the minute list's 10 s (the
    stats_sample_interval setting)."""

    def __init__(self, now: float, now_ms: int, minute_ms: int = RESOLUTIONS[0][0]) -> None:
        self.table: dict[str, dict[str, StatsItem]] = {name: {} for name in NAMES}
        self.intervals_ms = (minute_ms, *(interval for interval, _ in RESOLUTIONS[1:]))
        self._sampled_ms = [now_ms - interval for interval in self.intervals_ms]
        self._next = [now] * len(RESOLUTIONS)

    def add(self, name: str, key: str, value: int, times: int) -> None:
        items = self.table[name]
        item = items.get(key)
        if item is None:
            item = items[key] = StatsItem.born(self._sampled_ms)
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
            self._sampled_ms[r] = now_ms
            for items in self.table.values():
                for item in items.values():
                    item.sample(r, now_ms)

    def minute_tps(self, name: str, key: str) -> float:
        item = self.get(name, key)
        return 0.0 if item is None else item.figures(0)["tps"]
