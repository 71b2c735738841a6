"""A time budget for the synchronous work of one event-loop turn.

Requests run eagerly inside the read callback that decoded them (PULL_MESSAGE answers from the
mapped files without a task): a read carrying a thousand pulls ran them all before the loop
turned again, so a consumer of 1,024 queues (one pull in flight each, times its connections
and groups) kept the loop still for as long as those pulls took - timers, heartbeats and other
connections waited. Work that takes a unit from a shared TurnBudget stops when the turn's
budget is spent, and the rest waits for the next turn (`defer`); the loop then turns at least
every TURN_BUDGET plus one unit, whatever the load.

A turn's budget starts at its first `take` and ends when a callback queued then (call_soon)
runs: that callback runs after the current batch of I/O callbacks, and before the next batch
the loop runs its due timers. It then resumes the deferred work, oldest first.

`take` also counts every unit into `cell` when given (a word on the actor's board slot), so a
supervisor can see work being done even while the loop does not turn.

Requests whose code is in `urgent` run even when the turn is spent (they are counted): a net
actor passes its sends. A consumer catching up from disk keeps the budget spent every turn, and
a send arriving then waited behind the pulls deferred before it, turn after turn (what RocketMQ
avoids with separate send and pull thread pools).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

# s of synchronous work per loop turn, then the rest waits a turn. 20 ms let a consumer catching up
# from disk hold each turn that long: a producer's sends then waited 17-19 ms at p50 (2 ms: 4.8 ms);
# pulls lose ~10 % of their rate to the extra turns under that load, none at the head.
TURN_BUDGET = 0.002


class TurnBudget:
    __slots__ = ("limit", "cell", "urgent", "_loop", "_ends", "_deferred")

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: float = TURN_BUDGET,
                 cell: memoryview | None = None, urgent: frozenset[int] = frozenset()) -> None:
        self.limit = limit
        self.cell = cell
        self.urgent = urgent
        self._loop = loop
        self._ends = 0.0                # perf_counter when this turn's budget runs out; 0: no turn open
        self._deferred: deque[Callable[[], None]] = deque()

    def take(self, code: int = -1) -> bool:
        """One unit of work (a request with this code) may run now (True, and it is counted), or
        the turn is spent (False: defer the work). The first unit of a turn always runs; so does
        an urgent one."""
        now = time.perf_counter()
        if not self._ends:
            self._ends = now + self.limit
            self._loop.call_soon(self._next_turn)
        elif now >= self._ends and code not in self.urgent:
            return False
        if self.cell is not None:
            self.cell[0] += 1
        return True

    def defer(self, resume: Callable[[], None]) -> None:
        """After take() said no: call resume at the start of the next turn (it may take units and
        defer itself again)."""
        self._deferred.append(resume)

    def _next_turn(self) -> None:
        self._ends = 0.0
        deferred = self._deferred
        for _ in range(len(deferred)):  # those deferred again wait for the turn after
            deferred.popleft()()
