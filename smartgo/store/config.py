"""Store settings with RocketMQ 4.x MessageStoreConfig defaults (facts F.5); tests shrink the files."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from smartgo.store.record import DEFAULT_MAX_BODY, parse_delay_levels

CQ_UNIT = 20
PAGE_SIZE = 4096  # MappedFile.OS_PAGE_SIZE
#: Levels 1..32 of SCHEDULE_TOPIC_XXXX are message_delay_level's; from this one on, the timer hops
#: (smartgo.broker.schedule.schedule_message: timer messages). Fixed, so a changed level table never moves
#: the hops' queues under the entries they hold.
TIMER_FIRST_LEVEL = 33
#: ConsumeQueue files a process keeps mapped at once (smartgo.store.mapped_file.MappingLimit).
MAPPED_QUEUE_FILES = 1024


def round_up_to_unit(size: int, unit: int = CQ_UNIT) -> int:
    """A ConsumeQueue file holds whole entries: 1024 -> 1040 (the seed design's rule)."""
    return -(-size // unit) * unit


@dataclass(slots=True)
class StoreConfig:
    store_path: str = field(default_factory=lambda: os.path.join(os.path.expanduser("~"), "store"))
    commitlog_file_size: int = 1024 * 1024 * 1024
    consume_queue_file_size: int = 300_000 * CQ_UNIT
    mapped_queue_files: int = MAPPED_QUEUE_FILES
    index_slot_count: int = 5_000_000
    index_entry_count: int = 20_000_000
    message_index_enable: bool = True
    message_index_safe: bool = False
    trust_clean_stop: bool = True  # a clean stop's recorded end spares the start-up checks (recovery)
    max_message_size: int = DEFAULT_MAX_BODY
    flush_disk_type: str = "ASYNC_FLUSH"  # or SYNC_FLUSH
    sync_flush_timeout_ms: int = 5000
    flush_interval_commitlog_ms: int = 500
    flush_commitlog_least_pages: int = 4
    flush_commitlog_thorough_interval_ms: int = 10_000
    flush_interval_consume_queue_ms: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval_ms: int = 60_000
    file_reserved_time_hours: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    # A pull of records outside the in-memory window: RocketMQ 4.x stops at 8 messages / 64 KiB. Only
    # the byte budget bounds what one cold pull reads from disk; the count of 8 multiplied the pulls
    # (and their fixed cost in the net actor) by 4 for small messages, the same bytes read either way.
    max_transfer_count_on_message_in_disk: int = 32
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    access_message_in_memory_max_ratio: int = 40
    default_query_max_num: int = 32
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    timer_precision_ms: int = 1000           # 5.x's timerPrecisionMs: the shortest timer hop
    timer_max_delay_ms: int = 3 * 86_400_000   # 5.x's timerMaxDelaySec (3 days)
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    # Drop written/read pages from this process's page tables every so many bytes (madvise
    # DONTNEED): the data stays in the page cache, RSS stays flat while the store grows.
    release_interval_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        self.consume_queue_file_size = round_up_to_unit(self.consume_queue_file_size)
        if self.commitlog_file_size < 4096:
            raise ValueError("commitlog_file_size must be at least 4096 bytes")
        if self.index_slot_count < 1 or self.index_entry_count < 2:
            raise ValueError("an index file needs at least 1 slot and 2 entries")

    @property
    def root(self) -> Path:
        return Path(self.store_path)

    @property
    def commitlog_dir(self) -> Path:
        return self.root / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.root / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return self.root / "index"

    @property
    def checkpoint_path(self) -> Path:
        return self.root / "checkpoint"

    @property
    def abort_path(self) -> Path:
        return self.root / "abort"

    @property
    def lock_path(self) -> Path:
        return self.root / "lock"

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        """The schedule table: ms per SCHEDULE_TOPIC_XXXX level (queue level - 1)."""
        return schedule_levels(parse_delay_levels(self.message_delay_level),
                               timer_hops(self.timer_precision_ms, self.timer_max_delay_ms))


def timer_hops(precision_ms: int, max_delay_ms: int) -> tuple[int, ...]:
    """The timer hops' delays: precision * 2**k, up to the largest within max_delay (at least one)."""
    hops = [precision_ms]
    while hops[-1] * 2 <= max_delay_ms:
        hops.append(hops[-1] * 2)
    return tuple(hops)


def schedule_levels(delay_levels: tuple[int, ...], hops: tuple[int, ...]) -> tuple[int, ...]:
    """The delay levels, padded to TIMER_FIRST_LEVEL - 1 with the last one (no send reaches those:
    DELAY is capped at the table's end), then the timer hops."""
    return delay_levels + delay_levels[-1:] * (TIMER_FIRST_LEVEL - 1 - len(delay_levels)) + hops
