"""Turn-taking per key (a connection): work that must not overtake what came before it on the
same key waits for that to finish, while other keys go on.

The send processor uses it to store a connection's sends in arrival order while one of them waits
for its topic's creation; everything else on the hot path only asks `key in turns`. A key's turns
are an asyncio.Lock, which hands itself on in FIFO order and drops a waiter cancelled while it
waits; the table only keeps a key while some turn of it is taken or waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Key:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    turns: int = 0                  # taken or waiting


class Turns:
    def __init__(self) -> None:
        self._keys: dict[Hashable, _Key] = {}

    def __contains__(self, key: Hashable) -> bool:
        return key in self._keys

    @contextlib.asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        """Enter once every earlier turn of key is over."""
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Key()
        entry.turns += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.turns -= 1
            if not entry.turns:
                del self._keys[key]
