"""Reading brokers' stats folders into Spark: find files, parse lines, sort out the bad ones.

Each line is parsed by Spark's JSON reader against the v1 schema (docs/STATS.md) in
PERMISSIVE mode, so a bad line becomes a counted, classified row instead of a failed job:
not JSON (including a line torn by a crash), a schema version other than 1, fields of the
wrong type, or required fields missing. Good lines keep their structure; the same
broker-minute read twice (a folder given twice, a copied file) counts once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from analytics.stats_schema import CORRUPT_COLUMN, FILE_GLOB, HOUR_MS, SCHEMA_VERSION, SPARK_DDL, file_hour_ms

log = logging.getLogger("smartgo.analytics.stats_input")

NO_LIMIT = (1 << 63) - 1
BAD_EXAMPLES = 20  # bad lines quoted in the report
EXCERPT_CHARS = 160

# Reasons a line is not used, in the order they are tested.
REASON_NOT_JSON = "not JSON (torn or garbled line)"
REASON_VERSION = f"schema version is not {SCHEMA_VERSION}"
REASON_TYPES = "fields of the wrong type"
REASON_MISSING = "required fields missing (ts, window_s, broker)"


class InputError(Exception):
    """The input cannot make a report (missing folder, no stats files, no usable record)."""


@dataclass(slots=True)
class StatsFiles:
    folders: list[Path]
    files: list[Path]
    skipped_by_time: int = 0  # files whose hour is outside --since/--until


@dataclass(slots=True)
class InputSummary:
    folders: list[str]
    files: int
    files_skipped_by_time: int
    lines: int = 0
    good: int = 0
    bad: dict[str, int] = field(default_factory=dict)
    in_range: int = 0
    duplicates: int = 0
    out_of_range: int = 0
    used: int = 0
    bad_examples: list[tuple[str, str, str]] = field(default_factory=list)  # (file, reason, excerpt)

    @property
    def bad_total(self) -> int:
        return sum(self.bad.values())


def find_stats_files(folders: list[str], since_ms: int = 0, until_ms: int = NO_LIMIT) -> StatsFiles:
    """The *.jsonl files of each folder (a store root with a stats/ folder works too),
    skipping hour files that cannot hold a record in [since, until)."""
    resolved: list[Path] = []
    files: list[Path] = []
    skipped = 0
    for name in folders:
        folder = Path(name)
        if not folder.is_dir():
            raise InputError(f"stats folder {folder} does not exist (or is not a folder)")
        if not any(folder.glob(FILE_GLOB)) and (folder / "stats").is_dir():
            folder = folder / "stats"
        resolved.append(folder)
        for path in sorted(folder.glob(FILE_GLOB)):
            hour = file_hour_ms(path.name)
            # one hour of slack each side: a broker may file a minute's record by its window start
            if hour is not None and (hour + 2 * HOUR_MS <= since_ms or hour - HOUR_MS >= until_ms):
                skipped += 1
                continue
            if path.is_file():
                files.append(path)
    if not files:
        where = ", ".join(str(f) for f in resolved)
        if skipped:
            raise InputError(f"no stats file in {where} covers the requested time range "
                             f"({skipped} files outside it)")
        raise InputError(f"no stats files (*.jsonl) in {where}")
    return StatsFiles(resolved, files, skipped)


def read_records(spark, stats: StatsFiles, since_ms: int = 0, until_ms: int = NO_LIMIT):
    """(records DataFrame, InputSummary). Records are the good, de-duplicated lines with
    since <= ts < until, cached: every report table is computed from them. The caller
    unpersists them."""
    import pyspark.sql.functions as F
    from pyspark import StorageLevel

    parsed = (spark.read.schema(SPARK_DDL).option("mode", "PERMISSIVE")
              .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
              .json([os.fspath(p) for p in stats.files])
              .withColumn("_file", F.col("_metadata.file_path")))
    bad_text = F.col(CORRUPT_COLUMN)
    required = F.coalesce((F.col("ts") > 0) & (F.col("window_s") > 0) & F.col("broker").isNotNull(), F.lit(False))
    reason = (F.when(bad_text.isNull() & (F.col("v") == SCHEMA_VERSION) & required, F.lit(None))
              .when(bad_text.isNotNull() & F.get_json_object(bad_text, "$").isNull(), REASON_NOT_JSON)
              .when(bad_text.isNotNull()
                    & (F.coalesce(F.get_json_object(bad_text, "$.v"), F.lit("")) != str(SCHEMA_VERSION)),
                    REASON_VERSION)
              .when(bad_text.isNotNull(), REASON_TYPES)
              .when(F.coalesce(F.col("v") != SCHEMA_VERSION, F.lit(True)), REASON_VERSION)
              .otherwise(REASON_MISSING))
    excerpt = F.coalesce(F.substring(bad_text, 1, EXCERPT_CHARS),
                         F.to_json(F.struct("v", "ts", "window_s", "broker")))
    in_range = F.coalesce((F.col("ts") >= since_ms) & (F.col("ts") < until_ms), F.lit(False))
    classified = parsed.select("*", reason.alias("_reason"), in_range.alias("_in_range")).persist(
        StorageLevel.MEMORY_AND_DISK)
    try:
        summary = _summarize(classified, stats)
        summary.bad_examples = [
            (Path(row["_file"]).name, row["_reason"], row["excerpt"]) for row in
            classified.where(F.col("_reason").isNotNull()).select("_file", "_reason", excerpt.alias("excerpt"))
            .limit(BAD_EXAMPLES).collect()] if summary.bad else []
        for file, why, text in summary.bad_examples[:5]:
            log.warning("bad stats line in %s (%s): %.80s", file, why, text)
        records = (classified.where(F.col("_reason").isNull() & F.col("_in_range"))
                   .drop(CORRUPT_COLUMN, "_file", "_reason", "_in_range"))
        keys = ["cluster", "broker", "broker_id", "ts"]
        distinct = records.select(*keys).distinct().count()
        summary.duplicates = summary.in_range - distinct
        records = (records.dropDuplicates(keys) if summary.duplicates else records).persist(
            StorageLevel.MEMORY_AND_DISK)
        summary.used = records.count()
    finally:
        classified.unpersist()
    return records, summary


def _summarize(classified, stats: StatsFiles) -> InputSummary:
    import pyspark.sql.functions as F

    summary = InputSummary([str(f) for f in stats.folders], len(stats.files), stats.skipped_by_time)
    for row in classified.groupBy("_reason", "_in_range").agg(F.count("*").alias("n")).collect():
        reason, n = row["_reason"], row["n"]
        if reason is None:
            summary.good += n
            summary.in_range += n if row["_in_range"] else 0
        else:
            summary.bad[reason] = summary.bad.get(reason, 0) + n
    summary.bad = dict(sorted(summary.bad.items()))
    summary.lines = summary.good + summary.bad_total
    summary.out_of_range = summary.good - summary.in_range
    return summary
