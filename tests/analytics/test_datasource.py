"""spark.read.format("smartgo"): exactly the stored messages, as a parallel, filterable DataFrame."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from analytics.datasource import message_schema

from .conftest import build_store

pytestmark = pytest.mark.timeout(300)  # the first test pays for a cold JVM

PLAN = [("Orders", 0, 30), ("Logs", 1, 12), ("Orders", 1, 18), ("Audit", 0, 6)]


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("ds") / "store", PLAN)


def load(spark, root, **options):
    reader = spark.read.format("smartgo")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(str(root))


def test_rows_equal_the_stored_messages(spark, stored):
    df = load(spark, stored.root, includeBody="true")
    files = list((stored.root / "commitlog").iterdir())
    assert len(files) >= 2 and df.rdd.getNumPartitions() == len(files)  # the log rolled; a task per file
    rows = sorted(df.collect(), key=lambda r: r.commit_log_offset)
    assert len(rows) == len(stored.rows) == 66
    counts = {r["topic"]: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == stored.per_topic() == {"Orders": 48, "Logs": 12, "Audit": 6}
    for got, want in zip(rows, stored.rows):
        assert (got.topic, got.queue_id, got.queue_offset, got.commit_log_offset, got.msg_id) == \
            (want["topic"], want["queue_id"], want["queue_offset"], want["commit_log_offset"], want["msg_id"])
        assert got.keys == want["keys"] and got.tags == want["tags"] and got.properties == want["properties"]
        assert bytes(got.body) == want["body"] and got.body_size == len(want["body"])
        assert got.store_timestamp_ms == want["store_timestamp_ms"]
        assert got.store_timestamp.replace(tzinfo=timezone.utc) == \
            datetime.fromtimestamp(want["store_timestamp_ms"] / 1000, timezone.utc)
        assert (got.born_host, got.store_host, got.reconsume_times, got.sys_flag) == \
            ("10.1.2.3:4567", "127.0.0.1:10911", 0, 0)


def test_schema_has_body_only_on_request(spark, stored):
    assert "body" not in load(spark, stored.root).columns
    assert load(spark, stored.root, includeBody="true").schema == message_schema(True)


def test_topic_and_time_options(spark, stored):
    assert load(spark, stored.root, topics="Logs, Audit").count() == 18
    times = [r["store_timestamp_ms"] for r in stored.rows]
    df = load(spark, stored.root, since=str(times[5]), until=str(times[40]))
    assert sorted(r.commit_log_offset for r in df.select("commit_log_offset").collect()) == \
        [r["commit_log_offset"] for r in stored.rows[5:40]]
    iso = datetime.fromtimestamp(times[40] / 1000, timezone.utc).isoformat()
    assert load(spark, stored.root, until=iso).count() == 40


def test_where_clauses_are_pushed_down_and_still_exact(spark, stored):
    df = load(spark, stored.root)
    times = [r["store_timestamp_ms"] for r in stored.rows]
    q = df.where((df.topic == "Orders") & (df.store_timestamp_ms >= times[10]) & (df.store_timestamp_ms < times[50]))
    want = [r["queue_offset"] for r in stored.rows[10:50] if r["topic"] == "Orders"]
    assert sorted(r.queue_offset for r in q.collect()) == sorted(want)
    assert df.where(df.topic.isin("Audit", "Nope")).count() == 6


def test_splitting_a_file_gives_the_same_rows(spark, stored):
    df = load(spark, stored.root, splitBytes="4096")
    assert df.rdd.getNumPartitions() > load(spark, stored.root).rdd.getNumPartitions()
    assert sorted(r.commit_log_offset for r in df.select("commit_log_offset").collect()) == \
        [r["commit_log_offset"] for r in stored.rows]


def test_a_narrower_user_schema_reads_only_those_columns(spark, stored):
    df = spark.read.format("smartgo").schema("topic string, queue_offset bigint, keys array<string>") \
        .load(str(stored.root))
    rows = df.where("topic = 'Audit'").orderBy("queue_offset").collect()
    assert [(r.queue_offset, r.keys[1]) for r in rows] == [(i, "shared") for i in range(6)]
    bad = spark.read.format("smartgo").schema("topic int").load(str(stored.root))
    with pytest.raises(Exception, match="not in the smartgo schema"):
        bad.collect()


def test_torn_tail_and_appended_garbage_are_skipped(spark, tmp_path):
    s = build_store(tmp_path / "store", [("Orders", 0, 40)])
    files = sorted((s.root / "commitlog").iterdir())
    last_rows = [r for r in s.rows if r["commit_log_offset"] >= int(files[-1].name)]
    assert len(files) >= 2 and len(last_rows) >= 2
    end = last_rows[-1]["commit_log_offset"] - int(files[-1].name)
    with open(files[-1], "r+b") as f:
        f.seek(end + 40)
        f.write(b"\xff" * 300)  # tear the last record and leave garbage after it
    df = load(spark, s.root)
    assert df.count() == 39
    assert df.agg({"queue_offset": "max"}).first()[0] == 38


def test_empty_commitlog_gives_no_rows(spark, tmp_path):
    (tmp_path / "store" / "commitlog").mkdir(parents=True)
    assert load(spark, tmp_path / "store").count() == 0


def test_missing_store_is_a_clear_error(spark, tmp_path):
    with pytest.raises(Exception, match="does not exist"):
        load(spark, tmp_path / "nope").count()
