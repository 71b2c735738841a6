"""Small-file store configurations and record helpers for the store tests."""

from __future__ import annotations

import pytest

from smartgo.store import StoreConfig
from smartgo.store.record import encode_properties, encode_record, pack_host

HOST = pack_host("10.0.0.1", 10911)


class Clock:
    """A store clock (ms) that moves step ms per call: deterministic store timestamps."""

    def __init__(self, start: int = 1_700_000_000_000, step: int = 1000):
        self.now = start
        self.step = step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


def small_config(path, **overrides) -> StoreConfig:
    settings = dict(store_path=str(path), commitlog_file_size=4096, consume_queue_file_size=100,
                    index_slot_count=11, index_entry_count=40, release_interval_bytes=8192)
    settings.update(overrides)
    return StoreConfig(**settings)


def rec(topic: str = "TopicA", queue_id: int = 0, body: bytes = b"body", **props: str) -> bytes:
    return encode_record(topic, queue_id, body, encode_properties(props), born_timestamp=1, born_host=HOST,
                         store_host=HOST)


@pytest.fixture
def config(tmp_path) -> StoreConfig:
    return small_config(tmp_path / "store")
