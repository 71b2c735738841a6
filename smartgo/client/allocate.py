"""Queue allocation among the consumers of a group (clustering mode). Every consumer runs the same
pure function over the same sorted inputs, so they agree without talking to each other.

Strategies take (group, my client id, all queues sorted, all client ids sorted) and return my
queues, exactly like Java's AllocateMessageQueueStrategy implementations, so Python and Java
consumers can share a group.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Sequence

from smartgo.client.message import MessageQueue

AllocateStrategy = Callable[[str, str, Sequence[MessageQueue], Sequence[str]], list[MessageQueue]]


def _check(current: str, mqs: Sequence[MessageQueue], cids: Sequence[str]) -> bool:
    return bool(current) and bool(mqs) and current in cids


def allocate_averagely(group: str, current: str, mqs: Sequence[MessageQueue],
                       cids: Sequence[str]) -> list[MessageQueue]:
    """AllocateMessageQueueAveragely: contiguous blocks; the first (queues % consumers) consumers
    get one extra queue."""
    if not _check(current, mqs, cids):
        return []
    n, c = len(mqs), len(cids)
    index = cids.index(current)
    mod = n % c
    if n <= c:
        average = 1
    elif mod > 0 and index < mod:
        average = n // c + 1
    else:
        average = n // c
    start = index * average if mod > 0 and index < mod else index * average + mod
    count = min(average, n - start)
    return [mqs[(start + i) % n] for i in range(count)]


def allocate_by_circle(group: str, current: str, mqs: Sequence[MessageQueue],
                       cids: Sequence[str]) -> list[MessageQueue]:
    """AllocateMessageQueueAveragelyByCircle: queue i goes to consumer i % consumers."""
    if not _check(current, mqs, cids):
        return []
    index, c = cids.index(current), len(cids)
    return [mq for i, mq in enumerate(mqs) if i % c == index]


def _md5_hash(key: str) -> int:
    """ConsistentHashRouter.MD5Hash: the first 4 digest bytes as an unsigned big-endian number."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


class ConsistentHashAllocator:
    """AllocateMessageQueueConsistentHash: each consumer owns virtual_nodes points on an MD5 ring
    ("<clientId>-<i>"); a queue goes to the first point at or after the hash of its toString().
    A consumer joining or leaving moves only the queues next to its points."""

    def __init__(self, virtual_nodes: int = 10) -> None:
        if virtual_nodes < 0:
            raise ValueError("virtual_nodes must be >= 0")
        self.virtual_nodes = virtual_nodes

    def __call__(self, group: str, current: str, mqs: Sequence[MessageQueue],
                 cids: Sequence[str]) -> list[MessageQueue]:
        if not _check(current, mqs, cids):
            return []
        ring = sorted((_md5_hash(f"{cid}-{i}"), cid) for cid in cids for i in range(self.virtual_nodes))
        if not ring:
            return []
        points = [h for h, _ in ring]
        out = []
        for mq in mqs:
            at = bisect.bisect_left(points, _md5_hash(str(mq)))
            if ring[at % len(ring)][1] == current:
                out.append(mq)
        return out


allocate_consistent_hash = ConsistentHashAllocator()

STRATEGIES: dict[str, AllocateStrategy] = {"average": allocate_averagely, "circle": allocate_by_circle,
                                           "consistent-hash": allocate_consistent_hash}
