"""The supervisor's heartbeat watchdog: tell a busy actor from a hung one.

A heartbeat older than the actor's deadline says only that its loop has not turned. A hung actor
(a blocking call, a deadlock, an endless loop that serves nothing) also makes no progress; a busy
one (a long synchronous stretch of work) does: its hot path counts units of work on its board
slot (`Actor.progress_cell`; the net actors count every request and woken pull they serve), and
the supervisor samples that counter at every turn. So, for a heartbeat past its deadline:

    the counter moved within the last PROGRESS_WINDOW -> busy: a warning, no kill,
        until the heartbeat is heartbeat_busy_limit old -> killed anyway (it serves, but
        nothing else on its loop runs: timers, replies, control messages)
    it did not -> hung: killed

The net actors bound their synchronous stretches (smartgo.net.budget), so busy is the exception
(a starved CPU, a pathological request); the warning names it for the operator.

A node of more actors than its CPUs can turn in time (56 MQTT actors for a million devices, on two
CPUs) stretches every deadline in proportion (`crowded`): each actor's loop gets a smaller share of
a CPU, so a turn takes longer for the same work, and a fixed 5 s kills working actors in a storm.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from smartgo.actors.board import SlotView

PROGRESS_WINDOW = 1.0     # s: progress seen this recently means busy (never more than the deadline)
ACTORS_PER_CPU = 8        # actors a CPU turns within the configured deadlines; more stretch them


class Verdict(enum.Enum):
    OK = "ok"               # heartbeat within its deadline
    BUSY = "busy"           # late, but making progress: warn
    OVERDUE = "overdue"     # busy past heartbeat_busy_limit: kill
    HUNG = "hung"           # late and no progress: kill


def crowded(deadline: float, actors: int, cpus: int) -> float:
    """The deadline for a node of `actors` on `cpus`: stretched by actors / (ACTORS_PER_CPU x cpus)
    when that is over 1."""
    return deadline * max(1.0, actors / (ACTORS_PER_CPU * max(1, cpus)))


def judge(age: float, deadline: float, quiet: float, busy_limit: float) -> Verdict:
    """age: seconds since the last heartbeat; quiet: seconds since the progress counter last moved."""
    if age <= deadline:
        return Verdict.OK
    if quiet > min(PROGRESS_WINDOW, deadline):
        return Verdict.HUNG
    return Verdict.BUSY if age <= busy_limit else Verdict.OVERDUE


@dataclass(slots=True)
class _Seen:
    pid: int
    progress: int
    moved_ns: int           # when the supervisor saw the counter change (or the process first)
    busy_since_ns: int = 0  # the heartbeat time of a busy episode being warned about (0: none)


class Watchdog:
    """Per actor slot: what the progress counter was and when it last moved."""

    def __init__(self, busy_limit: float) -> None:
        self.busy_limit = busy_limit
        self._seen: dict[int, _Seen] = {}

    def quiet(self, slot: int, view: SlotView, now_ns: int) -> float:
        """Seconds since the slot's progress counter last moved (from when it was first seen)."""
        seen = self._seen.get(slot)
        if seen is None or seen.pid != view.pid:
            seen = self._seen[slot] = _Seen(view.pid, view.progress, now_ns)
        elif view.progress != seen.progress:
            seen.progress, seen.moved_ns = view.progress, now_ns
        return (now_ns - seen.moved_ns) / 1e9

    def check(self, slot: int, view: SlotView, deadline: float, now_ns: int) -> tuple[Verdict, str]:
        """The verdict on a ready actor's slot, and the words for the log (a busy episode is
        described once, at its start: "" after that)."""
        quiet = self.quiet(slot, view, now_ns)
        seen = self._seen[slot]
        age = (now_ns - view.heartbeat_ns) / 1e9
        verdict = judge(age, deadline, quiet, self.busy_limit)
        if verdict is Verdict.OK:
            if seen.busy_since_ns:
                still = (view.heartbeat_ns - seen.busy_since_ns) / 1e9
                seen.busy_since_ns = 0
                return verdict, f"heartbeats again: its loop turned after {still:.2f}s of work"
            return verdict, ""
        late = f"heartbeat {age:.2f}s old (deadline {deadline:g}s)"
        if verdict is Verdict.HUNG:
            return verdict, f"{late}, no progress for {quiet:.2f}s: hung"
        if verdict is Verdict.OVERDUE:
            return verdict, (f"{late} while busy (progress {view.progress}): its loop has not turned for longer than "
                             f"heartbeat_busy_limit ({self.busy_limit:g}s)")
        if seen.busy_since_ns == view.heartbeat_ns:
            return verdict, ""
        seen.busy_since_ns = view.heartbeat_ns
        return verdict, (f"{late} but busy (progress {view.progress}, moved {quiet:.2f}s ago): left running "
                         f"unless its loop stays still past heartbeat_busy_limit ({self.busy_limit:g}s)")
