"""Sans-IO codec of RocketMQ 4.x's HA (master/slave replication) stream, both directions.

slave -> master: the slave's CommitLog max offset, int64 big-endian, again and again (the
report is also the acknowledgement a SYNC_MASTER waits for).
master -> slave: frames `[int64 physical offset][int32 size][size bytes of CommitLog]`; a
frame of size 0 is a heartbeat that carries the master's position (HAConnection.WriteSocketService).

The data is raw CommitLog bytes, cut wherever the batch limit falls (not at record
boundaries), so the same stream replicates to and from a RocketMQ 4.x broker.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

REPORT = struct.Struct(">q")
TRANSFER_HEADER = struct.Struct(">qi")
#: the most a frame may carry; a 4.x master sends haTransferBatchSize (32 KiB) at most
MAX_TRANSFER = 4 * 1024 * 1024


class HAProtocolError(ValueError):
    """The peer sent something that is not this protocol: close the connection."""


class Transfer(NamedTuple):
    offset: int
    data: bytes             # empty for a heartbeat


def encode_report(offset: int) -> bytes:
    return REPORT.pack(offset)


def encode_header(offset: int, size: int) -> bytes:
    return TRANSFER_HEADER.pack(offset, size)


class ReportDecoder:
    """Master side: bytes from a slave -> its latest reported offset (reports only grow)."""

    __slots__ = ("_buf", "latest")

    def __init__(self) -> None:
        self._buf = b""
        self.latest = -1

    def feed(self, data: bytes) -> int:
        """The newest offset reported so far (-1 before the first full report)."""
        buf = self._buf + data
        whole = len(buf) - len(buf) % REPORT.size
        if whole:
            offset = REPORT.unpack_from(buf, whole - REPORT.size)[0]
            if offset < 0:
                raise HAProtocolError(f"a slave reported the negative offset {offset}")
            if offset < self.latest:
                raise HAProtocolError(f"a slave's report went back from {self.latest} to {offset}")
            self.latest = offset
        self._buf = buf[whole:]
        return self.latest


class TransferDecoder:
    """Slave side: bytes from the master -> whole frames, in order."""

    __slots__ = ("_buf", "max_transfer")

    def __init__(self, max_transfer: int = MAX_TRANSFER) -> None:
        self._buf = bytearray()
        self.max_transfer = max_transfer

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Transfer]:
        self._buf += data
        buf = memoryview(self._buf)
        out: list[Transfer] = []
        pos = 0
        head = TRANSFER_HEADER.size
        try:
            while len(buf) - pos >= head:
                offset, size = TRANSFER_HEADER.unpack_from(buf, pos)
                if offset < 0 or size < 0 or size > self.max_transfer:
                    raise HAProtocolError(f"not an HA frame: offset {offset}, size {size} "
                                          f"(at most {self.max_transfer} bytes)")
                if len(buf) - pos - head < size:
                    break
                out.append(Transfer(offset, bytes(buf[pos + head:pos + head + size])))
                pos += head + size
        finally:
            buf.release()
        if pos:
            del self._buf[:pos]
        return out
