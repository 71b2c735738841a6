"""NOTIFY_CONSUMER_IDS_CHANGED, coalesced. RocketMQ tells every member of a consumer group at each
join or leave, which is quadratic in the group's size: 1,000 consumers joining a group after a
restart cost half a million notices. Here a group is told at once when it was not told within its
window, and otherwise once when the window ends, however many changes came in between. The window
grows with the group (5 ms a member, at most 5 s): clients rebalance every 20 s on their own, and a
notice only brings that forward."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

PER_MEMBER = 0.005      # s of window per member of the group
LONGEST = 5.0           # s: the widest window


class ConsumerNotices:
    def __init__(self, send: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 per_member: float = PER_MEMBER, longest: float = LONGEST) -> None:
        """send(group) tells the group's members now."""
        self._send = send
        self._clock = clock
        self._per_member = per_member
        self._longest = longest
        self._told: dict[str, float] = {}           # group -> when it was last told (within `longest`)
        self._due: set[str] = set()                 # groups with a notice waiting for their window

    def changed(self, group: str, members: int) -> None:
        """The group's membership changed; it has `members` now."""
        now = self._clock()
        if group in self._due:
            return
        told = self._told.get(group)
        window = min(self._longest, members * self._per_member)
        if told is None or now - told >= window:
            self._tell(group, now)
            return
        self._due.add(group)
        asyncio.get_running_loop().call_later(told + window - now, self._end_window, group)

    def _end_window(self, group: str) -> None:
        self._due.discard(group)
        self._tell(group, self._clock())

    def _tell(self, group: str, now: float) -> None:
        if len(self._told) > 1024:                  # forget groups told longer ago than any window
            self._told = {g: t for g, t in self._told.items() if now - t < self._longest}
        self._told[group] = now
        self._send(group)
