"""A cleanup pass over thousands of queues: it deletes every queue's ConsumeQueue files that only
point below the CommitLog minimum (never a file above it, never the newest) while the cleanup actor's
loop keeps turning, so its heartbeat goes on (one pass over 10,136 queues held it 0.3-3.4 s, and
once past the 5 s heartbeat deadline: the actor was killed as hung)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from smartgo.broker.actors.cleanup_actor import clean_queues
from smartgo.store import StoreConfig
from smartgo.store.config import CQ_UNIT
from smartgo.store.consume_queue import ConsumeQueueSet, queue_dir
from smartgo.store.mapped_file import segment_starts

QUEUES = 4000
PER_FILE = 2                # entries a ConsumeQueue file: 5 entries make 3 files
MINIMUM = 2000              # the CommitLog minimum: each queue's first file (entries 0, 1) is below it


async def _turns_while(pass_: Coroutine[Any, Any, tuple[int, int]]) -> tuple[tuple[int, int], int]:
    """Run the pass beside a task that counts the loop's turns (the heartbeat task needs them);
    the pass's result and the turns taken while it ran."""
    turns = 0

    async def count() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1
    counter = asyncio.create_task(count())
    await asyncio.sleep(0)
    before = turns
    result = await pass_
    during = turns - before
    counter.cancel()
    return result, during


@pytest.mark.timeout(120)
def test_a_pass_over_thousands_of_queues_keeps_the_loop_turning_and_deletes_below_the_minimum(tmp_path):
    cfg = StoreConfig(store_path=str(tmp_path), consume_queue_file_size=PER_FILE * CQ_UNIT)
    qs = ConsumeQueueSet(cfg.consume_queue_dir, cfg.consume_queue_file_size, mapped_files=64)
    for q in range(QUEUES):
        for i in range(2 * PER_FILE + 1):
            assert qs.get("T", q).put(i, i * 1000 + q % 1000, 10, 0)    # the 2nd file's last: 3000.. >= minimum
    qs.close()
    # a slice of 0: the loop turns after every queue (QUEUE_SLICE, 20 ms, in the actor)
    result, turns = asyncio.run(_turns_while(clean_queues(cfg, MINIMUM, slice_s=0.0)))
    assert result == (QUEUES, 0)
    assert turns >= QUEUES
    file_size = cfg.consume_queue_file_size
    for q in range(QUEUES):
        assert segment_starts(queue_dir(cfg.consume_queue_dir, "T", q)) == [file_size, 2 * file_size]
