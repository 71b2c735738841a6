"""Turns: a key's turns run in the order they were taken, other keys go on, a cancelled waiter
keeps the order of those behind it."""

from __future__ import annotations

import asyncio

import pytest

from smartgo.broker.processor.turns import Turns


async def _take(turns: Turns, key: str, name: str, done: list[str], hold: asyncio.Event | None = None) -> None:
    async with turns.turn(key):
        if hold is not None:
            await hold.wait()
        done.append(name)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _held(key: str) -> tuple[Turns, list[str], asyncio.Event, asyncio.Task]:
    """Turns whose first turn of key is taken and held until the event is set."""
    turns, done, hold = Turns(), [], asyncio.Event()
    first = asyncio.create_task(_take(turns, key, key + "1", done, hold))
    await _settle()
    return turns, done, hold, first


@pytest.mark.timeout(10)
def test_turns_of_a_key_run_in_order_and_other_keys_go_on():
    async def main():
        turns, done, hold, first = await _held("a")
        rest = [asyncio.create_task(_take(turns, "a", f"a{i}", done)) for i in (2, 3)]
        other = asyncio.create_task(_take(turns, "b", "b1", done))
        await other
        await _settle()
        assert done == ["b1"] and "a" in turns and "b" not in turns
        hold.set()
        await asyncio.gather(first, *rest)
        assert done == ["b1", "a1", "a2", "a3"] and "a" not in turns
    asyncio.run(main())


@pytest.mark.timeout(10)
def test_a_turn_cancelled_while_waiting_keeps_those_behind_it_waiting():
    async def main():
        turns, done, hold, first = await _held("c")
        second = asyncio.create_task(_take(turns, "c", "c2", done))
        third = asyncio.create_task(_take(turns, "c", "c3", done))
        await _settle()
        second.cancel()
        await _settle()
        assert second.cancelled() and done == [] and not first.done()      # the first turn was not cancelled
        assert not third.done()                                            # and the third still waits for it
        hold.set()
        await asyncio.gather(first, third)
        assert done == ["c1", "c3"] and "c" not in turns
    asyncio.run(main())
