"""Turn-taking per key (a connection): work that must not overtake what came before it on the
same key waits for that to finish, while other keys go on.

The send processor uses it to store a connection's sends in arrival order while one of them waits
for its topic's creation; everything else on the hot path only asks `key in turns`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class Turns:
    def __init__(self) -> None:
        self._last: dict[Hashable, asyncio.Future] = {}   # each key's last turn taken and not over

    def __contains__(self, key: Hashable) -> bool:
        return key in self._last

    @contextlib.asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        """Enter once every earlier turn of key is over. A turn cancelled while it waits hands its
        place on: the next one still waits for those before it (shield: the cancellation does not
        reach the earlier turn's future)."""
        before = self._last.get(key)
        mine = self._last[key] = asyncio.get_running_loop().create_future()
        try:
            if before is not None:
                await asyncio.shield(before)
            yield
        finally:
            if before is not None and not before.done():
                before.add_done_callback(lambda _: self._over(key, mine))
            else:
                self._over(key, mine)

    def _over(self, key: Hashable, mine: asyncio.Future) -> None:
        mine.set_result(None)
        if self._last.get(key) is mine:
            del self._last[key]
