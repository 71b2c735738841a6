"""python -m analytics.query: SQL over the messages view, as a table, JSON lines or CSV."""

from __future__ import annotations

import base64
import csv
import io
import json
from datetime import datetime, timezone

import pytest

from analytics.query import EXIT_OK, EXIT_SQL, EXIT_USAGE, main

from .conftest import build_store

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("q") / "store", [("Orders", 0, 7), ("Logs", 0, 3)])


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def test_table_output(spark, stored):
    code, text = run("--store", str(stored.root), "--sql",
                     "SELECT topic, count(*) AS n FROM messages GROUP BY topic ORDER BY topic")
    assert code == EXIT_OK
    lines = text.splitlines()
    assert lines[1].split("|")[1:3] == [" topic  ", " n "]
    assert [line.split("|")[1].strip() for line in lines[3:5]] == ["Logs", "Orders"]
    assert [line.split("|")[2].strip() for line in lines[3:5]] == ["3", "7"]
    assert lines[-1] == "2 rows"


def test_table_output_is_limited(spark, stored):
    code, text = run("--store", str(stored.root), "--sql", "SELECT queue_offset FROM messages", "--limit", "4")
    assert code == EXIT_OK and text.splitlines()[-1].startswith("4 rows (more:")


def test_json_lines(spark, stored):
    code, text = run("--store", str(stored.root), "--json", "--include-body", "--topics", "Orders", "--sql",
                     "SELECT queue_offset, keys, properties, store_timestamp, body FROM messages ORDER BY queue_offset")
    rows = [json.loads(line) for line in text.splitlines()]
    assert code == EXIT_OK and [r["queue_offset"] for r in rows] == list(range(7))
    first, want = rows[0], stored.rows[0]
    assert first["keys"] == want["keys"] and first["properties"] == want["properties"]
    stored_at = datetime.fromtimestamp(want["store_timestamp_ms"] / 1000, timezone.utc)
    assert first["store_timestamp"] == stored_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert base64.b64decode(first["body"]) == want["body"]


def test_csv_with_time_range(spark, stored):
    times = [r["store_timestamp_ms"] for r in stored.rows]
    code, text = run("--store", str(stored.root), "--csv", "--since", str(times[2]), "--until", str(times[5]),
                     "--sql", "SELECT topic, queue_offset, keys FROM messages ORDER BY queue_offset")
    rows = list(csv.reader(io.StringIO(text)))
    assert code == EXIT_OK and rows[0] == ["topic", "queue_offset", "keys"]
    assert [r[1] for r in rows[1:]] == ["2", "3", "4"] and json.loads(rows[1][2]) == stored.rows[2]["keys"]


def test_sql_error_and_missing_store(spark, stored, tmp_path, capsys):
    code, _ = run("--store", str(stored.root), "--sql", "SELECT no_such_column FROM messages")
    assert code == EXIT_SQL and "no_such_column" in capsys.readouterr().err
    code, _ = run("--store", str(tmp_path / "nope"), "--sql", "SELECT 1")
    assert code == EXIT_USAGE and "does not exist" in capsys.readouterr().err
