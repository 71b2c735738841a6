"""The report's charts draw what a young broker's stats hold: a 1-minute store's single point
(as a marker), a 5-minute store's line, under a time axis spanning those minutes with
minute labels; a range without traffic says "no data in this range" on the chart.

Checked on the Figures run_report saved (lines' data, axis limits, tick labels, texts)."""

from __future__ import annotations

import re

import pytest
from matplotlib.dates import num2date

from analytics.render import CHARTS, NO_DATA
from analytics.report import run_report
from analytics.stats_gen import Broker, StatsRecord, write_stats

pytestmark = pytest.mark.timeout(300)  # the first test pays for a cold JVM

A = Broker("broker-a", 0, "127.0.0.1:10911")
T = 1_796_565_780_000  # 2026-12-06T14:03:00Z, a broker's first minute
MINUTE = 60_000
BUSY, IDLE = 5, 2  # minutes with traffic, then minutes without


def minute(i: int) -> StatsRecord:
    """Minute i of a broker that starts serving: Orders and Logs put, G1 pulls Orders; idle
    after BUSY minutes (no puts, pulls or requests; the lag snapshot goes on)."""
    ts = T + i * MINUTE
    if i >= BUSY:
        return StatsRecord(A, ts, lag={("G1", "Orders", 0): (600 * BUSY, 600 * BUSY)})
    return StatsRecord(A, ts, topics={"Orders": (120 * (i + 1), 12_000 * (i + 1)), "Logs": (30, 3000)},
                       groups={("G1", "Orders"): (60 * (i + 1), 6000 * (i + 1))},
                       send={0.5: 50, 2.5: 10}, send_max_ms=2.0, pull={0.25: 20}, pull_max_ms=0.2,
                       lag={("G1", "Orders", 0): (120 * (i + 1), 60 * (i + 1))}, mqtt=mqtt(i))


def mqtt(i: int) -> dict:
    """The MQTT actors' minute i (docs/STATS.md): devices publish 60 QoS 1 and 30 QoS 0 messages a minute
    more each minute, twice that goes out; 10 + i devices connected, 12 + i sessions."""
    return {"connections": 10 + i, "sessions": 12 + i, "subscriptions": 20, "retained": 1, "connects": 1,
            "dropped": i, "bad_packets": 0, "auth_failures": 0,
            "messages_in": [30 * (i + 1), 60 * (i + 1), 0], "messages_out": [60 * (i + 1), 120 * (i + 1), 0]}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Store folders whose stats/ hold a 1-minute broker's file and a 5-minute broker's (and its
    idle minutes), written in the broker's format (docs/STATS.md)."""
    root = tmp_path_factory.mktemp("young")
    write_stats(root / "one" / "stats", [minute(0)])
    write_stats(root / "five" / "stats", [minute(i) for i in range(BUSY + IDLE)])
    return root


@pytest.fixture(scope="module")
def one_minute(spark, stores):
    return run_report(spark, [str(stores / "one")], stores / "out-one")


@pytest.fixture(scope="module")
def five_minutes(spark, stores):
    return run_report(spark, [str(stores / "five")], stores / "out-five", until_ms=T + BUSY * MINUTE)


@pytest.fixture(scope="module")
def empty_range(spark, stores):
    return run_report(spark, [str(stores / "five")], stores / "out-empty", since_ms=T + BUSY * MINUTE)


def ms(x: float) -> int:
    return round(num2date(x).timestamp() * 1000)


def drawn(ax) -> dict[str, list[tuple[int, float]]]:
    """label -> [(epoch ms, y)] of every line on the axes; every line marks its points."""
    lines = {}
    for line in ax.get_lines():
        assert line.get_marker() == "o" and line.get_markersize() > 0, line.get_label()
        lines[line.get_label()] = [(ms(x), round(float(y), 9)) for x, y in line.get_xydata()]
    return lines


def x_range(ax) -> tuple[int, int]:
    lo, hi = ax.get_xlim()
    return ms(lo), ms(hi)


def tick_labels(ax) -> tuple[list[str], str]:
    formatter = ax.xaxis.get_major_formatter()
    labels = formatter.format_ticks(ax.xaxis.get_majorticklocs())
    return labels, formatter.get_offset()


def notes(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def assert_minute_axis(ax, first: int, last: int) -> None:
    """x spans the minutes first..last and a little more (a lone point: one window each side),
    ticks labelled HH:MM[:SS] with the date beside them, not years."""
    lo, hi = x_range(ax)
    assert first - MINUTE <= lo < first and last < hi <= last + MINUTE, (lo, hi)
    labels, offset = tick_labels(ax)
    assert len(labels) >= 2 and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", s) for s in labels), labels
    assert offset == "2026-12-06"


def test_every_chart_is_drawn_and_shown(one_minute, empty_range):
    for report in (one_minute, empty_range):
        assert set(report.charts) == set(CHARTS)
        page = (report.out / "index.html").read_text()
        for name in CHARTS:
            assert (report.out / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
            assert f"<img src='{name}.png'" in page, name


def test_one_minute_store_draws_its_single_point(one_minute):
    c = one_minute.charts
    topic = c["topic_tps"].axes[0]
    assert drawn(topic) == {"Orders": [(T, 2.0)], "Logs": [(T, 0.5)]}
    assert_minute_axis(topic, T, T)
    assert x_range(topic) == (T - MINUTE, T + MINUTE)  # a lone point: one window each side
    assert topic.get_ylim()[0] <= 0 < 2.0 < topic.get_ylim()[1]  # rates seen from 0
    assert drawn(c["group_tps"].axes[0]) == {"G1": [(T, 1.0)]}
    assert drawn(c["consumer_lag"].axes[0]) == {"G1": [(T, 60)]}
    send, pull = c["latency"].axes
    send_lines, pull_lines = drawn(send), drawn(pull)
    assert set(send_lines) == set(pull_lines) == {"p50_ms", "p90_ms", "p99_ms"}
    assert [p[0] for p in send_lines["p50_ms"]] == [T] and 0.25 < send_lines["p50_ms"][0][1] <= 0.5
    assert 0 < pull_lines["p99_ms"][0][1] <= 0.2 and send.get_yscale() == "log"
    assert_minute_axis(pull, T, T)
    put, get = c["broker_load"].axes
    assert drawn(put) == {"broker-a": [(T, 2.5)]} and drawn(get) == {"broker-a": [(T, 1.0)]}
    assert_minute_axis(get, T, T)
    bars = c["top_topics"].axes[0]
    assert [(t.get_text(), p.get_width()) for t, p in zip(bars.get_yticklabels(), bars.patches)] == \
        [("Logs", 30), ("Orders", 120)]
    assert [p.get_width() for p in c["top_groups"].axes[0].patches] == [60]
    traffic, devices = c["mqtt"].axes
    assert drawn(traffic) == {"in_tps": [(T, 1.5)], "out_tps": [(T, 3.0)]}
    assert drawn(devices) == {"connections": [(T, 10)], "sessions": [(T, 12)]}
    assert_minute_axis(devices, T, T)
    [row] = one_minute.frames["mqtt"].drop(columns="time").to_dict("records")     # time: the CSV's twin of ts
    assert row == {
        "ts": T, "msgs_in": 90, "msgs_out": 180, "in_tps": 1.5, "out_tps": 3.0, "in_qos0": 30, "in_qos1": 60,
        "in_qos2": 0, "out_qos0": 60, "out_qos1": 120, "out_qos2": 0, "connections": 10, "sessions": 12,
        "subscriptions": 20, "dropped": 0}
    assert "<h2>MQTT devices</h2>" in (one_minute.out / "index.html").read_text()
    assert not any(notes(ax) for fig in c.values() for ax in fig.axes)


def test_five_minute_store_draws_its_lines(five_minutes):
    c = five_minutes.charts
    stamps = [T + i * MINUTE for i in range(BUSY)]
    topic = c["topic_tps"].axes[0]
    assert drawn(topic) == {"Orders": [(ts, 2.0 * (i + 1)) for i, ts in enumerate(stamps)],
                            "Logs": [(ts, 0.5) for ts in stamps]}
    assert_minute_axis(topic, stamps[0], stamps[-1])
    assert drawn(c["group_tps"].axes[0]) == {"G1": [(ts, 1.0 * (i + 1)) for i, ts in enumerate(stamps)]}
    assert drawn(c["consumer_lag"].axes[0]) == {"G1": [(ts, 60 * (i + 1)) for i, ts in enumerate(stamps)]}
    for ax in c["latency"].axes:
        assert {k: [p[0] for p in v] for k, v in drawn(ax).items()} == {q: stamps for q in ("p50_ms", "p90_ms",
                                                                                          "p99_ms")}
    assert_minute_axis(c["latency"].axes[1], stamps[0], stamps[-1])
    put = c["broker_load"].axes[0]
    assert drawn(put) == {"broker-a": [(ts, 2.0 * (i + 1) + 0.5) for i, ts in enumerate(stamps)]}
    assert drawn(c["mqtt"].axes[0]) == {"in_tps": [(ts, 1.5 * (i + 1)) for i, ts in enumerate(stamps)],
                                        "out_tps": [(ts, 3.0 * (i + 1)) for i, ts in enumerate(stamps)]}
    assert list(five_minutes.frames["mqtt"]["dropped"]) == list(range(BUSY))
    assert not any(notes(ax) for fig in c.values() for ax in fig.axes)


def test_a_range_without_traffic_says_so_on_its_charts(empty_range):
    """The idle minutes: nothing put, pulled or requested; lag and broker load are still data."""
    c = empty_range.charts
    first, last = T + BUSY * MINUTE, T + (BUSY + IDLE - 1) * MINUTE
    for name in ("topic_tps", "group_tps", "top_topics", "top_groups", "latency", "mqtt"):     # no MQTT object
        for ax in c[name].axes:
            assert notes(ax) == [NO_DATA] and not ax.get_lines() and not ax.patches, name
    assert_minute_axis(c["topic_tps"].axes[0], first, last)   # the report's range, shown empty
    assert_minute_axis(c["latency"].axes[1], first, last)
    assert drawn(c["consumer_lag"].axes[0]) == {"G1": [(first, 0), (last, 0)]}
    put, get = c["broker_load"].axes
    assert drawn(put) == {"broker-a": [(first, 0.0), (last, 0.0)]} == drawn(get)
    assert not notes(put) and not notes(c["consumer_lag"].axes[0])

