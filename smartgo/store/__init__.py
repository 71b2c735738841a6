"""The SmartGo store engine: RocketMQ 4.x-compatible CommitLog, ConsumeQueue and IndexFile.

A plain library (no processes, no sockets). Writers and readers are separate classes so
that the commit, dispatch, flush, net and cleanup actors can each own their part; see
docs/ARCHITECTURE.md, section "store".
"""

from smartgo.store.checkpoint import Checkpoint
from smartgo.store.commitlog import AppendResult, Block, CommitLogReader, CommitLogWriter, RecordWalk
from smartgo.store.config import StoreConfig
from smartgo.store.consume_queue import ConsumeQueueReader, ConsumeQueueSet, ConsumeQueueWriter
from smartgo.store.dispatch import Dispatcher, DispatchRound
from smartgo.store.errors import (
    CorruptRecordError, DiskFullError, InvalidMessageIdError, MessageIllegalError, OffsetGoneError, QueuesFullError,
    StoreError, StoreLockedError,
)
from smartgo.store.flush import ConsumeQueueFlusher, FlushPolicy, SegmentFlusher
from smartgo.store.index_file import IndexReader, IndexService
from smartgo.store.message_store import Message, MessageStore, PutResult
from smartgo.store.reads import GetResult, GetStatus, QueryResult, StoreReader
from smartgo.store.recovery import RecoveredState, recover
from smartgo.store.store_files import StoreLock, mark_clean_shutdown, mark_running

__all__ = [
    "AppendResult", "Block", "Checkpoint", "CommitLogReader", "CommitLogWriter", "ConsumeQueueFlusher",
    "ConsumeQueueReader", "ConsumeQueueSet", "ConsumeQueueWriter", "CorruptRecordError", "DiskFullError",
    "DispatchRound", "Dispatcher", "FlushPolicy", "GetResult", "GetStatus", "IndexReader", "IndexService",
    "InvalidMessageIdError", "Message", "MessageIllegalError", "MessageStore", "OffsetGoneError", "PutResult",
    "QueryResult", "QueuesFullError", "RecordWalk", "RecoveredState", "SegmentFlusher", "StoreConfig", "StoreError",
    "StoreLock", "StoreLockedError", "StoreReader", "mark_clean_shutdown", "mark_running", "recover",
]
