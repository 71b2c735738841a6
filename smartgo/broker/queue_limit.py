"""How many queues a broker lets sends open.

Two things bound it. The board's queue table holds a fixed number (sized at each start,
smartgo.actors.board). And dispatch and every net actor keep a ConsumeQueue file mapped per
queue they touch, each mapping holding a descriptor (CPython's mmap keeps a dup of the file's):
past the open files limit dispatch fails with EMFILE and net actors can accept no connection.
Either way consumers would stop seeing what was acknowledged, so the commit actor refuses the
record that would open one queue too many instead (CommitLogWriter.max_queues) and publishes
the limit it applies on the board (commit.max_queues) for the net actors' answers, the topic
admission and the metrics.
"""

from __future__ import annotations

import resource

from smartgo.actors.board import Board

RESERVE_MIN = 1024          # descriptors kept for connections, CommitLog and index files


def open_files_budget() -> int:
    """Queues whose files a process can keep mapped: the open files limit (the supervisor raised
    it to the hard limit) less a quarter for everything else - at least RESERVE_MIN, at most half."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 40
    return soft - min(max(RESERVE_MIN, soft // 4), soft // 2)


def max_queues(board: Board) -> int:
    """The commit actor's limit: the table's load limit or the open files budget, the lower."""
    return min(board.queues.limit, open_files_budget())


def published_limit(board: Board) -> int:
    """The limit the commit actor applies (a slave has none: the table's limit)."""
    return board.get("commit.max_queues") or board.queues.limit
