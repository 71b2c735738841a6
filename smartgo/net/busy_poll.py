"""Busy polling: after I/O, the event loop keeps polling for a few microseconds instead of sleeping.

On a VM an idle vCPU halts, and waking it for the next packet (an inter-processor interrupt and a
VM exit) costs 50-150 µs: more than the CPU of a whole SmartGo round trip, so one connection's
synchronous round trips run at a third of what the two processes could do. A loop that keeps
polling (zero-timeout epoll) for a short window after each read, and after sending a request,
catches the answer or the next request without a wake-up. It is the user-space counterpart of
Linux's SO_BUSY_POLL, which loopback does not support.

The price is CPU: up to `window` of spinning after each event, nothing when idle. It is off
unless configured (`busy_poll_us`), and one poller serves every endpoint of a loop.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable

_pollers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BusyPoller] = weakref.WeakKeyDictionary()


class BusyPoller:
    """kick() opens (or extends) the window; while it is open a callback re-arms itself each loop
    turn, so the loop polls without blocking."""

    __slots__ = ("_loop", "window_ns", "_clock", "_deadline", "_armed", "turns")

    def __init__(self, loop: asyncio.AbstractEventLoop, window_us: int,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._loop = loop
        self.window_ns = window_us * 1000
        self._clock = clock
        self._deadline = 0
        self._armed = False
        self.turns = 0          # loop turns spent polling (for tests and benchmarks)

    @property
    def spinning(self) -> bool:
        return self._armed

    def kick(self) -> None:
        self._deadline = self._clock() + self.window_ns
        if not self._armed:
            self._armed = True
            self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        if self._clock() < self._deadline:
            self.turns += 1
            self._loop.call_soon(self._turn)
        else:
            self._armed = False


def poller_for(window_us: int, loop: asyncio.AbstractEventLoop | None = None) -> BusyPoller | None:
    """The running loop's poller, widened to window_us if it is narrower; None when window_us is 0."""
    if window_us <= 0:
        return None
    loop = loop or asyncio.get_running_loop()
    poller = _pollers.get(loop)
    if poller is None:
        poller = _pollers[loop] = BusyPoller(loop, window_us)
    elif poller.window_ns < window_us * 1000:
        poller.window_ns = window_us * 1000
    return poller
