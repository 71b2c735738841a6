"""python -m analytics.report: brokers' stats folders in, an HTML traffic report with plots out.

    python -m analytics.report --stats /data/broker-a/stats /data/broker-b/stats \\
        [--since 2026-11-22T00:00Z --until 1795100000000] --out report/ [--master spark://host:7077]

Writes <out>/index.html, one PNG per plot, and every table as <out>/tables/<name>.csv and
.parquet. Exit status: 0 report written; 2 bad arguments or missing input (no folder, no
stats files); 3 nothing usable (every line bad, or none in the time range). Bad lines are
counted and listed in the report, never fatal.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from analytics.spark import add_spark_arguments, cli_session
from analytics.stats_input import NO_LIMIT, InputError, InputSummary, find_stats_files, read_records
from analytics.timespec import format_time, time_arg

log = logging.getLogger("smartgo.analytics.report")

EXIT_OK, EXIT_USAGE, EXIT_EMPTY = 0, 2, 3
STEPS = 5


@dataclass(slots=True)
class ReportResult:
    out: Path
    summary: InputSummary
    frames: dict  # table name -> pandas DataFrame
    charts: dict  # chart name -> the matplotlib Figure saved as <out>/<name>.png
    seconds: float


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analytics.report", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stats", nargs="+", required=True, metavar="DIR",
                   help="brokers' stats folders (or store folders holding stats/)")
    p.add_argument("--since", type=time_arg, default=0, metavar="T", help="ISO-8601 or epoch ms (inclusive)")
    p.add_argument("--until", type=time_arg, default=NO_LIMIT, metavar="T", help="ISO-8601 or epoch ms (exclusive)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder (created)")
    add_spark_arguments(p)
    return p


def run_report(spark, folders: list[str], out: Path, since_ms: int = 0, until_ms: int = NO_LIMIT,
               progress=None) -> ReportResult:
    """The whole job on an existing session. InputError when there is nothing to report."""
    from analytics.progress import Progress
    from analytics.render import plot_all, write_html, write_tables
    from analytics.stats_tables import collect, compute_tables, time_range

    started = time.monotonic()
    progress = progress or Progress(spark, STEPS)
    stats = find_stats_files(folders, since_ms, until_ms)
    with progress.step(f"reading {len(stats.files)} stats files"):
        records, summary = read_records(spark, stats, since_ms, until_ms)
    try:
        if summary.used == 0:
            raise InputError(_empty_reason(summary, since_ms, until_ms))
        with progress.step("computing tables"):
            period = time_range(records)
            frames = collect(compute_tables(records, period))
    finally:
        records.unpersist()
    out.mkdir(parents=True, exist_ok=True)
    with progress.step("writing CSV and Parquet"):
        write_tables(out, frames)
    with progress.step("plotting"):
        charts = plot_all(out, frames, period)
    with progress.step("writing index.html"):
        write_html(out, summary, period, frames, format_time(int(time.time() * 1000)))
    return ReportResult(out, summary, frames, charts, time.monotonic() - started)


def _empty_reason(summary: InputSummary, since_ms: int, until_ms: int) -> str:
    if summary.lines == 0:
        return "the stats files hold no lines"
    if summary.good == 0:
        detail = ", ".join(f"{n} {why}" for why, n in summary.bad.items())
        return f"none of the {summary.lines} lines is a usable stats record ({detail})"
    rng = f"[{format_time(since_ms) if since_ms else '-inf'}, " \
          f"{format_time(until_ms) if until_ms < NO_LIMIT else '+inf'})"
    return f"no record in the time range {rng} ({summary.out_of_range} records outside it)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.since >= args.until:
        print("error: --since must be before --until", file=sys.stderr)
        return EXIT_USAGE
    try:
        find_stats_files(args.stats, args.since, args.until)  # fail fast, before starting a JVM
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with cli_session(args, "smartgo-report", short_job=True) as spark:
        try:
            result = run_report(spark, args.stats, args.out, args.since, args.until)
        except InputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_EMPTY
    s = result.summary
    bad = f", {s.bad_total} bad lines skipped ({'; '.join(f'{n} {w}' for w, n in s.bad.items())})" if s.bad else ""
    print(f"report: {result.out / 'index.html'} ({s.used} broker-minutes from {s.files} files{bad}; "
          f"{result.seconds:.1f} s)")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
