"""Event loop selection: uvloop when it is installed (the `fast` extra), else the standard library's.

SMARTGO_UVLOOP=0 in the environment forces the standard loop (tests run both ways).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

try:
    import uvloop
except ImportError:  # pragma: no cover - depends on the installation
    uvloop = None  # type: ignore[assignment]

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
