"""UNIQ_KEY message ids, built like Java's MessageClientIDSetter so that tools reading them (and
brokers indexing them) see the same layout: IPv4 (4 bytes) | pid (int16) | a per-process hash
(int32) | ms since the start of the current month, local time (int32) | counter (int16), as 32
upper-case hex characters."""

from __future__ import annotations

import datetime
import itertools
import os
import socket
import struct
import time
from collections.abc import Callable

import psutil

_PREFIX = struct.Struct(">4shi")
_TAIL = struct.Struct(">ih")


def local_ip() -> str:
    """The first non-loopback IPv4 address of this host (RemotingUtil.getLocalAddress), else
    127.0.0.1. Reads the interface table only: no packet is sent."""
    try:
        for addrs in psutil.net_if_addrs().values():
            for addr in addrs:
                if addr.family == socket.AF_INET and not addr.address.startswith("127."):
                    return addr.address
    except OSError:  # pragma: no cover - unusual platforms
        pass
    return "127.0.0.1"


def _month_bounds(now_ms: int) -> tuple[int, int]:
    """(start of this month, start of next month) in epoch ms, local time (Java's Calendar)."""
    now = datetime.datetime.fromtimestamp(now_ms / 1000).astimezone()
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nxt = (start + datetime.timedelta(days=32)).replace(day=1)
    return int(start.timestamp() * 1000), int(nxt.timestamp() * 1000)


class UniqIdGenerator:
    """Thread-safe enough for the SDK (the counter is an itertools.count, atomic under the GIL)."""

    def __init__(self, ip: str | None = None, pid: int | None = None, process_hash: int | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        ip_bytes = socket.inet_aton(ip or local_ip())
        pid = os.getpid() if pid is None else pid
        if process_hash is None:
            process_hash = int.from_bytes(os.urandom(4), "big", signed=True)
        # Java: (short) pid, the class loader's hashCode
        self.prefix = _PREFIX.pack(ip_bytes, ((pid & 0xFFFF) ^ 0x8000) - 0x8000, process_hash).hex().upper()
        self._clock = clock
        self._counter = itertools.count()
        self._start = self._next_start = 0

    def next_id(self) -> str:
        now = int(self._clock() * 1000)
        if now >= self._next_start:
            self._start, self._next_start = _month_bounds(now)
        span = now - self._start
        counter = next(self._counter) & 0xFFFF
        return self.prefix + _TAIL.pack(span - (1 << 32) if span >= 1 << 31 else span,
                                        counter - 0x10000 if counter >= 0x8000 else counter).hex().upper()


_shared: UniqIdGenerator | None = None


def uniq_ids() -> UniqIdGenerator:
    """The process's generator (made on first use: it looks up the local address)."""
    global _shared
    if _shared is None:
        _shared = UniqIdGenerator()
    return _shared


def uniq_id_ip(uniq_id: str) -> str:
    return socket.inet_ntoa(bytes.fromhex(uniq_id[:8]))


def uniq_id_time(uniq_id: str, now_ms: int | None = None) -> int:
    """Roughly when the id was made (ms), as Java's getNearlyTimeFromID: the month is the current
    one unless that would put the time in the future (Java uses >=, which misplaces an id
    made in the current millisecond), then the previous one."""
    raw = bytes.fromhex(uniq_id)
    span = struct.unpack_from(">i", raw, len(raw) - 6)[0] & 0xFFFFFFFF
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    start, _ = _month_bounds(now_ms)
    if start + span > now_ms:
        start, _ = _month_bounds(start - 1)
    return start + span

