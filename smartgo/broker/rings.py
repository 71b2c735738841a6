"""The broker's rings: their names, sizes, and the records each one carries (little-endian structs).

    send.<net>   net -> commit     one record per send request: SEND header + the encoded block
    done.<net>   commit -> net     one record per commit batch: COMPLETION x n
    park.<net>   net -> hold       one record per parked pull: PARK header + topic
    wake.<net>   hold -> net       one record per hold round: WAKE x n
    arrive       dispatch -> hold  one record per dispatch round: ARRIVAL header + topic, x n
    ctl.<net>    net -> broker     msgpack maps (smartgo.broker.channel)
    ctlr.<net>   broker -> net     msgpack maps (replies, events and pushes)

Every record is built and parsed here, so the two ends of a ring cannot disagree.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from smartgo.actors.ring import Ring, RingError

log = logging.getLogger(__name__)

SEND_RING_CAPACITY = 8 << 20        # a few hundred 32-message batches: absorbs a commit restart's pause
DONE_RING_CAPACITY = 4 << 20        # 100k completions
SMALL_RING_CAPACITY = 1 << 20       # park, wake, arrive
CTL_RING_CAPACITY = 4 << 20         # ctl, ctlr: whole group tables go through them

def monotonic_ms() -> int:
    """CLOCK_MONOTONIC in ms: one clock for every process of the host (park deadlines)."""
    return time.monotonic_ns() // 1_000_000


class Batcher:
    """Gathers the records put during one loop iteration into one ring batch (one doorbell at
    most), handed to `write` (default: try_write, and a record that does not fit a full ring is
    dropped with a warning - for rings whose consumer re-derives what it missed: a restarted hold
    actor gets parked pulls again, the request channel's callers time out)."""

    def __init__(self, ring: Ring, write: Callable[[list[bytes]], None] | None = None) -> None:
        self.ring = ring
        self._batch: list[bytes] = []
        self._scheduled = False
        self._write = write or self._try_write

    def put(self, record: bytes) -> None:
        self._batch.append(record)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._batch = self._batch, []
        self._write(batch)

    def _try_write(self, batch: list[bytes]) -> None:
        try:
            done = self.ring.try_write(batch)
        except RingError as exc:
            log.error("%s: record dropped: %s", self.ring.path.name, exc)
            return
        if done < len(batch):
            log.warning("%s full: %d records dropped (is its consumer running?)", self.ring.path.name,
                        len(batch) - done)


# ---- send.<net>: req_id, record count, queue id (-1: not queued, e.g. a prepared transaction), topic length
SEND = struct.Struct("<qiiH")


def send_prefix(req_id: int, count: int, queue_id: int, topic: bytes) -> bytes:
    return SEND.pack(req_id, count, queue_id, len(topic)) + topic


class SendRequest(NamedTuple):
    req_id: int
    count: int  # type: ignore[assignment]  # records in the block; shadows tuple.count, which nothing calls
    queue_id: int
    topic: bytes
    data: memoryview


def parse_send(mv: memoryview) -> SendRequest:
    req_id, count, queue_id, tlen = SEND.unpack_from(mv)
    p = SEND.size
    return SendRequest(req_id, count, queue_id, bytes(mv[p:p + tlen]), mv[p + tlen:])


# ---- done.<net>: req_id, status, record count, physical offset, queue offset, end offset
COMPLETION = struct.Struct("<qiiqqq")
STATUS_OK = 0
STATUS_ILLEGAL = 1        # the block cannot be stored (size over the file, malformed)
STATUS_DISK_FULL = 2      # disk full (flag up, or no room for a new file)
STATUS_FENCED = 3         # a fenced failover master writes nothing (failover.fenced)
STATUS_QUEUES_FULL = 4    # the record would open a queue the board's queue table has no room for


def iter_completions(mv: memoryview) -> Iterator[tuple[int, int, int, int, int, int]]:
    return COMPLETION.iter_unpack(mv)


# ---- park.<net>: token, deadline (CLOCK_MONOTONIC ms), queue offset, queue id, topic length
PARK = struct.Struct("<qqqiH")


def park_record(token: int, deadline_ms: int, offset: int, queue_id: int, topic: bytes) -> bytes:
    return PARK.pack(token, deadline_ms, offset, queue_id, len(topic)) + topic


def parse_park(mv: memoryview) -> tuple[int, int, int, int, bytes]:
    token, deadline_ms, offset, queue_id, tlen = PARK.unpack_from(mv)
    return token, deadline_ms, offset, queue_id, bytes(mv[PARK.size:PARK.size + tlen])


# ---- wake.<net>: token, reason
WAKE = struct.Struct("<qq")
WAKE_ARRIVED = 1      # the queue's max offset passed the parked offset
WAKE_DEADLINE = 2     # suspendTimeoutMillis ran out


def iter_wakes(mv: memoryview) -> Iterator[tuple[int, int]]:
    return WAKE.iter_unpack(mv)


# ---- arrive: max offset, queue id, topic length, then the topic; many per record
ARRIVAL = struct.Struct("<qiH")


def arrivals_record(changed: dict[tuple[str, int], int]) -> bytes:
    parts = []
    for (topic, queue_id), max_offset in changed.items():
        raw = topic.encode()
        parts.append(ARRIVAL.pack(max_offset, queue_id, len(raw)))
        parts.append(raw)
    return b"".join(parts)


def iter_arrivals(mv: memoryview) -> Iterator[tuple[str, int, int]]:
    """(topic, queue id, max offset) of each queue in an arrival record."""
    p, end, size = 0, len(mv), ARRIVAL.size
    while p + size <= end:
        max_offset, queue_id, tlen = ARRIVAL.unpack_from(mv, p)
        p += size
        yield bytes(mv[p:p + tlen]).decode(), queue_id, max_offset
        p += tlen
