"""The Actor base class and the entry point of every actor process.

An actor is one process with its own asyncio loop (uvloop when installed). The runtime around
the subclass's hooks:

    claim the board slot -> heartbeat task -> await start() -> state RUNNING, tell the supervisor
    -> periodic tasks -> ... SIGTERM (or supervisor gone) -> cancel periodic tasks
    -> await stop() -> state STOPPED -> exit 0

The heartbeat is a task on the actor's own loop, so a loop blocked by a stuck callback stops
heartbeating and the supervisor kills and restarts the actor - unless the actor's progress
counter (`progress_cell`, bumped by its hot path) still moves: then it is busy, not hung, and
the supervisor only warns, up to heartbeat_busy_limit. Each heartbeat also publishes how late its
timer fired (the loop lag: the longest the loop went without a turn). An exception escaping start(),
stop() or a periodic task ends the process with status 1 (after stop() where possible): let it
crash, the supervisor restarts it from a clean state.

Subclass contract:

    class CommitActor(Actor):
        def __init__(self, ctx, *, batch=32):         # kwargs come from the ActorSpec
            super().__init__(ctx)
            self.every(0.5, self.publish_stats)       # periodic tasks run between start and stop
        async def start(self): ...                    # open files, rings, sockets
        async def stop(self): ...                     # stop accepting, drain, flush
        async def on_control(self, msg): ...          # {"op": "peer_up"|"peer_down", "name", "pid", ...}
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smartgo.actors.board import ActorState, Board, monotonic_ns
from smartgo.actors.control import ChildEnd, ForwardingHandler
from smartgo.actors.ring import PRODUCER, Doorbell, Ring
from smartgo.actors.spec import ActorSpec, import_object
from smartgo.config import NodeConfig
from smartgo.net.loop import new_event_loop

log = logging.getLogger(__name__)


@dataclass
class ActorContext:
    """What the runtime hands an actor: who it is and where the node's shared things are."""
    spec: ActorSpec
    config: NodeConfig
    board: Board
    slot: int           # this actor's slot on the board
    incarnation: int    # 1 for the first process, +1 on every restart
    control: ChildEnd

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def run_path(self) -> Path:
        return self.config.run_path


class Actor:
    def __init__(self, ctx: ActorContext) -> None:
        self.ctx = ctx
        self.name = ctx.name
        self.config = ctx.config
        self.board = ctx.board
        self.log = logging.getLogger(f"smartgo.actors.{ctx.name}")
        self._periodic: list[tuple[float, Callable[[], Any], str]] = []
        self._tasks: set[asyncio.Task] = set()      # the running ones: a finished task is let go
        self._inbound: list[Ring] = []
        self._bell: Doorbell | None = None
        self._running = False
        self._stop: asyncio.Future | None = None

    # ---- hooks for subclasses ------------------------------------------------------------------------
    async def start(self) -> None:
        """Acquire resources and begin serving. The actor counts as ready when this returns."""

    async def stop(self) -> None:
        """Stop accepting, drain, flush. Runs once, after the periodic tasks are cancelled."""

    async def on_control(self, msg: dict) -> None:
        """A notice from the supervisor: {"op": "peer_up"|"peer_down", "name": ..., "pid": ...}."""

    def mailbox_depth(self) -> int:
        """Published to the board with each heartbeat: bytes waiting in this actor's inbound rings."""
        return sum(r.backlog() for r in self._inbound)

    # ---- services for subclasses --------------------------------------------------------------------
    def progress_cell(self) -> memoryview:
        """This actor's progress counter on the board (a one-item view): count units of work
        with `cell[0] += 1` where they are done, so they show while the loop is not turning."""
        return self.board.self_writer(self.ctx.slot).progress_cell()

    def every(self, interval: float, fn: Callable[[], Awaitable[None] | None], name: str | None = None) -> None:
        """Run fn (sync or async) every `interval` seconds while the actor runs (fixed delay)."""
        entry = (interval, fn, name or str(getattr(fn, "__name__", "periodic")))
        self._periodic.append(entry)
        if self._running:
            self._spawn_periodic(entry)

    @property
    def bell(self) -> Doorbell:
        """This actor's doorbell (<run-dir>/bells/<name>.bell), shared by all its rings."""
        if self._bell is None:
            self._bell = Doorbell(self.ctx.run_path / "bells" / f"{self.name}.bell")
        return self._bell

    def ring(self, name: str, role: str, capacity: int, resume: bool = False) -> Ring:
        """Attach to <run-dir>/rings/<name>.ring; consumer rings count towards mailbox depth.
        resume: keep what this side's previous incarnation left (Ring.attach)."""
        ring = Ring.attach(self.ctx.run_path / "rings" / f"{name}.ring", role, capacity, self.bell, resume)
        if role != PRODUCER:
            self._inbound.append(ring)
        return ring

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, *, through_stop: bool = False) -> asyncio.Task:
        """Run coro as a task of this actor: if it raises, the actor fails (stop() runs, exit 1).
        It is cancelled before stop() like the periodic tasks, unless through_stop (a task stop()
        still needs, e.g. to drain; stop() then ends it)."""
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name}")
        task.add_done_callback(self._task_done)
        if not through_stop:
            self._tasks.add(task)
        return task

    def request_stop(self) -> None:
        if self._stop is not None and not self._stop.done():
            self._stop.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """End the actor with status 1 (the supervisor restarts it); stop() still runs."""
        if self._stop is not None and not self._stop.done():
            self.log.error("failing: %s", exc, exc_info=exc)
            self._stop.set_exception(exc)

    # ---- the runtime ----------------------------------------------------------------------------------
    def _spawn_periodic(self, entry: tuple[float, Callable[[], Any], str]) -> None:
        interval, fn, name = entry

        async def run() -> None:
            while True:
                result = fn()
                if asyncio.iscoroutine(result):
                    await result
                await asyncio.sleep(interval)

        task = asyncio.get_running_loop().create_task(run(), name=f"{self.name}:{name}")
        task.add_done_callback(self._task_done)
        self._tasks.add(task)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.fail(exc)

    async def _heartbeat(self) -> None:
        slot = self.board.self_writer(self.ctx.slot)
        interval = self.config.heartbeat_interval
        step = int(interval * 1e9)
        lag = 0
        while True:
            try:
                depth = self.mailbox_depth()
            except Exception:
                depth = -1
            slot.heartbeat(depth, lag if self._running else 0)     # start()'s steps: start_timeout bounds them
            due = monotonic_ns() + step
            await asyncio.sleep(interval)
            lag = max(0, monotonic_ns() - due)

    def _on_control(self, msg: dict) -> None:
        if msg.get("op") == "stop":
            self.request_stop()
            return
        task = asyncio.get_running_loop().create_task(self.on_control(msg))
        task.add_done_callback(self._task_done)

    def _on_supervisor_gone(self) -> None:
        self.log.warning("supervisor gone: stopping")
        self.request_stop()

    async def run(self) -> int:
        """The whole life of the actor process; returns its exit status."""
        loop = asyncio.get_running_loop()
        self._stop = loop.create_future()
        loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        slot = self.board.self_writer(self.ctx.slot)
        slot.claim(os.getpid())
        beat = loop.create_task(self._heartbeat(), name=f"{self.name}:heartbeat")
        self.ctx.control.listen(loop, self._on_control, self._on_supervisor_gone)
        status = 0
        try:
            try:
                await self.start()
            except Exception:
                self.log.exception("start failed")
                return 1
            slot.state(ActorState.RUNNING)
            self.ctx.control.send({"op": "ready"})
            self._running = True
            for entry in self._periodic:
                self._spawn_periodic(entry)
            try:
                await self._stop
            except Exception:
                status = 1
            slot.state(ActorState.STOPPING)
            self._running = False
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            try:
                await self.stop()
            except Exception:
                self.log.exception("stop failed")
                status = 1
            slot.state(ActorState.STOPPED)
            return status
        finally:
            beat.cancel()
            for r in self._inbound:
                r.close()
            if self._bell is not None:
                self._bell.close()


def _child_setup(config: dict, down: Any, up: Any) -> tuple[NodeConfig, ChildEnd]:
    """Common start of every child: signals, config, logging up the control pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C reaches the whole group; the supervisor decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # the fork server ignores it; actors install their own
    control = ChildEnd(down, up)
    cfg = NodeConfig.from_dict(config)
    root = logging.getLogger()
    root.handlers[:] = [ForwardingHandler(control)]
    root.setLevel(cfg.log_level)
    return cfg, control


def name_process(name: str) -> None:
    """Show the actor's name in ps, top and /proc/PID/comm (Linux; 15 bytes), so an operator can
    tell the forked actors apart without asking the supervisor."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def set_sched_policy(policy: str) -> None:
    """SCHED_BATCH (policy "batch") for this process where the OS has it. The actors hand work to
    each other through doorbells; under the default policy every ring preempts the ringer, so on
    a machine with fewer cores than busy actors they take turns a few messages at a time. A batch
    task's wake-up waits for the running one to block or use its slice: fewer switches, larger
    batches (docs/BENCHMARKS.md, the sync scenario)."""
    if policy == "batch" and hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError as exc:
            log.warning("SCHED_BATCH refused (%s): the default policy stays", exc)


def actor_main(spec: dict, config: dict, slot: int, incarnation: int, down: Any, up: Any) -> None:
    """Entry point of an actor process (the target the supervisor spawns)."""
    cfg, control = _child_setup(config, down, up)
    status = 1
    try:
        actor_spec = ActorSpec.from_dict(spec)
        name_process(f"sg-{actor_spec.name}")
        set_sched_policy(cfg.actor_sched_policy)
        board = Board.open(cfg.board_path)
        cls = import_object(actor_spec.cls)
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            actor = cls(ActorContext(actor_spec, cfg, board, slot, incarnation, control), **actor_spec.kwargs)
            status = loop.run_until_complete(actor.run())
        finally:
            loop.close()
    except Exception:
        log.exception("actor %s could not run", spec.get("name"))
    sys.exit(status)


def recovery_main(hook: str, config: dict, down: Any, up: Any) -> None:
    """Entry point of the one-shot recovery process: hook(config), exit 0 when it returns."""
    cfg, _ = _child_setup(config, down, up)
    status = 1
    try:
        import_object(hook)(cfg)
        status = 0
    except Exception:
        log.exception("recovery hook %s failed", hook)
    sys.exit(status)
