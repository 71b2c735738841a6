"""``<store>/queue_ends``: every ConsumeQueue's next offset at a clean stop, and the CommitLog
position dispatch had reached then.

A clean restart needs each queue's end. Reading it from the queue's last file costs a few page
reads a queue: with the page cache full of CommitLog (a backlog larger than memory) those are
disk reads, ~50 s for 10,000 queues. Dispatch writes this file when it stops with everything
dispatched; recovery takes it (reads and deletes it: it describes one stop) and trusts it only
where it trusts the clean stop's CommitLog end, and only if it was written at that same
position (smartgo.store.recovery). A queue it does not list is read from its files as before.

Layout: magic, version, position, count; per queue: topic length, queue id, next offset,
topic (UTF-8); then the CRC32 of everything before it. Written to a temporary file, fsynced,
then renamed over the old one.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path

from smartgo.store.commitlog import QueueKey

log = logging.getLogger(__name__)

QUEUE_ENDS_FILE = "queue_ends"
_MAGIC = b"SGQE"
_VERSION = 1
_HEAD = struct.Struct(">4sIqI")     # magic, version, position, count
_ENTRY = struct.Struct(">HIq")      # topic length, queue id, next offset
_CRC = struct.Struct(">I")


def encode(position: int, ends: dict[QueueKey, int]) -> bytes:
    parts = [_HEAD.pack(_MAGIC, _VERSION, position, len(ends))]
    for (topic, queue_id), offset in ends.items():
        name = topic.encode()
        parts.append(_ENTRY.pack(len(name), queue_id, offset))
        parts.append(name)
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


def decode(data: bytes) -> tuple[int, dict[QueueKey, int]]:
    """(position, ends); ValueError when the bytes are not a whole, intact file of this layout."""
    if len(data) < _HEAD.size + _CRC.size or zlib.crc32(data[:-_CRC.size]) != _CRC.unpack_from(data, len(data) - 4)[0]:
        raise ValueError("truncated or corrupt (CRC mismatch)")
    magic, version, position, count = _HEAD.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"not a queue ends file of version {_VERSION}")
    ends: dict[QueueKey, int] = {}
    pos, stop = _HEAD.size, len(data) - _CRC.size
    for _ in range(count):
        length, queue_id, offset = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        ends[(data[pos:pos + length].decode(), queue_id)] = offset
        pos += length
        if pos > stop:
            raise ValueError("an entry runs past the end")
    if pos != stop:
        raise ValueError("bytes after the last entry")
    return position, ends


def save(store_path: Path | str, position: int, ends: dict[QueueKey, int]) -> None:
    path = Path(store_path) / QUEUE_ENDS_FILE
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, encode(position, ends))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def take(store_path: Path | str, position: int) -> dict[QueueKey, int] | None:
    """The ends saved at `position`, or None (no file, another position, damaged); the file goes
    either way: the node writes new ends from here on."""
    path = Path(store_path) / QUEUE_ENDS_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    path.unlink(missing_ok=True)
    try:
        saved_at, ends = decode(data)
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        log.warning("%s ignored: %s; every queue is read from its files", path, exc)
        return None
    if saved_at != position:
        log.info("%s was saved at %d, not at the clean stop's end %d: ignored", path, saved_at, position)
        return None
    return ends
