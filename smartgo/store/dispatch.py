"""Dispatch: follow the CommitLog and build ConsumeQueue and index entries.

The dispatch actor calls ``Dispatcher.dispatch(position, written)`` in a loop; each round
walks every complete record below the written-position bound in one pass (no msync) and
returns the new position plus the queues whose max offset moved, which the actor
publishes and announces to the long-poll hold actor. Re-dispatching a range is harmless:
a ConsumeQueue skips offsets it already has, the index skips offsets it already covered.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NamedTuple

from smartgo.store.commitlog import CommitLogReader, QueueKey
from smartgo.store.errors import OffsetGoneError
from smartgo.store.consume_queue import ConsumeQueueSet, ConsumeQueueWriter
from smartgo.store.index_file import IndexService
from smartgo.store.record import (
    TRANSACTION_MASK, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, dispatch_properties, peek_head,
)

log = logging.getLogger("smartgo.store.dispatch")


class DispatchRound(NamedTuple):
    position: int  # everything below is dispatched
    changed: dict[QueueKey, int]  # queue -> its new max offset (only queues that moved)
    records: int
    last_store_timestamp: int  # of the last record dispatched; 0 if none


class Dispatcher:
    def __init__(self, commitlog: CommitLogReader, queues: ConsumeQueueSet, index: IndexService | None,
                 delay_levels_ms: tuple[int, ...] = (), release_interval: int = 16 * 1024 * 1024):
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.delay_levels_ms = delay_levels_ms
        self._release_interval = release_interval
        self._by_raw: dict[tuple[bytes, int], ConsumeQueueWriter] = {}

    def dispatch(self, start: int, bound: int, max_records: int | None = None) -> DispatchRound:
        """Dispatch the records in [start, bound); stops early after max_records."""
        walk = self.commitlog.walk(start, bound)
        result = self.dispatch_records(walk, max_records)
        # a finished walk also stepped over trailing blank fillers; a cut-short one did not
        position = walk.position if max_records is None or result.records < max_records else result.position
        self._release(position)
        return result._replace(position=position)

    def dispatch_records(self, records: Iterable[tuple[int, object, int, int]],
                         max_records: int | None = None) -> DispatchRound:
        """Dispatch (physical offset, mmap, position, size) tuples, e.g. a RecordWalk."""
        touched: dict[tuple[bytes, int], ConsumeQueueWriter] = {}
        by_raw = self._by_raw
        index = self.index
        indexed_upto = index.indexed_upto if index is not None else 1 << 62
        delay = self.delay_levels_ms
        count = 0
        last_ts = 0
        position = -1
        for phys, mm, rel, size in records:
            _, topic, queue_id, queue_offset, sys_flag, store_ts, props = peek_head(mm, rel)
            tx = sys_flag & TRANSACTION_MASK
            if tx != TRANSACTION_PREPARED_TYPE and tx != TRANSACTION_ROLLBACK_TYPE:
                raw = (topic, queue_id)
                cq = by_raw.get(raw)
                if cq is None:
                    cq = by_raw[raw] = self.queues.get(topic.decode("ascii", "replace"), queue_id)
                # already in its queue and the index (re-dispatch after recovery): skip the parse
                if queue_offset >= cq.max_offset or phys > indexed_upto:
                    tags, keys, uniq = dispatch_properties(props, topic, store_ts, delay)
                    if cq.put(queue_offset, phys, size, tags):
                        touched[raw] = cq
                    if index is not None and (keys or uniq):
                        index.add(topic, keys, uniq, phys, store_ts)
            last_ts = store_ts
            position = phys + size
            count += 1
            if max_records is not None and count >= max_records:
                break
        if index is not None:
            index.publish()
        return DispatchRound(position, {cq.key: cq.max_offset for cq in touched.values()}, count, last_ts)

    def _release(self, position: int) -> None:
        """Keep the reader's RSS flat: unmap files behind, drop read pages of the current one."""
        self.commitlog.forget_before(position)
        try:
            mf = self.commitlog.segment(position)
        except OffsetGoneError:  # the next file is not created yet: nothing to release
            return
        if position - mf.start - mf.released >= self._release_interval:
            mf.release(position - mf.start)
