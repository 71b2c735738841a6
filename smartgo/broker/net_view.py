"""What a net actor knows of the node: topics, published positions, queue max offsets, the reader.

Everything here is read from the board or the broker actor's snapshot file: a net actor owns
no broker state, so any number of them serve the same node and a restarted one is up at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from smartgo.actors.board import Board
from smartgo.broker.managers.topics import TopicConfig, read_snapshot
from smartgo.store import StoreReader


class NetView:
    def __init__(self, board: Board, store_path: Path, reader: StoreReader) -> None:
        self.board = board
        self.store_path = store_path
        self.reader = reader
        self.written = board.scalar("commitlog.written")
        self.flushed = board.scalar("commitlog.flushed")
        self.disk_full = board.scalar("flag.disk_full")
        self.read_only = board.scalar("flag.read_only")
        self.unreadable = board.scalar("flag.unreadable")
        self._topics_version = board.scalar("broker.topics_version")
        self._commitlog_min = board.scalar("commitlog.min")
        self._seen_min = self._commitlog_min.get()
        self._loaded = -1
        self.topics: dict[str, TopicConfig] = {}
        self._table = board.queues
        self._queue_index: dict[tuple[str, int], int] = {}

    # ---- topics ---------------------------------------------------------------------------------
    def topic(self, name: str) -> TopicConfig | None:
        if self._topics_version.get() != self._loaded:
            self.reload_topics()
        return self.topics.get(name)

    def reload_topics(self) -> None:
        version = self._topics_version.get()
        snap = read_snapshot(self.store_path)        # logs and falls back to .bak if it must
        if snap is not None:
            self.topics = snap.topics
        self._loaded = version

    def add_topic(self, cfg: TopicConfig) -> None:
        """A topic the broker actor just created (its snapshot follows)."""
        self.topics = {**self.topics, cfg.name: cfg}

    # ---- queues -------------------------------------------------------------------------------------
    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's published max offset (0 until dispatch first publishes it)."""
        key = (topic, queue_id)
        i = self._queue_index.get(key)
        if i is None:
            i = self._table.index_of(topic, queue_id)
            if i is None:
                return 0
            self._queue_index[key] = i              # entries never move
        return self._table.value_at(i)

    def fresh_reader(self) -> StoreReader:
        """The reader, refreshed first if cleanup moved the CommitLog minimum."""
        minimum = self._commitlog_min.get()
        if minimum != self._seen_min:
            self._seen_min = minimum
            self.reader.refresh()
        return self.reader


def store_backlog(fields: Mapping[str, int]) -> tuple[int, int]:
    """(dispatch behind, flush behind) in CommitLog bytes, from the board's fields: runtime info's
    dispatchBehindBytes / remainHowManyDataToFlush and the metrics' storage gauges."""
    written = fields["commitlog.written"]
    return max(0, written - fields["commitlog.dispatched"]), max(0, written - fields["commitlog.flushed"])
