"""analytics.report: the numbers equal known inputs (two brokers, histograms, lag), bad lines
are counted not fatal, empty input is a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from analytics.report import EXIT_EMPTY, EXIT_OK, EXIT_USAGE, main, run_report
from analytics.stats_gen import Broker, StatsRecord, synthetic_stats, write_stats
from analytics.stats_input import (
    REASON_MISSING, REASON_NOT_JSON, REASON_TYPES, REASON_VERSION, InputError, find_stats_files,
)
from analytics.stats_schema import file_name

pytestmark = pytest.mark.timeout(300)  # the first test pays for a cold JVM

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_795_000_020_000
T1, T2 = T0 + 60_000, T0 + 120_000
A = Broker("broker-a", 0, "127.0.0.1:10911")
B = Broker("broker-b", 0, "127.0.0.1:10921")
INF = None


def known_records() -> dict[Broker, list[StatsRecord]]:
    return {
        A: [StatsRecord(A, T0, topics={"Orders": (600, 60000), "Logs": (120, 12000)},
                        groups={("G1", "Orders"): (540, 54000)},
                        send={0.5: 2, 1: 2}, send_max_ms=0.9, pull={0.1: 1, INF: 1}, pull_max_ms=7000.0,
                        lag={("G1", "Orders", 0): (1000, 900), ("G1", "Orders", 1): (500, 480)},
                        transactions={"Orders": (10, 2)}),
            StatsRecord(A, T1, topics={"Orders": (60, 6000)}, send={0.25: 10}, send_max_ms=0.2,
                        lag={("G1", "Orders", 0): (1060, 1060)}, transactions={"Orders": (5, 0)},
                        dlq={("G1", "Orders"): 4}),
            StatsRecord(A, T2, topics={"Orders": (6, 600)}, lag={("G1", "Orders", 0): (1066, 1000)})],
        B: [StatsRecord(B, T0, topics={"Orders": (300, 30000)},
                        groups={("G1", "Orders"): (240, 24000), ("G2", "Logs"): (60, 6000)},
                        send={1: 4, 5: 2}, send_max_ms=4.0, lag={("G1", "Orders", 0): (700, 650)},
                        transactions={"Orders": (3, 1)}),
            StatsRecord(B, T1, topics={"Logs": (30, 3000)}, groups={("G2", "Logs"): (90, 9000)},
                        dlq={("G2", "Logs"): 2})],
    }


BAD_LINES = ["garbage, not json",
             '{"v":2,"ts":1795000020000,"window_s":60,"broker":"broker-a"}',
             '{"v":1,"ts":"soon","window_s":60,"broker":"broker-a"}',
             '{"v":1,"window_s":60}']


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[str]:
    """broker-a and broker-b folders with the known records, bad lines and a torn last line;
    a third folder repeats broker-b's T1 record (a copied file)."""
    root = tmp_path_factory.mktemp("stats")
    recs = known_records()
    write_stats(root / "a", recs[A][:1] + BAD_LINES + recs[A][1:])
    write_stats(root / "b", recs[B])
    with open(root / "b" / file_name(T1), "a") as f:
        f.write('{"v":1,"ts":1795')  # a crash tore the last line
    write_stats(root / "copy", recs[B][1:])
    return [str(root / "a"), str(root / "b"), str(root / "copy")]


@pytest.fixture(scope="module")
def report(spark, folders, tmp_path_factory):
    return run_report(spark, folders, tmp_path_factory.mktemp("out"), progress=None)


def by(frame, *keys):
    return {tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]]: row for row in frame.to_dict("records")}


def test_volumes_and_tps_per_topic(report):
    tps = by(report.frames["topic_tps"], "topic", "ts")
    assert tps["Orders", T0]["put_msgs"] == 900 and tps["Orders", T0]["tps"] == pytest.approx(15.0)
    assert tps["Logs", T0]["tps"] == pytest.approx(2.0)
    assert tps["Orders", T1]["tps"] == pytest.approx(1.0) and tps["Logs", T1]["tps"] == pytest.approx(0.5)
    assert tps["Orders", T2]["put_bytes"] == 600
    top = report.frames["top_topics"]
    assert list(top["topic"]) == ["Orders", "Logs"]
    orders = by(top, "topic")["Orders"]
    assert (orders["put_msgs"], orders["put_bytes"]) == (966, 96600)
    assert orders["avg_tps"] == pytest.approx(966 / 180) and orders["peak_tps"] == pytest.approx(15.0)


def test_groups_and_consumption(report):
    top = report.frames["top_groups"]
    assert list(top["group"]) == ["G1", "G2"]
    assert list(top["get_msgs"]) == [780, 150] and list(top["topics"]) == ["Orders", "Logs"]
    assert by(report.frames["group_tps"], "group", "ts")["G2", T1]["tps"] == pytest.approx(1.5)
    assert by(report.frames["consumption"], "group", "topic")["G1", "Orders"]["peak_tps"] == pytest.approx(13.0)


def test_lag_per_group_over_time(report):
    lag = by(report.frames["consumer_lag"], "group", "topic", "ts")
    assert (lag["G1", "Orders", T0]["lag"], lag["G1", "Orders", T0]["max_queue_lag"],
            lag["G1", "Orders", T0]["queues"]) == (170, 100, 3)
    assert lag["G1", "Orders", T1]["lag"] == 0 and lag["G1", "Orders", T2]["lag"] == 66
    summary = by(report.frames["lag_summary"], "group", "topic")["G1", "Orders"]
    assert (summary["latest_lag"], summary["peak_lag"], summary["latest_ts"]) == (66, 170, T2)


def test_a_slave_s_lag_counts_only_while_its_master_reports_nothing(spark, tmp_path):
    """broker-a's slave (brokerId 1) reports the same queues as its master, from copied offsets:
    at T0 the master's snapshot counts alone; at T1 only the slave reported (its master was down)."""
    slave = Broker("broker-a", 1, "127.0.0.1:11911")
    write_stats(tmp_path / "master", [StatsRecord(A, T0, lag={("G1", "Orders", 0): (1000, 900),
                                                                ("G1", "Orders", 1): (500, 480)})])
    write_stats(tmp_path / "slave", [StatsRecord(slave, T0, lag={("G1", "Orders", 0): (990, 850),
                                                                  ("G1", "Orders", 1): (500, 480)}),
                                     StatsRecord(slave, T1, lag={("G1", "Orders", 0): (1000, 930)})])
    r = run_report(spark, [str(tmp_path / "master"), str(tmp_path / "slave")], tmp_path / "out", progress=None)
    lag = by(r.frames["consumer_lag"], "group", "topic", "ts")
    assert (lag["G1", "Orders", T0]["lag"], lag["G1", "Orders", T0]["queues"]) == (120, 2)
    assert lag["G1", "Orders", T1]["lag"] == 70
    assert len(r.frames["broker_minutes"]) == 3          # the slave's minutes are its own


def test_latency_histograms_are_merged_not_averaged(report):
    lat = by(report.frames["latency"], "kind", "ts")
    send0 = lat["send", T0]  # merged {0.5: 2, 1: 6, 5: 2}, max 4.0
    assert send0["count"] == 10 and send0["max_ms"] == 4.0
    assert send0["p50_ms"] == pytest.approx(0.75)  # rank 5 in (0.5, 1]: 0.5 + 0.5 * 3/6
    assert send0["p90_ms"] == pytest.approx(3.75)  # rank 9 in (2.5, 5]: 2.5 + 2.5 * 1/2
    assert send0["p99_ms"] == pytest.approx(4.0)  # 4.875 capped at the max
    pull0 = lat["pull", T0]  # {0.1: 1, +inf: 1}, max 7000
    assert (pull0["count"], pull0["p50_ms"]) == (2, pytest.approx(0.1))
    assert pull0["p90_ms"] == pytest.approx(6600.0)  # rank 1.8 in (5000, 7000]
    send1 = lat["send", T1]  # {0.25: 10}, max 0.2
    assert send1["p50_ms"] == pytest.approx(0.175) and send1["p90_ms"] == pytest.approx(0.2)
    overall = by(report.frames["latency_overall"], "kind")["send"]  # {0.25: 10, 0.5: 2, 1: 6, 5: 2}
    assert overall["count"] == 20
    assert (overall["p50_ms"], overall["p90_ms"], overall["p99_ms"]) == \
        (pytest.approx(0.25), pytest.approx(1.0), pytest.approx(4.0))


def test_per_broker_load(report):
    load = by(report.frames["broker_load"], "broker")
    assert (load["broker-a"]["put_msgs"], load["broker-a"]["minutes"]) == (786, 3)
    assert (load["broker-b"]["put_msgs"], load["broker-b"]["get_msgs"], load["broker-b"]["minutes"]) == (330, 390, 2)
    assert load["broker-a"]["put_share_pct"] == pytest.approx(786 * 100 / 1116)
    assert load["broker-b"]["peak_put_tps"] == pytest.approx(5.0)
    assert len(report.frames["broker_minutes"]) == 5


def test_transactions_and_dead_letters(report):
    """Summed over brokers and minutes (broker-b's copied T1 record counts once)."""
    tx = by(report.frames["transactions"], "topic")
    assert (tx["Orders"]["commits"], tx["Orders"]["rollbacks"]) == (18, 3)
    assert tx["Orders"]["rollback_pct"] == pytest.approx(3 * 100 / 21)
    dead = by(report.frames["dead_letters"], "group", "topic")
    assert {k: (v["msgs"], v["last_ts"]) for k, v in dead.items()} == {("G1", "Orders"): (4, T1),
                                                                        ("G2", "Logs"): (2, T1)}
    assert "Transactions and dead letters" in (report.out / "index.html").read_text()


def test_bad_lines_are_counted_and_reported(report):
    s = report.summary
    assert s.bad == {REASON_NOT_JSON: 2, REASON_VERSION: 1, REASON_TYPES: 1, REASON_MISSING: 1}
    assert (s.lines, s.good, s.duplicates, s.used) == (11, 6, 1, 5)
    assert {why for _, why, _ in s.bad_examples} == set(s.bad)
    page = (report.out / "index.html").read_text()
    assert "Bad lines (skipped)" in page and "garbage, not json" in page and REASON_TYPES in page


def test_output_files(report):
    out = report.out
    for png in ("topic_tps", "top_topics", "top_groups", "group_tps", "consumer_lag", "latency", "broker_load"):
        assert (out / f"{png}.png").read_bytes()[:4] == b"\x89PNG", png
        assert f"{png}.png" in (out / "index.html").read_text()
    import pandas as pd

    for name in report.frames:
        csv = pd.read_csv(out / "tables" / f"{name}.csv")
        parquet = pd.read_parquet(out / "tables" / f"{name}.parquet")
        assert len(csv) == len(parquet) == len(report.frames[name]), name
    assert "time" in pd.read_parquet(out / "tables" / "topic_tps.parquet").columns


def test_time_range(spark, folders, tmp_path):
    r = run_report(spark, folders, tmp_path / "out", since_ms=T1, until_ms=T2 + 1)
    assert r.summary.out_of_range == 2 and r.summary.used == 3
    assert by(r.frames["top_topics"], "topic")["Orders"]["put_msgs"] == 66
    with pytest.raises(InputError, match="no record in the time range"):
        run_report(spark, folders, tmp_path / "none", since_ms=T2 + 1, until_ms=T2 + 2)


def test_all_bad_lines_is_an_empty_report(spark, tmp_path):
    write_stats(tmp_path / "s", [StatsRecord(A, T0)] + BAD_LINES)
    (tmp_path / "s" / file_name(T0)).write_text("\n".join(BAD_LINES) + "\n")
    with pytest.raises(InputError, match="none of the 4 lines is a usable stats record"):
        run_report(spark, [str(tmp_path / "s")], tmp_path / "out")
    assert main(["--stats", str(tmp_path / "s"), "--out", str(tmp_path / "out")]) == EXIT_EMPTY


def test_missing_or_empty_input_fails_before_spark(tmp_path, capsys):
    assert main(["--stats", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["--stats", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == EXIT_USAGE
    assert "no stats files" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--stats", str(tmp_path), "--out", str(tmp_path / "o"), "--since", "yesterday"])
    assert "neither epoch milliseconds nor ISO-8601" in capsys.readouterr().err


def test_files_outside_the_range_are_not_read(tmp_path):
    write_stats(tmp_path, [StatsRecord(A, T0), StatsRecord(A, T0 + 5 * 3_600_000)])
    found = find_stats_files([str(tmp_path)], since_ms=T0 + 4 * 3_600_000)
    assert [p.name for p in found.files] == [file_name(T0 + 5 * 3_600_000)] and found.skipped_by_time == 1


def test_store_folder_with_stats_inside(tmp_path):
    write_stats(tmp_path / "store" / "stats", [StatsRecord(A, T0)])
    assert find_stats_files([str(tmp_path / "store")]).folders == [tmp_path / "store" / "stats"]


def test_cli_main_writes_the_report(spark, folders, tmp_path, capsys):
    assert main(["--stats", *folders, "--out", str(tmp_path / "r"), "--since", "2026-11-18T00:00:00Z"]) == EXIT_OK
    captured = capsys.readouterr()
    assert "5 broker-minutes" in captured.out and "5 bad lines skipped" in captured.out
    assert "[report 5/5] writing index.html: done" in captured.err  # the progress lines
    assert (tmp_path / "r" / "index.html").exists()
    assert spark.range(3).count() == 3  # the shared session survived main()


def test_synthetic_day_matches_its_expected_totals(spark, tmp_path):
    expected = synthetic_stats(tmp_path / "s", brokers=2, topics=5, groups=3, minutes=90)
    r = run_report(spark, [str(tmp_path / "s" / "broker-a"), str(tmp_path / "s" / "broker-b")], tmp_path / "out")
    assert r.summary.used == expected.records == 180
    assert dict(zip(r.frames["top_topics"]["topic"], r.frames["top_topics"]["put_msgs"])) == expected.put_msgs
    assert dict(zip(r.frames["top_groups"]["group"], r.frames["top_groups"]["get_msgs"])) == expected.get_msgs
    assert dict(zip(r.frames["broker_load"]["broker"], r.frames["broker_load"]["put_msgs"])) == \
        expected.broker_put_msgs


def test_python_dash_m_fails_fast_on_missing_input(tmp_path):
    """The real command, in its own process: a missing folder is reported before any JVM starts
    (the benchmark smoke test runs a whole report in a fresh process)."""
    out = subprocess.run([sys.executable, "-m", "analytics.report", "--stats", str(tmp_path / "nope"), "--out",
                          str(tmp_path / "x")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == EXIT_USAGE and "does not exist" in out.stderr
