"""Start-up recovery: called once by the supervisor (or MessageStore.open) before any actor.

Normal (no abort file): walk the CommitLog from the third-last file with full record
checks and truncate what follows the last good record. Abnormal (abort file present):
the same walk from the newest file whose first record is older than the checkpoint's
minimum timestamp. Then, in both cases: ConsumeQueues keep entries only while each points
at the matching record below the recovered end (stricter than RocketMQ, which trusts
them), and every record not yet in its queue or the index is dispatched again. The
result is a store where written == dispatched == flushed-to-page-cache.
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass, field

from smartgo.store.checkpoint import Checkpoint
from smartgo.store.commitlog import CommitLogReader, QueueKey
from smartgo.store.config import StoreConfig
from smartgo.store.consume_queue import ConsumeQueueSet
from smartgo.store.dispatch import Dispatcher
from smartgo.store.errors import OffsetGoneError
from smartgo.store.index_file import IndexService
from smartgo.store.mapped_file import MappedFileQueue
from smartgo.store.record import MESSAGE_MAGIC, SIZE_MAGIC, store_timestamp_at
from smartgo.store.store_files import abort_file_exists

log = logging.getLogger("smartgo.store.recovery")

# TOTALSIZE, MAGIC, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET: what a ConsumeQueue entry must match
_CQ_CHECK = struct.Struct(">ii4xi4xqq")


@dataclass(slots=True)
class RecoveredState:
    abnormal: bool
    commitlog_min: int  # start of the oldest CommitLog file
    written: int  # end of the valid CommitLog = dispatched position = flushed position
    queue_offsets: dict[QueueKey, int] = field(default_factory=dict)  # next offset per queue
    last_store_timestamp: int = 0
    walk_stopped: str | None = None  # why the CommitLog walk ended (end of data, invalid record...)
    redispatched: int = 0  # records dispatched again
    seconds: float = 0.0


def _abnormal_start(cl: CommitLogReader, starts: list[int], checkpoint: Checkpoint, index_safe: bool) -> int:
    """Newest file whose first record is a message stored before the checkpoint's minimum,
    and not past the file holding the flushed offset (smartgo.store.checkpoint says why)."""
    flushed = checkpoint.physic_offset
    if flushed > 0:
        starts = [s for s in starts if s <= flushed] or starts[:1]
    min_ts = checkpoint.min_timestamp(index_safe)
    for start in reversed(starts):
        try:
            mf = cl.segment(start)
        except OffsetGoneError:
            continue
        if mf.size < 64:
            continue
        _, magic = SIZE_MAGIC.unpack_from(mf.mm, 0)
        if magic == MESSAGE_MAGIC:
            ts = store_timestamp_at(mf.mm, 0)
            if 0 < ts <= min_ts:
                return start
    return starts[0]


def recover(config: StoreConfig) -> RecoveredState:
    began = time.perf_counter()
    abnormal = abort_file_exists(config.store_path)
    fs = config.commitlog_file_size
    cl = CommitLogReader(config.commitlog_dir, fs)
    starts = cl.files.starts()
    checkpoint = Checkpoint(config.checkpoint_path)
    try:
        # 1. the valid end of the CommitLog
        stopped = None
        if not starts:
            walk_from = end = 0
            last_ts = 0
        else:
            walk_from = (_abnormal_start(cl, starts, checkpoint, config.message_index_safe) if abnormal
                         else starts[max(0, len(starts) - 3)])
            walk = cl.walk(walk_from, None, verify=True)
            last = None
            for _phys, mm, rel, _size in walk:
                last = (mm, rel)
            end = walk.position
            last_ts = store_timestamp_at(*last) if last is not None else 0
            stopped = walk.stopped
            log.info("commitlog valid from %d to %d (%s recovery; stopped: %s)", walk_from, end,
                     "abnormal" if abnormal else "normal", walk.stopped)
        cl_min = starts[0] if starts else 0
        cl.close()  # nothing may map a file while it is cut
        if starts:
            MappedFileQueue(config.commitlog_dir, fs, writable=True).truncate(end)
        # 2. consume queues: keep only entries that match their record below the end
        cl = CommitLogReader(config.commitlog_dir, fs)
        queues = ConsumeQueueSet(config.consume_queue_dir, config.consume_queue_file_size)
        damaged_ends = []
        for cq in queues.queues.values():
            before = cq.max_offset
            if _recover_queue(cq, cl, cl_min, end):
                log.warning("consume queue %s: entries from %d cut (had %d)", cq.key, cq.max_offset, before)
                damaged_ends.append(cq.max_phys_end)
        # where dispatch had got to (RocketMQ: the largest offset any queue points at), or
        # earlier where a queue lost entries
        redispatch_from = min([max((cq.max_phys_end for cq in queues.queues.values()), default=0), *damaged_ends])
        if abnormal:
            redispatch_from = min(redispatch_from, walk_from)
        redispatch_from = min(max(redispatch_from, cl_min), end)
        # 3. dispatch what the queues and the index miss
        index = None
        if config.message_index_enable:
            index = IndexService(config.index_dir, config.index_slot_count, config.index_entry_count)
            index.forget_beyond(end)
        try:
            dispatcher = Dispatcher(cl, queues, index, config.delay_levels_ms)
            # no msync here: what recovery wrote is in the page cache, as it was before the crash,
            # and a crash before the flush actor's next round just repeats this recovery
            rnd = dispatcher.dispatch(redispatch_from, end) if redispatch_from < end else None
            offsets = queues.max_offsets()
        finally:
            if index is not None:
                index.close()
            queues.close()
        state = RecoveredState(abnormal, cl_min, end, offsets, last_ts, stopped, rnd.records if rnd else 0)
    finally:
        cl.close()
        checkpoint.close()
    state.seconds = time.perf_counter() - began
    log.info("store recovered in %.3fs: written=%d queues=%d redispatched=%d",
             state.seconds, state.written, len(state.queue_offsets), state.redispatched)
    return state


def _recover_queue(cq, cl: CommitLogReader, cl_min: int, end: int) -> bool:
    """Run the queue's recovery with an entry test against the CommitLog; True if entries
    were cut for a reason other than reaching the end of the data."""
    topic, queue_id = cq.key
    fs = cl.file_size
    seg_start, seg_mm, seg_size = -1, None, 0
    unpack = _CQ_CHECK.unpack_from

    def valid(queue_offset: int, phys: int, size: int) -> bool:
        nonlocal seg_start, seg_mm, seg_size
        start = phys - phys % fs
        if start != seg_start:
            if phys < cl_min:
                return True  # the record is gone with its file; nothing to compare
            try:
                mf = cl.segment(phys)
            except OffsetGoneError:
                return False
            seg_start, seg_mm, seg_size = start, mf.mm, mf.size
        rel = phys - start
        return rel + size <= seg_size and unpack(seg_mm, rel) == (size, MESSAGE_MAGIC, queue_id, queue_offset, phys)

    return cq.recover(valid, end)
