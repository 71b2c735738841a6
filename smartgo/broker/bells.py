"""Wake-ups about published positions (not ring records): commit -> dispatch and flush, flush -> net.

The sleeper publishes a board word saying what it waits for (a flag, or the position it needs),
executes a full fence, re-checks the position, and only then sleeps on its doorbell; the waker
publishes the position, fences, and rings the doorbell only when the sleeper's word asks for it.
One of the two always sees the other (the same protocol as the rings), and a busy sleeper costs
the waker nothing but one board read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from smartgo.actors.board import Board, Scalar
from smartgo.actors.ring import Doorbell, full_fence


def bell_path(run_path: Path, actor: str) -> Path:
    """The doorbell of an actor (the one smartgo.actors.Actor.bell opens)."""
    return run_path / "bells" / f"{actor}.bell"


class FlagBell:
    """Ring `actor`'s doorbell when its board word `field` says it sleeps (or waits for a
    position we have reached: `wanted(word)`)."""

    def __init__(self, board: Board, run_path: Path, actor: str, field: str,
                 wanted: Callable[[int], bool] = bool) -> None:
        self._word = board.scalar(field)
        self._path = bell_path(run_path, actor)
        self._bell: Doorbell | None = None
        self._wanted = wanted

    def ring(self) -> bool:
        """Call after publishing the position the sleeper follows; True when it was rung."""
        full_fence()
        if not self._wanted(self._word.get()):
            return False
        if self._bell is None:
            self._bell = Doorbell(self._path)
        self._bell.ring()
        return True

    def close(self) -> None:
        if self._bell is not None:
            self._bell.close()
            self._bell = None


async def sleep_flagged(bell: Doorbell, flag: Scalar, ready: Callable[[], bool], timeout: float) -> None:
    """Sleep on `bell` until rung or `timeout`, unless `ready()` already holds; `flag` says we sleep."""
    flag.set(1)
    full_fence()
    try:
        if not ready():
            await bell.wait(timeout)
    finally:
        flag.set(0)
