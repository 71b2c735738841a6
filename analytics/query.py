"""python -m analytics.query: ad-hoc Spark SQL over the messages in a store's CommitLog.

    python -m analytics.query --store ~/store --sql "SELECT topic, count(*) FROM messages GROUP BY topic"
    python -m analytics.query --store ~/store --since 2026-11-22T10:00Z --json \\
        --sql "SELECT msg_id, keys, store_timestamp FROM messages WHERE topic = 'Orders'"

The temp view ``messages`` has one row per stored message (analytics.datasource.message_schema;
``body`` with --include-body). Output: an aligned table (at most --limit rows), or every row
as JSON lines (--json) or CSV (--csv). Exit status: 0 ok, 1 the SQL failed, 2 bad
arguments or no store.
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import logging
import os
import sys
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import TextIO

from analytics.spark import add_spark_arguments, cli_session
from analytics.store_scan import commitlog_dir
from analytics.timespec import time_arg

log = logging.getLogger("smartgo.analytics.query")

VIEW = "messages"
CELL_CHARS = 64
EXIT_OK, EXIT_SQL, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analytics.query", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True, metavar="DIR", help="store folder (holding commitlog/)")
    p.add_argument("--sql", required=True, help=f"a query over the view {VIEW!r}")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="every row as one JSON object per line")
    fmt.add_argument("--csv", action="store_true", help="every row as CSV with a header line")
    p.add_argument("--limit", type=int, default=100, help="rows printed as a table (default 100)")
    p.add_argument("--topics", default=None, help="only these topics (A,B): files are read, records skipped early")
    p.add_argument("--since", type=time_arg, default=None, metavar="T", help="store time >= T (ISO-8601 or epoch ms)")
    p.add_argument("--until", type=time_arg, default=None, metavar="T", help="store time < T")
    p.add_argument("--include-body", action="store_true", help="add the binary body column")
    add_spark_arguments(p)
    return p


def messages_view(spark, store: str, *, topics: str | None = None, since: int | None = None,
                  until: int | None = None, include_body: bool = False):
    """Register (and return) the ``messages`` temp view over a store."""
    reader = spark.read.format("smartgo").option("includeBody", str(include_body).lower())
    for key, value in (("topics", topics), ("since", since), ("until", until)):
        if value is not None:
            reader = reader.option(key, str(value))
    df = reader.load(store)
    df.createOrReplaceTempView(VIEW)
    return df


def _plain(value):
    """A JSON-able value: timestamps as ISO-8601, binary as base64, maps and rows as objects."""
    if isinstance(value, datetime):
        # Spark hands out naive datetimes in the process's local zone (fold set): as UTC
        return value.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "asDict"):
        return _plain(value.asDict(recursive=True))
    return value


def _csv_value(value):
    if value is None:
        return ""
    plain = _plain(value)
    return json.dumps(plain, ensure_ascii=False) if isinstance(plain, (dict, list)) else plain


def _cell(value) -> str:
    if value is None:
        return "NULL"
    plain = _plain(value)
    text = plain if isinstance(plain, str) else json.dumps(plain, ensure_ascii=False)
    text = text.replace("\n", "\\n").replace("\x01", "=").replace("\x02", ";")
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…"


def print_table(columns: list[str], rows: list, out: TextIO, more: bool) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out.write(line + "\n")
    out.write("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |\n")
    out.write(line + "\n")
    for r in cells:
        out.write("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |\n")
    out.write(line + "\n")
    out.write(f"{len(rows)} row{'s' if len(rows) != 1 else ''}" + (" (more: raise --limit, or use --json/--csv)"
                                                                    if more else "") + "\n")


def write_rows(df, out: TextIO, *, as_json: bool, as_csv: bool, limit: int) -> int:
    """Print the query result; returns the number of rows printed."""
    columns = df.columns
    if as_json or as_csv:
        writer = csv.writer(out) if as_csv else None
        if writer:
            writer.writerow(columns)
        n = 0
        for row in df.toLocalIterator():
            if writer:
                writer.writerow([_csv_value(v) for v in row])
            else:
                out.write(json.dumps({c: _plain(v) for c, v in zip(columns, row)}, ensure_ascii=False) + "\n")
            n += 1
        return n
    rows = df.limit(limit + 1).collect()
    print_table(columns, rows[:limit], out, more=len(rows) > limit)
    return min(len(rows), limit)


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        commitlog_dir(args.store)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with cli_session(args, "smartgo-query") as spark:
        try:
            messages_view(spark, args.store, topics=args.topics, since=args.since, until=args.until,
                          include_body=args.include_body)
            write_rows(spark.sql(args.sql), out, as_json=args.json, as_csv=args.csv, limit=args.limit)
        except BrokenPipeError:  # `| head`: the reader has all it wants
            sys.stdout = open(os.devnull, "w")
        except Exception as exc:  # AnalysisException, ParseException, PythonException...
            if type(exc).__module__.split(".")[0] != "pyspark":
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"error: {first}", file=sys.stderr)
            return EXIT_SQL
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
