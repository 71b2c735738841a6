"""Typed store errors: callers (actors, the facade, clients) branch on the type, never on text."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises on purpose."""


class MessageIllegalError(StoreError, ValueError):
    """A message breaks a limit (topic, properties, body size, block shape); nothing was written."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class CorruptRecordError(StoreError, ValueError):
    """Bytes that should hold a store record do not (bad magic, length, CRC or truncation)."""

    def __init__(self, reason: str, offset: int | None = None):
        super().__init__(reason if offset is None else f"{reason} at offset {offset}")
        self.reason = reason
        self.offset = offset


class UnnamedRecordError(CorruptRecordError):
    """A well-formed record whose topic or queue id no send can store: damaged bytes that no
    record check covers, met by dispatch (recovery replaces the record, flushed or not)."""


class InvalidMessageIdError(StoreError, ValueError):
    """An offsetMsgId that is not 32 (IPv4) or 56 (IPv6) hex characters."""


class OffsetGoneError(StoreError):
    """The file holding an offset was deleted by cleanup (or never existed): the offset moved."""

    def __init__(self, what: str, offset: int):
        super().__init__(f"{what}: offset {offset} is no longer stored (file gone)")
        self.offset = offset


class DiskFullError(StoreError, OSError):
    """A new segment file could not get its blocks reserved; the store is unchanged."""

    def __init__(self, path: str, size: int, cause: OSError | None = None):
        detail = f": {cause.strerror}" if cause is not None and cause.strerror else ""
        super().__init__(f"disk full: cannot reserve {size} bytes for {path}{detail}")
        self.path = path
        self.size = size


class QueuesFullError(StoreError):
    """A record would open a queue past the writer's queue limit (the board's queue table); nothing
    was written."""

    def __init__(self, queue: tuple[str, int], limit: int):
        super().__init__(f"no room for queue {queue[1]} of topic {queue[0]}: the broker holds {limit} queues, "
                         "its limit (the board's queue table)")
        self.queue = queue
        self.limit = limit


class StoreLockedError(StoreError):
    """Another process (a second broker) holds the store directory's lock."""

    def __init__(self, store_dir: str, holder_pid: int | None):
        who = f"process {holder_pid}" if holder_pid else "another process"
        super().__init__(f"store directory {store_dir} is locked by {who}; two brokers cannot share it")
        self.store_dir = store_dir
        self.holder_pid = holder_pid
