"""Which MQTT actors of a node may hold a client's session, without asking each of them.

A CONNECT for a client this actor does not hold must reach the actor that does (peers.py: it
closes the old connection and hands the session over). Asking every peer costs a round trip per
actor per CONNECT, and a node holding a million devices runs some fifty actors. So each actor
publishes a bitmap in one shared file of the node's run dir: bit crc32(client id) mod SLOTS of
actor i's bitmap is set while actor i holds a session of a client in that slot. Each actor writes
only its own bitmap (no two writers share a byte) and reads the others'. A clear bit is certain:
that actor holds no client of the slot. A set bit may be another client of the same slot, or
stale (an actor that died before clearing it): the peer asked says it has nothing. With SLOTS
bits a bitmap and S sessions on the node, a CONNECT asks about S / SLOTS actors for nothing.
"""

from __future__ import annotations

import mmap
import os
import zlib
from pathlib import Path

#: Bits of one actor's bitmap (256 KiB): a node with a million sessions asks half a peer for nothing
#: per CONNECT of a client it does not know.
SLOTS = 1 << 21


def slot_of(client_id: str) -> int:
    return zlib.crc32(client_id.encode("utf-8", "surrogatepass")) & (SLOTS - 1)


class SessionDirectory:
    """One actor's view of the node's directory file: its own bitmap to write, every bitmap to read."""

    def __init__(self, run_path: Path, actors: int, index: int) -> None:
        self.actors = actors
        self.index = index
        self.width = SLOTS // 8
        path = Path(run_path) / f"mqtt-directory-{actors}.map"    # a layout per actor count
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = actors * self.width
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)          # every actor asks for the same size: idempotent
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._view = memoryview(self._map)
        self._own = self._view[index * self.width:(index + 1) * self.width]
        self._own[:] = bytes(self.width)        # it holds nothing yet: what a dead run left is gone
        self._shared: dict[int, int] = {}       # slots holding more than one of its sessions: how many

    def hold(self, client_id: str) -> None:
        """This actor holds the client's session now (before it answers the CONNECT)."""
        slot = slot_of(client_id)
        byte, bit = slot >> 3, 1 << (slot & 7)
        own = self._own
        if own[byte] & bit:
            self._shared[slot] = self._shared.get(slot, 1) + 1
        else:
            own[byte] |= bit

    def release(self, client_id: str) -> None:
        """The session is gone from this actor (ended, taken, handed over)."""
        slot = slot_of(client_id)
        left = self._shared.get(slot)
        if left is None:
            self._own[slot >> 3] &= ~(1 << (slot & 7)) & 0xFF
        elif left == 2:
            del self._shared[slot]
        else:
            self._shared[slot] = left - 1

    def holders(self, client_id: str) -> list[int]:
        """The other actors that may hold the client's session."""
        slot = slot_of(client_id)
        byte, bit = slot >> 3, 1 << (slot & 7)
        view, width = self._view, self.width
        return [i for i in range(self.actors) if i != self.index and view[i * width + byte] & bit]

    def close(self) -> None:
        self._own.release()
        self._view.release()
        self._map.close()
