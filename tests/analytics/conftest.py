"""Analytics test helpers: one local[2] SparkSession for each pytest worker's run, and small stores.

Starting a JVM costs seconds, so a worker's Spark tests share the session (scope="session");
tests never stop it (the CLIs leave a session they did not create running).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from smartgo.store import Message, MessageStore, StoreConfig

STORE_START_MS = 1_795_000_000_000
STORE_STEP_MS = 1000


class Clock:
    """Store clock in ms: every call moves it STORE_STEP_MS on (one tick per append round)."""

    def __init__(self, start: int = STORE_START_MS, step: int = STORE_STEP_MS):
        self.now = start
        self.step = step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


@dataclass(slots=True)
class Stored:
    """What a test store holds, as the store reported it on put."""

    root: Path
    rows: list[dict] = field(default_factory=list)  # one per message, in log order

    def per_topic(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rows:
            counts[r["topic"]] = counts.get(r["topic"], 0) + 1
        return counts


def small_store_config(root: Path, file_size: int = 8192) -> StoreConfig:
    return StoreConfig(store_path=str(root), commitlog_file_size=file_size, consume_queue_file_size=400,
                       message_index_enable=False, release_interval_bytes=8192)


def build_store(root: Path, plan: list[tuple[str, int, int]], *, file_size: int = 8192, body_size: int = 100,
                clock: Clock | None = None) -> Stored:
    """Put messages with MessageStore: plan is (topic, queue_id, count) batches, in order;
    every message has TAGS, KEYS ("k<topic>-<n> shared") and a custom property."""
    stored = Stored(root)
    clock = clock or Clock()
    with MessageStore(small_store_config(root, file_size), clock=clock) as store:
        serial = 0
        for topic, queue_id, count in plan:
            for _ in range(count):
                props = {"TAGS": f"tag{serial % 3}", "KEYS": f"k{topic}-{serial} shared", "color": "blue"}
                body = bytes([65 + serial % 26]) * body_size
                result = store.put(Message(topic, body, queue_id=queue_id, properties=props,
                                           born_host=("10.1.2.3", 4567)))
                stored.rows.append({
                    "topic": topic, "queue_id": queue_id, "queue_offset": result.queue_offset,
                    "commit_log_offset": result.physical_offset, "store_timestamp_ms": result.store_timestamp,
                    "msg_id": result.msg_ids[0], "keys": [f"k{topic}-{serial}", "shared"],
                    "tags": props["TAGS"], "properties": props, "body": body})
                serial += 1
    return stored


@pytest.fixture(scope="session")
def spark() -> Iterator:
    from analytics.spark import session

    s = session("local[2]", app_name="smartgo-analytics-tests", short_job=True)
    try:
        yield s
    finally:
        s.stop()
