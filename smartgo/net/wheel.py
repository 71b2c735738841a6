"""A timing wheel: deadlines for very many connections (MQTT keep-alives, remoting idle timeouts)
at a cost per tick of the entries due, not of all of them (Varghese and Lauck's hashed wheel,
without the hashing: a slot per `width` seconds, kept only while it holds entries)."""

from __future__ import annotations

import math
from typing import Generic, TypeVar

T = TypeVar("T")


class TimingWheel(Generic[T]):
    """Entries are checked again by their owner when due: a connection that was active is put
    back at its new deadline instead of being moved at every packet."""

    __slots__ = ("_slots", "_next", "_width")

    def __init__(self, width: float = 1.0) -> None:
        self._slots: dict[int, list[T]] = {}
        self._next = -1                      # the earliest slot not yet handed out; -1 = none yet
        self._width = width

    def add(self, deadline: float, entry: T) -> None:
        index = max(math.ceil(deadline / self._width), self._next)
        slot = self._slots.get(index)
        if slot is None:
            self._slots[index] = [entry]
        else:
            slot.append(entry)

    def due(self, now: float) -> list[T]:
        """The entries whose deadline is at or before now, each once."""
        until = math.floor(now / self._width)
        if self._next < 0:
            self._next = min(self._slots, default=until + 1)
        out: list[T] = []
        slots = self._slots
        second = self._next
        if len(slots) < until - second:          # a long gap: visit only the slots that exist
            for s in sorted(k for k in slots if k <= until):
                out.extend(slots.pop(s))
        else:
            while second <= until:
                entries = slots.pop(second, None)
                if entries:
                    out.extend(entries)
                second += 1
        self._next = until + 1
        return out

    def __len__(self) -> int:
        return sum(len(s) for s in self._slots.values())
