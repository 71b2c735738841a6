"""The broker statistics file contract (docs/STATS.md, schema v1): names, bounds, file naming.

One module shared by the writer (smartgo.broker.stats.stats_files, the broker actor) and the readers
(analytics/), so the two cannot drift. Pure Python, no Spark.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

SCHEMA_VERSION = 1
FILE_GLOB = "*.jsonl"
# stats-<yyyyMMdd>-<HH>.jsonl: the UTC hour whose traffic the file holds
FILE_RE = re.compile(r"stats-(\d{8})-(\d{2})\.jsonl")
HOUR_MS = 3_600_000

# Latency histogram upper bounds in ms; None is +inf (written as null). Fixed, so
# histograms add across brokers and minutes.
LATENCY_BOUNDS: tuple[float | None, ...] = (
    0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, None)
LATENCY_KINDS = ("send", "pull")


def file_name(ts_ms: int) -> str:
    """The file a record with this ``ts`` (its window's end) goes to: the UTC hour its window
    lies in, i.e. the hour of ts - 1 ms. A record stamped exactly on an hour (14:00:00.000,
    window 13:59-14:00) closes the 13 o'clock file, so stats-...-13.jsonl holds exactly the
    traffic of 13:00-14:00 (windows divide the hour, so none straddles two files)."""
    return datetime.fromtimestamp((ts_ms - 1) / 1000, timezone.utc).strftime("stats-%Y%m%d-%H.jsonl")


def file_hour_ms(name: str) -> int | None:
    """Start of the UTC hour a stats file name stands for (None: not a stats-*.jsonl name).
    Its records have start < ts <= start + 1 h."""
    m = FILE_RE.fullmatch(name)
    if not m:
        return None
    try:
        moment = datetime.strptime(m.group(1) + m.group(2), "%Y%m%d%H").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return int(moment.timestamp() * 1000)
