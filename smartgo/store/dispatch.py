"""Dispatch: follow the CommitLog and build ConsumeQueue and index entries.

The dispatch actor calls ``Dispatcher.dispatch(position, written)`` in a loop; each round
walks every complete record below the written-position bound in one pass (no msync) and
returns the new position plus the queues whose max offset moved, which the actor
publishes and announces to the long-poll hold actor. Re-dispatching a range is harmless:
a ConsumeQueue skips offsets it already has, the index skips offsets it already covered.

A round follows the record chain into chunks of positions (one unpack per record, or one
numpy check for a run of equal-sized records) and handles a chunk as columns with numpy:
header fields copied as rows, properties copied into one buffer and searched there, tags
and index keys hashed together, each queue's new entries written with one slice
assignment. Chunks under VECTORIZE_MIN records (a quiet broker's rounds), and stores
without numpy, take the per-record path, which writes the same bytes.
"""

from __future__ import annotations

import functools
import logging
import mmap
import time
from typing import NamedTuple

from smartgo.store.commitlog import CommitLogReader, QueueKey
from smartgo.store.consume_queue import ConsumeQueueSet, ConsumeQueueWriter, entry_dtype
from smartgo.store.errors import CorruptRecordError, MessageIllegalError, OffsetGoneError, UnnamedRecordError
from smartgo.store.index_file import IndexService
from smartgo.store.java_hash import (
    byte_rows, java_hash_u32, positive_index_hashes, prefixed_hashes, span_hashes_u32, tags_code,
)
from smartgo.store.lazy_numpy import np as _np
from smartgo.store.record import (
    BLANK_MAGIC, FIXED_SIZE, MESSAGE_MAGIC, SCHEDULE_TOPIC, SIZE_MAGIC, TRANSACTION_MASK, TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE, DispatchColumns, dispatch_columns, dispatch_properties, gather_properties, key_tokens,
    peek_head, property_values, schedule_tags_code, topic_field,
)


@functools.cache
def _size_magic() -> _np.dtype:
    return _np.dtype([("size", ">i4"), ("magic", ">i4")])


log = logging.getLogger(__name__)

VECTORIZE_MIN = 48  # below this many records a chunk costs less record by record
RUN_PROBE = 32  # records of one size in a row make the walk check the following ones with numpy
CHUNK_RECORDS = 8192  # records per columnar pass: bounds the arrays of a long round (recovery)
#: New queues a chunk may open: each costs a directory, a file and its mapping (~0.3 ms), so a burst
#: of sends to thousands of new queues would otherwise hold dispatch for seconds in one chunk.
NEW_QUEUES_PER_CHUNK = 128
_PROPERTY_NAMES = (b"TAGS", b"KEYS", b"UNIQ_KEY", b"DELAY")
_SCHEDULE_TOPIC_BYTES = SCHEDULE_TOPIC.encode()


def _equal_sized_run(mm: mmap.mmap, rel: int, size: int, most: int) -> _np.ndarray:
    """Positions of the records at rel, rel + size, ... (at most `most`) while each has this
    size and the message magic: exact, since each one's size puts the next where we look."""
    np = _np
    at = np.arange(rel, rel + most * size, size, dtype=np.int64)
    heads = np.ndarray((len(mm) - 7,), _size_magic(), mm, strides=(1,))[at]
    ok = (heads["size"] == size) & (heads["magic"] == MESSAGE_MAGIC)
    return at if ok.all() else at[:int(np.argmin(ok))]


class DispatchRound(NamedTuple):
    position: int  # everything below is dispatched
    changed: dict[QueueKey, int]  # queue -> its new max offset (only queues that moved)
    records: int
    last_store_timestamp: int  # of the last record dispatched; 0 if none


class Dispatcher:
    def __init__(self, commitlog: CommitLogReader, queues: ConsumeQueueSet, index: IndexService | None,
                 delay_levels_ms: tuple[int, ...] = (), release_interval: int = 16 * 1024 * 1024, *,
                 vectorize: bool = True):
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.delay_levels_ms = delay_levels_ms
        self.vectorize = vectorize and _np is not None
        self._release_interval = release_interval
        self._by_raw: dict[tuple[bytes, int], ConsumeQueueWriter] = {}

    def dispatch(self, start: int, bound: int, max_records: int | None = None,
                 deadline: float | None = None) -> DispatchRound:
        """Dispatch the records in [start, bound); stops early after max_records, or after the
        chunk that passes deadline (time.monotonic). Anything below the bound that is not a
        well-formed record raises CorruptRecordError (records before it may be dispatched
        already; dispatching them again is harmless)."""
        fs = self.commitlog.file_size
        remaining = (1 << 62) if max_records is None else max_records
        touched: dict[QueueKey, ConsumeQueueWriter] = {}
        count = last_ts = 0
        pos = start
        try:
            while pos < bound and remaining > 0:
                mf = self.commitlog.segment(pos)
                base = mf.start
                rel = pos - base
                want = min(CHUNK_RECORDS, remaining)
                positions, rel, error = self._walk(mf.mm, base, rel, min(mf.size, bound - base), want)
                n = done = len(positions)
                if n >= VECTORIZE_MIN and self.vectorize:
                    last_ts, done = self._put_columns(mf.mm, base, positions, touched)
                elif n:
                    last_ts, done = self._put_records(mf.mm, base, positions if isinstance(positions, list)
                                                      else positions.tolist(), touched)
                count += done
                remaining -= done
                if done < n:  # cut short at a new queue (NEW_QUEUES_PER_CHUNK): the rest comes next
                    pos = base + int(positions[done])
                elif error is not None:
                    raise error
                elif rel >= fs:  # a blank filler (or a record) ends the file
                    pos = base + fs
                else:
                    pos = base + rel
                    if n < want and pos < bound:
                        raise CorruptRecordError("record crosses the bound", pos)
                if deadline is not None and time.monotonic() >= deadline:
                    break
        except BaseException:
            if self.index is not None:
                self.index.settle()  # a retried round (disk full, damage repaired) indexes nothing twice
            raise
        if self.index is not None:
            self.index.publish()
        self._release(pos)
        return DispatchRound(pos, {key: cq.max_offset for key, cq in touched.items()}, count, last_ts)

    def _walk(self, mm: mmap.mmap, base: int, rel: int, limit: int,
              want: int) -> tuple[list[int] | _np.ndarray, int, CorruptRecordError | None]:
        """(positions, end, error): up to want record positions from rel, stopping at limit,
        at a blank filler (end = the file size) or at garbage (error: CorruptRecordError).
        Positions are a list, or an int64 array once runs of equal-sized records were
        checked with numpy (RUN_PROBE records of one size in a row start a probe)."""
        np = _np
        unpack = SIZE_MAGIC.unpack_from
        positions: list[int] = []
        append = positions.append
        runs: list[_np.ndarray] = []
        error = None
        n = 0
        probe_at = RUN_PROBE if self.vectorize else want
        block_start = rel
        while n < want and rel + 8 <= limit:
            size, magic = unpack(mm, rel)
            if magic != MESSAGE_MAGIC or size < FIXED_SIZE or rel + size > limit:
                if magic != BLANK_MAGIC:
                    error = CorruptRecordError("not a record", base + rel)
                elif size != self.commitlog.file_size - rel:
                    error = CorruptRecordError("blank filler does not reach the file end", base + rel)
                else:
                    rel = self.commitlog.file_size
                break
            append(rel)
            rel += size
            n += 1
            if n == probe_at:
                if rel - block_start == RUN_PROBE * size:  # likely a run of equal sizes
                    run = _equal_sized_run(mm, rel, size, min(want - n, (limit - rel) // size))
                    if len(run):
                        runs += (np.fromiter(positions, np.int64, len(positions)), run)
                        positions.clear()
                        n += len(run)
                        rel += len(run) * size
                probe_at = n + RUN_PROBE
                block_start = rel
        if runs:
            runs.append(np.fromiter(positions, np.int64, len(positions)))
            return np.concatenate(runs), rel, error
        return positions, rel, error

    def _queue(self, topic: bytes, queue_id: int, phys: int) -> ConsumeQueueWriter:
        """The writer of a queue seen for the first time in this round's records; a topic or
        queue id no send can store (damaged bytes) is an UnnamedRecordError at phys."""
        raw = (topic, queue_id)
        cq = self._by_raw.get(raw)
        if cq is None:
            name = topic.decode("ascii", "replace")
            try:
                topic_field(name)
            except MessageIllegalError:
                raise UnnamedRecordError(f"topic {topic[:130]!r} is no topic name", phys) from None
            if queue_id < 0:
                raise UnnamedRecordError(f"queue id {queue_id} of topic {name} is negative", phys)
            cq = self._by_raw[raw] = self.queues.get(name, queue_id)
        return cq

    def _put_records(self, mm: mmap.mmap, base: int, positions: list[int],
                     touched: dict[QueueKey, ConsumeQueueWriter]) -> tuple[int, int]:
        """The per-record path; returns the last store timestamp and how many records it took
        (fewer than given when the next would open one new queue too many for a chunk)."""
        by_raw = self._by_raw
        index = self.index
        indexed_upto = index.indexed_upto if index is not None else 1 << 62
        delay = self.delay_levels_ms
        last_ts = new = 0
        for i, rel in enumerate(positions):
            try:
                size, topic, queue_id, queue_offset, sys_flag, store_ts, props = peek_head(mm, rel)
            except CorruptRecordError as exc:
                raise CorruptRecordError(exc.reason, base + rel) from None
            tx = sys_flag & TRANSACTION_MASK
            if tx == TRANSACTION_PREPARED_TYPE or tx == TRANSACTION_ROLLBACK_TYPE:
                last_ts = store_ts
                continue
            phys = base + rel
            cq = by_raw.get((topic, queue_id)) or self._queue(topic, queue_id, phys)
            if not cq.max_offset:
                new += 1
                if new > NEW_QUEUES_PER_CHUNK:
                    return last_ts, i
            last_ts = store_ts
            # already in its queue and the index (re-dispatch after recovery): skip the parse
            if queue_offset >= cq.max_offset or phys > indexed_upto:
                tags, keys, uniq = dispatch_properties(props, topic, store_ts, delay)
                if cq.put(queue_offset, phys, size, tags):
                    touched[cq.key] = cq
                if index is not None and (keys or uniq):
                    index.add(topic, keys, uniq, phys, store_ts)
        return last_ts, len(positions)

    def _put_columns(self, mm: mmap.mmap, base: int, positions: list[int] | _np.ndarray,
                     touched: dict[QueueKey, ConsumeQueueWriter]) -> tuple[int, int]:
        """The columnar path, same effect as _put_records, and the same answer."""
        np = _np
        u8 = np.frombuffer(mm, np.uint8)  # dropped on return: the map must stay closable
        given = at = positions if isinstance(positions, np.ndarray) else np.fromiter(positions, np.int64,
                                                                                   len(positions))
        cols = dispatch_columns(u8, at, base)
        last_ts = int(cols.store_timestamp[-1])
        tx = cols.sys_flag & TRANSACTION_MASK
        kept = (tx != TRANSACTION_PREPARED_TYPE) & (tx != TRANSACTION_ROLLBACK_TYPE)
        if not kept.all():
            cols = DispatchColumns(*(c[kept] for c in cols))
            at = at[kept]
            if not len(at):
                return last_ts, len(given)
        phys = at + base
        group, queues, topics = self._group(u8, cols, phys)
        first_offset = np.array([cq.max_offset for cq in queues], np.int64)
        new = np.flatnonzero(first_offset == 0)
        if len(new) > NEW_QUEUES_PER_CHUNK:       # take the records before the first of one too many
            first_row = np.full(len(queues), len(at), np.int64)
            np.minimum.at(first_row, group, np.arange(len(at)))
            cut = int(np.searchsorted(given, at[np.sort(first_row[new])[NEW_QUEUES_PER_CHUNK]]))
            del u8
            return self._put_columns(mm, base, given[:cut], touched)[0], cut
        to_queue = cols.queue_offset >= first_offset[group]
        index = self.index
        to_index = phys > index.indexed_upto if index is not None else np.zeros(len(at), bool)
        parse = np.flatnonzero(to_queue | to_index)  # everything, unless re-dispatching
        if not len(parse):
            return last_ts, len(given)
        if len(parse) < len(at):
            cols, group, phys, to_queue, to_index = (DispatchColumns(*(c[parse] for c in cols)), group[parse],
                                                    phys[parse], to_queue[parse], to_index[parse])
        props = gather_properties(u8, cols.props_start, cols.props_end)
        del u8
        scheduled = bool(self.delay_levels_ms) and _SCHEDULE_TOPIC_BYTES in topics
        found = property_values(props, _PROPERTY_NAMES if scheduled else _PROPERTY_NAMES[:3])
        (tags_at, tags_len), (keys_at, keys_len), (uniq_at, uniq_len) = found[:3]
        tags = self._tags_codes(props.buf, tags_at, tags_len, found[3] if scheduled else None, topics, group,
                                cols.store_timestamp)
        self._write_queues(np.flatnonzero(to_queue), group, queues, first_offset, cols, phys, tags, touched)
        if index is not None:
            if not to_index.all():
                keys_len, uniq_len = np.where(to_index, keys_len, 0), np.where(to_index, uniq_len, 0)
            self._write_index(props.buf, uniq_at, uniq_len, keys_at, keys_len, topics, group, phys,
                              cols.store_timestamp)
        return last_ts, len(given)

    def _group(self, u8: _np.ndarray, cols: DispatchColumns,
               phys: _np.ndarray) -> tuple[_np.ndarray, list[ConsumeQueueWriter], list[bytes]]:
        """(group per record, ConsumeQueueWriter per group, topic bytes per group): records
        grouped by their exact topic bytes and queue id."""
        np = _np
        n = len(cols.size)
        width = int(cols.topic_len.max())
        topic = byte_rows(u8, cols.topic_start, width)
        if (cols.topic_len == width).all() and (topic == topic[0]).all():  # one topic (the usual round)
            queue_ids = cols.queue_id
            if 0 <= int(queue_ids.min()) and int(queue_ids.max()) < 4096:
                present = np.flatnonzero(np.bincount(queue_ids))
                renumber = np.empty(int(present[-1]) + 1, np.int64)
                renumber[present] = np.arange(len(present))
                raw = topic[0].tobytes()
                return (renumber[queue_ids], [self._queue(raw, q, int(phys[0])) for q in present.tolist()],
                        [raw] * len(present))
        topic[np.arange(width) >= cols.topic_len[:, None]] = 0
        key = np.empty((n, 5 + width), np.uint8)
        key[:, :4] = cols.queue_id.astype("<u4").view(np.uint8).reshape(n, 4)
        key[:, 4] = cols.topic_len
        key[:, 5:] = topic
        _, first, group = np.unique(key.view(np.dtype((np.void, 5 + width))).ravel(), return_index=True,
                                    return_inverse=True)
        queues = []
        topics = []
        for row in first.tolist():
            raw = topic[row, :int(cols.topic_len[row])].tobytes()
            topics.append(raw)
            queues.append(self._queue(raw, int(cols.queue_id[row]), int(phys[row])))
        return group.ravel(), queues, topics

    def _tags_codes(self, buf: _np.ndarray, at: _np.ndarray, length: _np.ndarray,
                    delay: tuple[_np.ndarray, _np.ndarray] | None, topics: list[bytes], group: _np.ndarray,
                    store_ts: _np.ndarray) -> _np.ndarray:
        """ConsumeQueue tagsCode per record (Java hashCode of TAGS; a delivery time for
        SCHEDULE_TOPIC_XXXX when delay is given), as dispatch_properties computes it."""
        np = _np
        h, scalar = span_hashes_u32(buf, at, length)
        codes = h.view(np.int32).astype(np.int64)
        for i in np.flatnonzero(scalar).tolist():
            codes[i] = tags_code(buf[at[i]:at[i] + length[i]].tobytes())
        if delay is not None:
            delay_at, delay_len = delay
            scheduled = np.array([t == _SCHEDULE_TOPIC_BYTES for t in topics])[group] & (delay_at >= 0)
            for i in np.flatnonzero(scheduled).tolist():
                codes[i] = schedule_tags_code(buf[delay_at[i]:delay_at[i] + delay_len[i]].tobytes(),
                                              int(store_ts[i]), self.delay_levels_ms)
        return codes

    def _write_queues(self, rows: _np.ndarray, group: _np.ndarray, queues: list[ConsumeQueueWriter],
                      first_offset: _np.ndarray, cols: DispatchColumns, phys: _np.ndarray, tags: _np.ndarray,
                      touched: dict[QueueKey, ConsumeQueueWriter]) -> None:
        """Each queue's entries with one put_entries when they continue it exactly (the normal
        case), else entry by entry (holes, offsets it already has)."""
        np = _np
        if not len(rows):
            return
        rows = rows[np.argsort(group[rows], kind="stable")]  # by queue, in log order within one
        by_queue = group[rows]
        counts = np.bincount(by_queue, minlength=len(queues))
        starts = np.cumsum(counts) - counts
        expected = first_offset[by_queue] + (np.arange(len(rows)) - starts[by_queue])
        irregular = np.bincount(by_queue, cols.queue_offset[rows] != expected, minlength=len(queues))
        entries = np.empty(len(rows), entry_dtype())
        entries["phys"] = phys[rows]
        entries["size"] = cols.size[rows]
        entries["tags"] = tags[rows]
        raw = memoryview(entries).cast("B")  # type: ignore[arg-type]  # ndarray has the buffer protocol; stubs miss it
        for g in np.flatnonzero(counts).tolist():
            cq = queues[g]
            a = int(starts[g])
            b = a + int(counts[g])
            if not irregular[g] and cq.put_entries(int(first_offset[g]), raw[a * 20:b * 20]):
                touched[cq.key] = cq
                continue
            for r in rows[a:b].tolist():
                if cq.put(int(cols.queue_offset[r]), int(phys[r]), int(cols.size[r]), int(tags[r])):
                    touched[cq.key] = cq

    def _write_index(self, buf: _np.ndarray, uniq_at: _np.ndarray, uniq_len: _np.ndarray, keys_at: _np.ndarray,
                     keys_len: _np.ndarray, topics: list[bytes], group: _np.ndarray, phys: _np.ndarray,
                     store_ts: _np.ndarray) -> None:
        """Index entries for UNIQ_KEY and each KEYS token (in that order per record), hashed
        as ``topic#key`` all at once."""
        np = _np
        index = self.index
        assert index is not None  # called only when this writer indexes
        row = np.flatnonzero(uniq_len)
        at = uniq_at[row]
        length = uniq_len[row]
        if keys_len.any():
            token_row, token_at, token_len = key_tokens(buf, keys_at, keys_len)
            row = np.concatenate((row, token_row))
            order = np.argsort(row, kind="stable")  # per record: UNIQ_KEY, then the tokens
            row = row[order]
            at = np.concatenate((at, token_at))[order]
            length = np.concatenate((length, token_len))[order]
        if not len(row):
            return
        key_group = group[row]
        prefix = np.array([index.prefix_hash(t) for t in topics], np.uint32)[key_group]
        h, scalar = span_hashes_u32(buf, at, length)
        full = prefixed_hashes(prefix, h, length)
        for i in np.flatnonzero(scalar).tolist():
            full[i] = java_hash_u32(topics[key_group[i]] + b"#" + buf[at[i]:at[i] + length[i]].tobytes())
        index.put_hashed(positive_index_hashes(full), phys[row], store_ts[row])

    def _release(self, position: int) -> None:
        """Keep the reader's RSS flat: unmap files behind, drop read pages of the current one."""
        self.commitlog.forget_before(position)
        try:
            mf = self.commitlog.segment(position)
        except OffsetGoneError:  # the next file is not created yet: nothing to release
            return
        if position - mf.start - mf.released >= self._release_interval:
            mf.release(position - mf.start)
