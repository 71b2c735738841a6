"""The Actor base in-process: lifecycle order, periodic tasks, heartbeat, failures, a lost supervisor."""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import weakref
from pathlib import Path

import pytest

from smartgo.actors.actor import Actor, ActorContext
from smartgo.actors.board import ActorState, Board, BoardLayout
from smartgo.actors.control import ChildEnd, ForwardingHandler, make_pipes
from smartgo.actors.ring import CONSUMER, PRODUCER, Ring
from smartgo.actors.spec import ActorSpec
from smartgo.config import NodeConfig
from smartgo.net.loop import run as run_loop
from tests.support.waits import async_wait_until


class Probe(Actor):
    def __init__(self, ctx: ActorContext, fail_after: int = 0, fail_start: bool = False) -> None:
        super().__init__(ctx)
        self.trace: list[str] = []
        self.ticks = 0
        self.fail_after = fail_after
        self.fail_start = fail_start
        self.every(0.01, self.tick)

    async def tick(self) -> None:
        self.ticks += 1
        if self.fail_after and self.ticks >= self.fail_after:
            raise RuntimeError("tick failed")

    async def start(self) -> None:
        self.trace.append("start")
        if self.fail_start:
            raise RuntimeError("cannot start")
        self.inbox = self.ring("probe-in", CONSUMER, 4096)

    async def stop(self) -> None:
        self.trace.append(f"stop after {self.ticks} ticks")
        self.ticks_at_stop = self.ticks


@pytest.fixture
def harness(tmp_path: Path):
    config = NodeConfig(role="test", store_dir=str(tmp_path), heartbeat_interval=0.01)
    board = Board.create(config.board_path, BoardLayout(max_actors=4))
    board.name_slot(0, "probe")
    parent, (down, up) = make_pipes(multiprocessing.get_context("spawn"))
    child = ChildEnd(down, up)
    forward = ForwardingHandler(child)               # as actor_main installs it on the root logger
    logger = logging.getLogger("smartgo.actors.probe")
    logger.addHandler(forward)

    def make(**kwargs) -> Probe:
        return Probe(ActorContext(ActorSpec("probe", "tests:Probe"), config, board, 0, 1, child), **kwargs)

    yield make, board, parent
    logger.removeHandler(forward)
    parent.close()


def _messages(parent) -> list[dict]:
    out = []
    while msgs := parent.receive():
        out += msgs
    return out


def test_lifecycle_heartbeat_and_mailbox_depth(harness, tmp_path):
    make, board, parent = harness
    actor = make()

    async def main() -> int:
        task = asyncio.ensure_future(actor.run())
        await async_wait_until(lambda: board.read_slot(0).state == ActorState.RUNNING and actor.ticks > 3,
                               timeout=10, message="the actor running and ticking")
        producer = Ring.attach(tmp_path / "run" / "rings" / "probe-in.ring", PRODUCER, 4096)
        producer.try_write([b"x" * 100])
        view = await async_wait_until(lambda: (v := board.read_slot(0)).mailbox_depth and v, timeout=10,
                                      message="the mailbox depth published")
        assert view.state == ActorState.RUNNING and view.mailbox_depth == 100 + 16 + 4
        actor.request_stop()
        status = await task
        producer.close()
        return status

    assert run_loop(main()) == 0
    assert actor.trace == ["start", f"stop after {actor.ticks_at_stop} ticks"]
    assert actor.ticks == actor.ticks_at_stop          # periodic tasks were cancelled before stop()
    assert board.read_slot(0).state == ActorState.STOPPED
    assert any(m["op"] == "ready" for m in _messages(parent))


def test_a_failing_periodic_task_ends_the_actor_with_status_1_after_stop(harness):
    make, board, parent = harness
    actor = make(fail_after=3)
    assert run_loop(asyncio.wait_for(actor.run(), 10)) == 1
    assert actor.trace == ["start", "stop after 3 ticks"]
    logs = [m for m in _messages(parent) if m["op"] == "log"]
    assert any("tick failed" in m["msg"] and "RuntimeError" in (m["exc"] or "") for m in logs)


def test_a_failing_start_ends_with_status_1_without_stop(harness):
    make, board, parent = harness
    actor = make(fail_start=True)
    assert run_loop(asyncio.wait_for(actor.run(), 10)) == 1
    assert actor.trace == ["start"]
    assert not any(m["op"] == "ready" for m in _messages(parent))


def test_the_actor_stops_itself_when_the_supervisor_goes(harness):
    make, board, parent = harness
    actor = make()

    async def main() -> int:
        task = asyncio.ensure_future(actor.run())
        await async_wait_until(lambda: board.read_slot(0).state == ActorState.RUNNING, timeout=10,
                               message="the actor running")
        parent.close()                                  # EOF on the down pipe
        return await asyncio.wait_for(task, 10)

    assert run_loop(main()) == 0
    assert actor.trace[-1].startswith("stop")


def test_finished_tasks_are_let_go_and_running_ones_cancelled_at_stop(harness):
    """A task per request or connection (the MQTT actor spawns one per CONNECT) must not stay
    referenced once done, or a long-lived actor's memory grows with every one it ever ran."""
    make, board, parent = harness
    actor = make()
    never = asyncio.Event()

    async def main() -> tuple[int, list, bool]:
        task = asyncio.ensure_future(actor.run())
        await async_wait_until(lambda: board.read_slot(0).state == ActorState.RUNNING, timeout=10,
                               message="the actor running")
        done = [weakref.ref(actor.spawn(asyncio.sleep(0), f"short {i}")) for i in range(200)]
        waiting = actor.spawn(never.wait(), "waits")
        await async_wait_until(lambda: all(r() is None or r().done() for r in done), timeout=10,
                               message="the short tasks done")
        await asyncio.sleep(0)                          # their done callbacks
        gc.collect()
        left = [r for r in done if r() is not None]
        actor.request_stop()
        status = await task
        return status, left, waiting.cancelled()

    status, left, cancelled = run_loop(main())
    assert status == 0
    assert left == []                                   # the finished tasks are garbage
    assert cancelled                                    # a running one is still cancelled before stop()
