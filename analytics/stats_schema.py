"""The broker statistics file contract (docs/STATS.md, schema v1) as code: names, bounds, types.

Pure Python (no Spark) so the stats generator, tests and, later, the broker's writer can
share it.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

SCHEMA_VERSION = 1
FILE_GLOB = "*.jsonl"
# stats-<yyyyMMdd>-<HH>.jsonl: the UTC hour of the records the file holds
FILE_RE = re.compile(r"stats-(\d{8})-(\d{2})\.jsonl")
HOUR_MS = 3_600_000

# Latency histogram upper bounds in ms; None is +inf (written as null). Fixed, so
# histograms add across brokers and minutes.
LATENCY_BOUNDS: tuple[float | None, ...] = (
    0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, None)
LATENCY_KINDS = ("send", "pull")

_HISTOGRAM = ("struct<count: bigint, p50_ms: double, p90_ms: double, p99_ms: double, max_ms: double, "
              "buckets: array<array<double>>>")
# Spark DDL of one record; _corrupt receives lines that are not JSON or not of these types.
SPARK_DDL = (
    "v bigint, ts bigint, window_s bigint, cluster string, broker string, broker_id bigint, addr string, "
    "totals struct<put_msgs: bigint, put_bytes: bigint, get_msgs: bigint, get_bytes: bigint, "
    "put_tps: double, get_tps: double>, "
    "topics array<struct<topic: string, put_msgs: bigint, put_bytes: bigint, put_tps: double>>, "
    "groups array<struct<group: string, topic: string, get_msgs: bigint, get_bytes: bigint, get_tps: double>>, "
    f"latency struct<send: {_HISTOGRAM}, pull: {_HISTOGRAM}>, "
    "lag array<struct<group: string, topic: string, queue_id: bigint, broker_offset: bigint, "
    "consumer_offset: bigint, lag: bigint>>, "
    "_corrupt string"
)
CORRUPT_COLUMN = "_corrupt"


def file_name(ts_ms: int) -> str:
    """The file a record with this ``ts`` goes to."""
    return datetime.fromtimestamp(ts_ms / 1000, timezone.utc).strftime("stats-%Y%m%d-%H.jsonl")


def file_hour_ms(name: str) -> int | None:
    """Start of the UTC hour a stats file name stands for (None: not a stats-*.jsonl name)."""
    m = FILE_RE.fullmatch(name)
    if not m:
        return None
    try:
        moment = datetime.strptime(m.group(1) + m.group(2), "%Y%m%d%H").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return int(moment.timestamp() * 1000)
