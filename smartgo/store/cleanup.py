"""File deletion primitives for the cleanup actor (its policy - when, how much - lives there).

Deleting is safe while other processes read: a process that still maps a deleted file keeps
its pages until it unmaps; one that maps afterwards gets OffsetGoneError ("offset moved").
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Container

from smartgo.store.config import StoreConfig
from smartgo.store.config import CQ_UNIT
from smartgo.store.consume_queue import ENTRY, ConsumeQueueWriter, QueueKey, list_queues, queue_dir
from smartgo.store.damage import DAMAGED_DIR, FOUND
from smartgo.store.index_file import HEADER, list_index_files
from smartgo.store.mapped_file import MappedFileQueue, segment_name, segment_starts

log = logging.getLogger(__name__)


def expired_commitlog_files(config: StoreConfig, now_ms: int, force: bool = False, max_files: int = 10) -> list[int]:
    """Start offsets of CommitLog files older than fileReservedTime (all but the newest
    file; any age when force), oldest first, at most max_files."""
    starts = segment_starts(config.commitlog_dir)[:-1]
    reserved_ms = config.file_reserved_time_hours * 3_600_000
    out = []
    for start in starts:
        try:
            mtime_ms = os.stat(config.commitlog_dir / segment_name(start)).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            continue
        if not force and mtime_ms + reserved_ms > now_ms:
            break
        out.append(start)
        if len(out) >= max_files:
            break
    return out


def delete_commitlog_before(config: StoreConfig, offset: int) -> list[int]:
    """Delete CommitLog files that end at or before offset (never the newest); returns
    their starts. The new CommitLog minimum is the first remaining file's start."""
    starts = segment_starts(config.commitlog_dir)
    if starts:
        offset = min(offset, starts[-1])
    deleted = MappedFileQueue(config.commitlog_dir, config.commitlog_file_size, writable=False) \
        .delete_files_before(offset)
    if deleted:
        log.info("deleted %d commitlog files up to %d", len(deleted), offset)
    return deleted


def delete_consume_queue_before(config: StoreConfig, commitlog_min: int) -> int:
    """Delete ConsumeQueue head files that only point below the CommitLog minimum."""
    return sum(delete_queue_files_before(config, key, commitlog_min)
               for key in list_queues(config.consume_queue_dir))


def delete_queue_files_before(config: StoreConfig, key: QueueKey, commitlog_min: int) -> int:
    """Delete one queue's files (never its newest) whose last entry points below the CommitLog
    minimum, oldest first; returns how many. A listing of names, then one pread of the last entry
    of each older file: no mapping (most queues have only their newest file, so nothing to read)."""
    directory = queue_dir(config.consume_queue_dir, *key)
    last_at = config.consume_queue_file_size - CQ_UNIT
    deleted = 0
    for start in segment_starts(directory)[:-1]:
        path = directory / segment_name(start)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            raw = os.pread(fd, CQ_UNIT, last_at)
        finally:
            os.close(fd)
        if len(raw) < CQ_UNIT or ENTRY.unpack(raw)[0] >= commitlog_min:     # short: not ours to judge
            break
        path.unlink(missing_ok=True)
        deleted += 1
    return deleted


def delete_dropped_queues(config: StoreConfig, commitlog_min: int, keep: Container[str]) -> list[QueueKey]:
    """Delete the queues of topics not in keep whose entries all point below the CommitLog minimum:
    what a deleted topic leaves, since retention keeps each queue's newest file (its offsets), and
    which would fill the board's queue table over the years. Only while nothing maps the store
    (the commit actor then numbers a topic of that name again from 0)."""
    dropped = []
    for topic, qid in list_queues(config.consume_queue_dir):
        if topic in keep:
            continue
        cq = ConsumeQueueWriter(config.consume_queue_dir, topic, qid, config.consume_queue_file_size)
        try:
            expired = cq.max_phys_end <= commitlog_min
        finally:
            cq.close()
        if expired:
            shutil.rmtree(queue_dir(config.consume_queue_dir, topic, qid))
            dropped.append((topic, qid))
    for topic in {topic for topic, _ in dropped}:
        with contextlib.suppress(OSError):             # other queues of the topic stay
            (config.consume_queue_dir / topic).rmdir()
    return dropped


def delete_index_before(config: StoreConfig, commitlog_min: int) -> list[str]:
    """Delete index files (never the newest) whose entries all point below the minimum."""
    names = list_index_files(config.index_dir)
    deleted = []
    for name in names[:-1]:
        path = config.index_dir / name
        with open(path, "rb") as f:
            end_phy = HEADER.unpack(f.read(HEADER.size))[3]
        if end_phy >= commitlog_min:
            break
        path.unlink(missing_ok=True)
        deleted.append(name)
    return deleted


def empty_store(config: StoreConfig) -> tuple[int, int]:
    """Delete the CommitLog, the consume queues, the index, the checkpoint and the scrub's list
    of damage, as a slave starting over must (smartgo.broker.ha.reseed; config/ stays); returns the
    (files, bytes) of CommitLog deleted. Only while nothing maps the store."""
    starts = segment_starts(config.commitlog_dir)
    size = sum(os.stat(config.commitlog_dir / segment_name(s)).st_size for s in starts)
    for start in starts:
        (config.commitlog_dir / segment_name(start)).unlink()
    for directory in (config.consume_queue_dir, config.index_dir):
        shutil.rmtree(directory, ignore_errors=True)
    for path in (config.checkpoint_path, config.root / DAMAGED_DIR / FOUND, config.abort_path):
        path.unlink(missing_ok=True)
    log.warning("store emptied: %d CommitLog files (%d bytes), the consume queues and the index deleted",
                len(starts), size)
    return len(starts), size
