"""The board: layout, single-writer handles, the queue table, and readers in other processes."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartgo.actors.board import (NODE_FIELDS, ActorState, Board, BoardError, BoardFull, BoardLayout,
                                  FieldSpec, SupState)
from smartgo.node.roles import BROKER_FIELDS

LAYOUT = BoardLayout(fields=(*NODE_FIELDS, *BROKER_FIELDS), max_actors=8, queue_capacity=64,
                     meta={"role": "master"})


@pytest.fixture
def board(tmp_path: Path) -> Board:
    return Board.create(tmp_path / "run" / "board", LAYOUT)


def test_fields_are_found_by_name_from_the_file_alone(board):
    board.scalar("commitlog.written", writer="commit").set(12345)
    reader = Board.open(board.path, writable=False)
    assert reader.get("commitlog.written") == 12345
    assert reader.meta == {"role": "master"}
    assert reader.field_names() == [f.name for f in (*NODE_FIELDS, *BROKER_FIELDS)]
    offsets = [off for _, off, _ in reader.directory["fields"]]
    assert all(off % 8 == 0 for off in offsets) and len(set(offsets)) == len(offsets)


def test_only_the_declared_writer_gets_a_writable_handle(board):
    with pytest.raises(BoardError, match="written by 'flush', not 'commit'"):
        board.scalar("commitlog.flushed", writer="commit")
    with pytest.raises(BoardError, match="read-only"):
        board.scalar("commitlog.flushed").set(1)
    with pytest.raises(BoardError, match="no field"):
        board.scalar("nope")
    reader = Board.open(board.path, writable=False)
    with pytest.raises(BoardError, match="read-only"):
        reader.scalar("commitlog.flushed", writer="flush").set(1)
    with pytest.raises(BoardError, match="not 'net-0'"):
        board.queues.writer_handle("net-0")


def test_duplicate_fields_and_foreign_files_are_refused(tmp_path):
    with pytest.raises(BoardError, match="twice"):
        BoardLayout(fields=(FieldSpec("a", "x"), FieldSpec("a", "y")))
    junk = tmp_path / "board"
    junk.write_bytes(b"\0" * 4096)
    with pytest.raises(BoardError, match="not a SmartGo board"):
        Board.open(junk)
    with pytest.raises(BoardError, match="no board at"):
        Board.open(tmp_path / "missing")


def test_actor_slots(board):
    board.name_slot(0, "registry")
    board.name_slot(1, "net-0")
    board.write_supervised(1, pid=42, incarnation=3, restarts=2, sup_state=SupState.READY, deadline_ns=5 * 10**9,
                           spawned_ns=7, last_exit=-9)
    me = board.self_writer(1)
    me.claim(42)
    me.state(ActorState.RUNNING)
    me.heartbeat(depth=17, lag_ns=3000)
    me.heartbeat(depth=17, lag_ns=1000)
    cell = me.progress_cell()
    cell[0] += 5
    reader = Board.open(board.path, writable=False)
    view = reader.read_slot(board.slot_of("net-0"))
    assert reader.actor_running("net-0") and not reader.actor_running("registry")
    assert (view.name, view.pid, view.incarnation, view.restarts, view.last_exit) == ("net-0", 42, 3, 2, -9)
    assert view.current and view.state == ActorState.RUNNING and view.mailbox_depth == 17
    assert (view.progress, view.loop_lag_ns, view.loop_lag_max_ns) == (5, 1000, 3000)
    cell.release()
    assert board.actor_names() == ["registry", "net-0"]
    with pytest.raises(BoardError):
        board.name_slot(2, "x" * 33)
    with pytest.raises(BoardError):
        board.slot_of("nobody")


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.tuples(st.text(min_size=1, max_size=40).filter(lambda t: len(t.encode()) <= 127),
                                 st.integers(0, 2**31 - 1)),
                       st.integers(-2**63, 2**63 - 1), max_size=48))
def test_queue_table_matches_a_dict(tmp_path_factory, entries):
    board = Board.create(tmp_path_factory.mktemp("qt") / "board", LAYOUT)
    w = board.queues.writer_handle("dispatch")
    for (topic, qid), value in entries.items():
        w.set(topic, qid, value)
    reader = Board.open(board.path, writable=False).queues
    for (topic, qid), value in entries.items():
        assert reader.get(topic, qid) == value
    assert reader.get("absent-topic", 0) is None
    assert [((t, q), v["max_offset"]) for t, q, v in reader.items()] == list(entries.items())   # oldest first
    assert reader.count == len(entries)


def test_queue_table_refuses_beyond_its_load_limit(board):
    w = board.queues.writer_handle("dispatch")
    for q in range(47):
        w.set("T", q, q)
    restarted = board.queues.writer_handle("dispatch")     # a new incarnation counts what is there
    restarted.set("T", 47, 47)                   # 75% of 64
    assert board.queues.count == board.queues.limit == 48
    with pytest.raises(BoardFull, match="node restart sizes it from the store"):
        restarted.set("T", 48, 1)
    w.set("T", 3, 99)                            # existing entries still update
    assert board.queues.get("T", 3) == 99
    with pytest.raises(BoardError, match="longer than"):
        w.set("x" * 128, 0, 1)


# ---- one writer, readers in other processes --------------------------------------------------------

def _write_patterns(path: str, seconds: float) -> None:
    board = Board.open(Path(path))
    written = board.scalar("commitlog.written", writer="commit")
    queues = board.queues.writer_handle("dispatch")
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        written.set(-1 if n & 1 else 1)          # a torn read would show a mix (or a transient 0)
        if n < 40:
            queues.set(f"topic-{n}", n % 4, n * 1000 + 7)
        board.write_supervised(0, pid=n, incarnation=n, restarts=n, sup_state=n, deadline_ns=n,
                               spawned_ns=n, last_exit=n)
        n += 1


@pytest.mark.timeout(60)
def test_readers_never_see_torn_or_wrong_values(board):
    board.name_slot(0, "commit")
    board.scalar("commitlog.written", writer="commit").set(1)
    writer = multiprocessing.get_context("spawn").Process(target=_write_patterns, args=(str(board.path), 1.5))
    writer.start()
    try:
        reader = Board.open(board.path, writable=False)
        written = reader.scalar("commitlog.written")
        seen_values, records, lookups = set(), 0, 0
        while writer.is_alive():
            for _ in range(200):
                seen_values.add(written.get())
                s = reader.read_slot(0)
                assert s.pid == s.incarnation == s.restarts == s.sup_state == s.deadline_ns == s.last_exit
                records += 1
            for n in range(40):
                v = reader.queues.get(f"topic-{n}", n % 4)
                assert v is None or v == n * 1000 + 7
                lookups += v is not None
        assert seen_values == {1, -1}
        assert records > 1000 and lookups > 0
    finally:
        writer.join(10)
    assert writer.exitcode == 0
