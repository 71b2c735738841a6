"""Actors that misbehave on purpose, for the supervisor's tests and benchmarks.

The actor process imports them by module path: the supervisor's folder (the repository root) is
on its sys.path. Declare them as extra actors in a node's config file:

    [[actor]]
    name = "hang"
    cls = "tests.support.actors:HangingActor"
    heartbeat_deadline = 0.5
    kwargs = { hang_after = 0.2 }
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from smartgo.actors.actor import Actor, ActorContext
from smartgo.config import NodeConfig


def _append(path: str | Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


class RecorderActor(Actor):
    """Appends 'start|stop <name> <pid> <incarnation>' to a file; start and stop take as long as told.
    deaf: SIGTERM is ignored, as for an actor that gets it before it has a handler. stop_counts: the
    stop counts progress every 50 ms of its delay (a slow stop, not a stuck one)."""

    def __init__(self, ctx: ActorContext, events: str, start_delay: float = 0.0, stop_delay: float = 0.0,
                 deaf: bool = False, stop_counts: bool = False) -> None:
        super().__init__(ctx)
        self.events = events
        self.start_delay = start_delay
        self.stop_delay = stop_delay
        self.deaf = deaf
        self.stop_counts = stop_counts

    def _record(self, what: str) -> None:
        _append(self.events, f"{what} {self.name} {os.getpid()} {self.ctx.incarnation}")

    async def start(self) -> None:
        if self.deaf:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        await asyncio.sleep(self.start_delay)
        self._record("start")

    async def stop(self) -> None:
        if self.stop_counts:
            cell = self.progress_cell()
            until = time.monotonic() + self.stop_delay
            while time.monotonic() < until:
                await asyncio.sleep(0.05)
                cell[0] += 1
        else:
            await asyncio.sleep(self.stop_delay)
        self._record("stop")


class HangingActor(Actor):
    """Blocks its event loop hang_after seconds after start, in its first hang_incarnations lives."""

    def __init__(self, ctx: ActorContext, hang_after: float = 0.2, hang_incarnations: int = 1) -> None:
        super().__init__(ctx)
        self.hang_after = hang_after
        self.hang_incarnations = hang_incarnations

    async def start(self) -> None:
        if self.ctx.incarnation <= self.hang_incarnations:
            self.log.info("will hang in %.2fs", self.hang_after)
            asyncio.get_running_loop().call_later(self.hang_after, time.sleep, 3600)


class BusyActor(Actor):
    """busy_after seconds after start, works busy_for seconds without letting its loop turn,
    counting each 10 ms of work on its progress counter (in its first busy_incarnations lives)."""

    def __init__(self, ctx: ActorContext, busy_after: float = 0.2, busy_for: float = 2.0,
                 busy_incarnations: int = 1) -> None:
        super().__init__(ctx)
        self.busy_after = busy_after
        self.busy_for = busy_for
        self.busy_incarnations = busy_incarnations

    async def start(self) -> None:
        if self.ctx.incarnation <= self.busy_incarnations:
            asyncio.get_running_loop().call_later(self.busy_after, self._work)

    def _work(self) -> None:
        cell = self.progress_cell()
        self.log.info("busy for %.2fs", self.busy_for)
        end = time.monotonic() + self.busy_for
        while time.monotonic() < end:
            time.sleep(0.01)
            cell[0] += 1
        self.log.info("done being busy")


class CrashingActor(Actor):
    """Crashes (exit status 1) crash_after seconds after start, for its first crash_times starts.

    The count lives in <store-dir>/crashes-<name>, so it spans node restarts.
    """

    def __init__(self, ctx: ActorContext, crash_after: float = 0.0, crash_times: int = 1 << 30) -> None:
        super().__init__(ctx)
        self.crash_after = crash_after
        self.crash_times = crash_times
        self.counter = self.config.store_path / f"crashes-{self.name}"

    async def start(self) -> None:
        done = int(self.counter.read_text()) if self.counter.exists() else 0
        if done >= self.crash_times:
            return
        self.counter.write_text(str(done + 1))
        if self.crash_after <= 0:
            raise RuntimeError(f"test crash {done + 1} of {self.crash_times}")
        asyncio.get_running_loop().call_later(self.crash_after, self.fail, RuntimeError("test crash"))


def record_recovery(config: NodeConfig) -> None:
    """A recovery hook that leaves a trace: one line per run in <store-dir>/recoveries."""
    _append(config.store_path / "recoveries", f"recovery {os.getpid()}")
