"""A writer process and a reader process share the store files through their own maps,
coordinated only by published positions in shared memory (as the actors' board will be)."""

from __future__ import annotations

import multiprocessing as mp
import zlib

import pytest

from smartgo.store import (
    Block, CommitLogReader, CommitLogWriter, ConsumeQueueSet, Dispatcher, GetStatus, IndexService, SegmentFlusher,
    StoreReader,
)
from smartgo.store.record import check_record, decode_record, encode_properties, encode_record

from .conftest import small_config

TOTAL = 600
WRITTEN, MAX_OFFSET, DONE = 0, 1, 2


def writer_main(store_path, board):
    """Commit + dispatch roles: append in batches, dispatch, then publish the positions."""
    cfg = small_config(store_path, index_entry_count=10_000)
    writer = CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, 0, {})
    queues = ConsumeQueueSet(cfg.consume_queue_dir, cfg.consume_queue_file_size)
    index = IndexService(cfg.index_dir, cfg.index_slot_count, cfg.index_entry_count)
    dispatcher = Dispatcher(CommitLogReader(cfg.commitlog_dir, cfg.commitlog_file_size), queues, index)
    dispatched = 0
    for start in range(0, TOTAL, 7):
        blocks = [Block(encode_record("T", 0, b"%06d" % i + b"p" * (i % 300), encode_properties({"UNIQ_KEY": f"u{i}"})),
                        ("T", 0)) for i in range(start, min(TOTAL, start + 7))]
        writer.append(blocks)
        rnd = dispatcher.dispatch(dispatched, writer.wrote_position)
        dispatched = rnd.position
        board[WRITTEN] = writer.wrote_position  # what a record needs is published before its queue entry
        board[MAX_OFFSET] = rnd.changed.get(("T", 0), board[MAX_OFFSET])
    board[DONE] = 1
    writer.close()
    index.close()
    queues.close()


def reader_main(store_path, board, results):
    """Net role: pull through the ConsumeQueue, never past the published max offset."""
    cfg = small_config(store_path, index_entry_count=10_000)
    reader = StoreReader(cfg)
    seen = []
    bad = 0
    offset = 0
    while len(seen) < TOTAL:
        max_offset = board[MAX_OFFSET]
        written = board[WRITTEN]
        got = reader.get_messages("T", 0, offset, 32, max_offset, written)
        if got.status is GetStatus.FOUND:
            for buf in got.buffers:
                if check_record(buf, 0, len(buf)) != len(buf):
                    bad += 1
                m = decode_record(buf)
                seen.append((m.queue_offset, int(m.body[:6]), m.commit_log_offset + m.store_size <= written))
            offset = got.next_begin_offset
        elif got.status is not GetStatus.OFFSET_OVERFLOW_ONE and got.status is not GetStatus.NO_MESSAGE_IN_QUEUE:
            results.put(("status", got.status.value))
            return
        elif board[DONE] and offset >= board[MAX_OFFSET]:
            break
    results.put(("ok", seen, bad))
    reader.close()


@pytest.mark.timeout(90)
def test_writer_and_reader_processes_share_files(tmp_path):
    ctx = mp.get_context("spawn")
    board = ctx.Array("q", 3, lock=False)
    results = ctx.Queue()
    path = str(tmp_path / "store")
    small_config(path, index_entry_count=10_000).root.mkdir(parents=True)
    reader = ctx.Process(target=reader_main, args=(path, board, results))
    writer = ctx.Process(target=writer_main, args=(path, board))
    reader.start()
    writer.start()
    try:
        outcome = results.get(timeout=60)
        writer.join(30)
        assert writer.exitcode == 0
    finally:
        for p in (reader, writer):
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    assert outcome[0] == "ok", outcome
    _, seen, bad = outcome
    assert bad == 0
    assert [(q, i) for q, i, _ in seen] == [(i, i) for i in range(TOTAL)]  # exactly what was published
    assert all(within for _, _, within in seen)
    # a third party (the flush role) msyncs files it never wrote
    cfg = small_config(path, index_entry_count=10_000)
    flusher = SegmentFlusher(cfg.commitlog_dir, cfg.commitlog_file_size)
    assert flusher.flush(board[WRITTEN]) == board[WRITTEN]
    assert flusher.flush(board[WRITTEN] + 1, least_pages=4) == board[WRITTEN]  # under 4 dirty pages: no-op
    flusher.close()
    # and the index the writer process built answers queries here
    reader = StoreReader(cfg)
    found = reader.query_by_key("T", "u321", 4, 0, 2**62, board[WRITTEN])
    assert [int(decode_record(b).body[:6]) for b in found.buffers] == [321]
    assert zlib.crc32(found.buffers[0]) != 0
    reader.close()
