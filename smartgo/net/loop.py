"""Event loop selection: uvloop when it is installed (the `fast` extra), else the standard library's.

SMARTGO_UVLOOP=0 in the environment forces the standard loop (tests run both ways).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

try:
    import uvloop
except ImportError:  # pragma: no cover - depends on the installation
    uvloop = None  # type: ignore[assignment]  # None: not installed

T = TypeVar("T")


def uvloop_available() -> bool:
    return uvloop is not None


def use_uvloop(prefer: bool | None = None) -> bool:
    """Whether a new loop will be a uvloop: `prefer` when given, else the environment's choice."""
    if uvloop is None:
        return False
    if prefer is not None:
        return prefer
    return os.environ.get("SMARTGO_UVLOOP", "1") != "0"


def loop_factory(prefer: bool | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    return uvloop.new_event_loop if use_uvloop(prefer) else asyncio.new_event_loop


def new_event_loop(prefer: bool | None = None) -> asyncio.AbstractEventLoop:
    return loop_factory(prefer)()


def run(main: Coroutine[Any, Any, T], *, prefer_uvloop: bool | None = None, debug: bool | None = None) -> T:
    """asyncio.run on the chosen loop."""
    with asyncio.Runner(debug=debug, loop_factory=loop_factory(prefer_uvloop)) as runner:
        return runner.run(main)


async def wait_within(aw: Awaitable[T], timeout: float | None) -> T:
    """asyncio.wait_for, fixed twice. It needs no current task, on every Python version (an eager
    processor's first step has none; 3.12's wait_for and asyncio.timeout need one). And it keeps a
    cancellation that arrives as `aw` completes, which 3.11's wait_for swallows (gh-86296): a loop
    around it then runs on, and whoever cancelled it to stop it waits for ever (a consumer's
    close did, found by tests/client/test_scale_out_e2e.py). `aw` is cancelled and TimeoutError
    raised when timeout runs out; a cancellation of the caller cancels `aw` too."""
    fut = asyncio.ensure_future(aw)
    if timeout is None or fut.done():
        return await fut
    expired = False

    def expire() -> None:
        nonlocal expired
        if not fut.done():
            expired = True
            fut.cancel()
    timer = fut.get_loop().call_later(max(timeout, 0.0), expire)
    try:
        return await fut
    except asyncio.CancelledError:
        if expired:
            raise TimeoutError(f"not done within {timeout} s") from None
        raise
    finally:
        timer.cancel()
