"""MessageStore: the whole store in one process, for tests, benchmarks and tools.

It wires the same pieces the actors use (CommitLogWriter, Dispatcher, flushers,
StoreReader) with the published positions held as plain attributes: ``written``,
``dispatched``, ``flushed`` and ``max_offsets``. Each put appends, then dispatches
synchronously, so a message is readable through its ConsumeQueue when put returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from smartgo.store import queue_ends
from smartgo.store.checkpoint import Checkpoint
from smartgo.store.commitlog import AppendResult, Block, CommitLogReader, CommitLogWriter, QueueKey
from smartgo.store.config import StoreConfig
from smartgo.store.consume_queue import ConsumeQueueSet
from smartgo.store.dispatch import Dispatcher
from smartgo.store.errors import StoreError
from smartgo.store.flush import ConsumeQueueFlusher, SegmentFlusher
from smartgo.store.index_file import IndexService
from smartgo.store.reads import GetResult, QueryResult, StoreReader
from smartgo.store.record import (
    TRANSACTION_MASK, TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, MessageExt, create_offset_msg_id,
    decode_record, encode_properties, encode_record, pack_host,
)
from smartgo.store.recovery import RecoveredState, recover
from smartgo.store.store_files import StoreLock, mark_clean_shutdown, mark_running

log = logging.getLogger(__name__)

MAX_TIME = (1 << 63) - 1


@dataclass(slots=True)
class Message:
    """What a producer hands the broker (before the store assigns offsets and store time)."""

    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


@dataclass(slots=True)
class PutResult:
    physical_offset: int  # of the first message
    queue_offset: int  # of the first message
    store_timestamp: int
    msg_ids: list[str]  # offsetMsgId of each message
    wrote_bytes: int


def _is_queued(sys_flag: int) -> bool:
    return sys_flag & TRANSACTION_MASK not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)


class MessageStore:
    def __init__(self, config: StoreConfig, clock: Callable[[], int] | None = None):
        self.config = config
        self._clock = clock or now_ms
        self.store_host = pack_host(*config.store_host)
        self.recovered: RecoveredState | None = None
        self.written = self.dispatched = self.flushed = 0
        self.max_offsets: dict[QueueKey, int] = {}
        self._last_dispatched_ts = 0
        self._opened = False

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> RecoveredState:
        cfg = self.config
        self._lock = StoreLock(cfg.store_path).acquire()
        try:
            state = self.recovered = recover(cfg)
            mark_running(cfg.store_path)
            self.written = self.dispatched = self.flushed = state.written
            self.max_offsets = dict(state.queue_offsets)
            self.writer = CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, state.written,
                                          dict(state.queue_offsets), clock=self._clock,
                                          release_interval=cfg.release_interval_bytes,
                                          last_store_timestamp=state.last_store_timestamp)
            self.queues = ConsumeQueueSet(cfg.consume_queue_dir, cfg.consume_queue_file_size, cfg.mapped_queue_files)
            self.index = (IndexService(cfg.index_dir, cfg.index_slot_count, cfg.index_entry_count,
                                       release_interval=cfg.release_interval_bytes)
                          if cfg.message_index_enable else None)
            self.dispatcher = Dispatcher(CommitLogReader(cfg.commitlog_dir, cfg.commitlog_file_size), self.queues,
                                         self.index, cfg.delay_levels_ms, cfg.release_interval_bytes)
            self.reader = StoreReader(cfg)
            self.checkpoint = Checkpoint(cfg.checkpoint_path)
            self._cl_flusher = SegmentFlusher(cfg.commitlog_dir, cfg.commitlog_file_size, state.written)
            self._cq_flusher = ConsumeQueueFlusher(cfg.consume_queue_dir, cfg.consume_queue_file_size,
                                                   state.queue_offsets)
        except BaseException:
            self._lock.release()
            raise
        self._opened = True
        return state

    def __enter__(self) -> MessageStore:
        if not self._opened:
            self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._opened:
            self.shutdown()

    def shutdown(self) -> None:
        """Clean stop: dispatch the rest, flush everything, remove the abort marker."""
        self._dispatch()
        self.flush()
        queue_ends.save(self.config.root, self.written, self.queues.max_offsets())
        self.checkpoint.mark_clean(self.flushed)
        self._close()
        mark_clean_shutdown(self.config.store_path)
        self._lock.release()

    def abandon(self) -> None:
        """Stop as a crash would: nothing more is flushed and the abort marker stays."""
        self._close()
        self._lock.release()

    def _close(self) -> None:
        self._opened = False
        self.reader.close()
        self.dispatcher.commitlog.close()
        if self.index is not None:
            self.index.close()
        self.queues.close()
        self.writer.close()
        self._cl_flusher.close()
        self._cq_flusher.close()
        self.checkpoint.close()

    # ------------------------------------------------------------------ writes

    def encode(self, msg: Message) -> bytes:
        return encode_record(msg.topic, msg.queue_id, msg.body, encode_properties(msg.properties),
                             flag=msg.flag, sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp or self._clock(),
                             born_host=pack_host(*msg.born_host), store_host=self.store_host,
                             reconsume_times=msg.reconsume_times,
                             prepared_tx_offset=msg.prepared_transaction_offset,
                             max_body=self.config.max_message_size)

    def put(self, msg: Message) -> PutResult:
        return self.put_batch([msg])

    def put_batch(self, messages: Sequence[Message]) -> PutResult:
        """Store messages of one topic and queue contiguously in one file (SEND_BATCH)."""
        if not messages:
            raise StoreError("empty batch")
        first = messages[0]
        if any(m.topic != first.topic or m.queue_id != first.queue_id for m in messages):
            raise StoreError("a batch goes to one topic and queue")
        records = [self.encode(m) for m in messages]
        queue = (first.topic, first.queue_id) if _is_queued(first.sys_flag) else None
        result = self.put_blocks([Block(b"".join(records), queue, len(records))])[0]
        if isinstance(result, StoreError):
            raise result
        ids = []
        phys = result.physical_offset
        for rec in records:
            ids.append(create_offset_msg_id(self.store_host, phys))
            phys += len(rec)
        return PutResult(result.physical_offset, result.queue_offset, result.store_timestamp, ids,
                         result.end_offset - result.physical_offset)

    def put_blocks(self, blocks: Iterable[Block]) -> list[AppendResult | StoreError]:
        """Append pre-encoded blocks (as the commit actor does), then dispatch them."""
        results = self.writer.append(blocks)
        self.written = self.writer.wrote_position
        self._dispatch()
        if self.config.flush_disk_type == "SYNC_FLUSH":
            self.flush()
        return results

    def _dispatch(self) -> None:
        if self.dispatched < self.written:
            rnd = self.dispatcher.dispatch(self.dispatched, self.written)
            self.dispatched = rnd.position
            self.max_offsets.update(rnd.changed)
            if rnd.records:
                self._last_dispatched_ts = rnd.last_store_timestamp

    def flush(self) -> int:
        """Flush CommitLog, ConsumeQueues, index and checkpoint (what the flush actor does)."""
        physic_ts = self.writer.last_store_timestamp  # read before the position: never too new
        self.flushed = self._cl_flusher.flush(self.written)
        self._cq_flusher.flush(self.max_offsets)
        if self.flushed:
            self.checkpoint.physic_timestamp = physic_ts
            self.checkpoint.physic_offset = self.flushed
        if self._last_dispatched_ts:
            self.checkpoint.logics_timestamp = self._last_dispatched_ts
        if self.index is not None:
            index_ts = self.index.flush()
            if index_ts:
                self.checkpoint.index_timestamp = index_ts
        self.checkpoint.flush()
        return self.flushed

    # ------------------------------------------------------------------ reads

    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int = 32,
                     tag_codes: set[int] | frozenset[int] | None = None,
                     match: Callable[[bytes], bool] | None = None) -> GetResult:
        return self.reader.get_messages(topic, queue_id, offset, max_count, self.max_offsets.get((topic, queue_id), 0),
                                        self.written, tag_codes, match)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.max_offsets.get((topic, queue_id), 0)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.reader.min_offset(topic, queue_id, self.max_offset(topic, queue_id))

    def commitlog_min_offset(self) -> int:
        return self.reader.refresh()

    def search_offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        return self.reader.search_offset_by_time(topic, queue_id, timestamp, self.max_offset(topic, queue_id),
                                                 self.written)

    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        return self.reader.earliest_message_time(topic, queue_id, self.max_offset(topic, queue_id), self.written)

    def query_by_key(self, topic: str, key: str, max_num: int | None = None, begin: int = 0,
                     end: int = MAX_TIME) -> QueryResult:
        return self.reader.query_by_key(topic, key, max_num or self.config.default_query_max_num, begin, end,
                                        self.written)

    def view_message(self, offset: int) -> MessageExt | None:
        view = self.reader.view(offset, self.written)
        return decode_record(view) if view is not None else None

    def view_by_offset_msg_id(self, msg_id: str) -> MessageExt | None:
        view = self.reader.view_by_offset_msg_id(msg_id, self.written)
        return decode_record(view) if view is not None else None


def now_ms() -> int:
    return time.time_ns() // 1_000_000
