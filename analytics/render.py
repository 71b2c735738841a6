"""The report's files: PNG plots (matplotlib, Agg), tables as CSV and Parquet, and index.html.

Everything here works on small pandas frames collected from Spark on the driver, so the
output folder is a plain local folder even when the job ran on a cluster.
"""

from __future__ import annotations

import html
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any  # Any: pandas frames (pandas ships no types)

from analytics.stats_tables import TimeRange
from analytics.timespec import format_time

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger("smartgo.analytics.render")

CHARTS = ("topic_tps", "group_tps", "consumer_lag", "top_topics", "top_groups", "latency", "broker_load", "mqtt")
TOP_LINES = 10  # series per time plot (the rest is summed as "other" where that makes sense)
TOP_BARS = 20
SHORT_SERIES = 60  # points up to which a line also marks each point
NO_DATA = "no data in this range"
# Tick labels per scale (years, months, days, hours, minutes, seconds) and the date beside them.
DATE_FORMATS = ["%Y", "%Y-%m", "%m-%d", "%H:%M", "%H:%M", "%H:%M:%S"]
DATE_OFFSETS = ["", "%Y", "%Y-%m", "%Y-%m-%d", "%Y-%m-%d", "%Y-%m-%d"]
HTML_ROWS = 25


@dataclass(slots=True)
class Section:
    title: str
    text: str
    chart: str  # name in CHARTS, shown as <chart>.png ("": a section of tables only)
    tables: list[str] = field(default_factory=list)  # table names shown (head) and linked


def write_tables(out: Path, frames: Mapping[str, Any]) -> None:
    """tables/<name>.csv and tables/<name>.parquet; a ``ts`` column gets a UTC ``time`` twin."""
    import pandas as pd

    folder = out / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        if "ts" in frame.columns:
            frame.insert(frame.columns.get_loc("ts") + 1, "time", pd.to_datetime(frame["ts"], unit="ms", utc=True))
        frame.to_csv(folder / f"{name}.csv", index=False)
        frame.to_parquet(folder / f"{name}.parquet", index=False)


# ----------------------------------------------------------------------------- plots

def _figure(rows: int = 1):
    """A Figure outside pyplot (no global state to close); Agg draws it on savefig."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.6 * rows))
    axes = fig.subplots(rows, 1, squeeze=False, sharex=rows > 1)
    return fig, [a[0] for a in axes]


def _days(ts):
    """Epoch ms to matplotlib date numbers (days), the x values of every time plot."""
    import numpy as np
    from matplotlib.dates import date2num

    return date2num(np.asarray(ts, dtype="int64").astype("datetime64[ms]"))


def _style(points: int) -> dict:
    """A line of one point draws nothing: short series get markers."""
    return {"linewidth": 1, "marker": "o", "markersize": 3} if points <= SHORT_SERIES else {"linewidth": 1}


def _no_data(ax) -> None:
    ax.text(0.5, 0.5, NO_DATA, transform=ax.transAxes, ha="center", va="center", color="grey", fontsize=12)
    ax.set_yticks([])


def _time_axis(ax, ts, period: TimeRange) -> None:
    """x spans the plotted minutes (the report's range when there are none), padded so the
    end markers show (a lone point by one window each side), labelled at the scale of that
    span: seconds, minutes, hours or days, in UTC."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    first, last = (int(min(ts)), int(max(ts))) if len(ts) else (period.first_ts, period.last_ts)
    pad = max((last - first) * 0.03, 1000 * period.window_s / 2) if last > first else 1000 * period.window_s
    ax.set_xlim(*_days([first - pad, last + pad]))
    locator = AutoDateLocator(tz=timezone.utc, minticks=3, maxticks=9)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator, tz=timezone.utc, formats=DATE_FORMATS,
                                                      zero_formats=[""] + DATE_FORMATS[:-1],
                                                      offset_formats=DATE_OFFSETS))
    ax.set_xlabel("time (UTC)")


def _time_lines(ax, frame, key: str, value: str, order: list, other: bool) -> None:
    """One line per key in order (top first), the rest summed as 'other'."""
    if frame.empty:
        _no_data(ax)
        return
    pivot = frame.pivot_table(index="ts", columns=key, values=value, aggfunc="sum").fillna(0.0)
    x, style = _days(pivot.index), _style(len(pivot))
    shown = [k for k in order if k in pivot.columns][:TOP_LINES]
    for k in shown:
        ax.plot(x, pivot[k], label=str(k), **style)
    rest = [c for c in pivot.columns if c not in shown]
    if other and rest:
        ax.plot(x, pivot[rest].sum(axis=1), label=f"other ({len(rest)})", color="grey", **style)
    top = ax.get_ylim()[1] if pivot.to_numpy().max() > 0 else 1
    ax.set_ylim(-0.03 * top, top)  # rates and counts from 0, a line at 0 just above the axis
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    ax.grid(alpha=0.3)


def _decades(ax) -> float:
    """Decades a log y axis spans: within one, its minor ticks are labelled too."""
    lo, hi = ax.get_ylim()
    return math.log10(hi / lo)


def _latency_lines(ax, part) -> None:
    """p50/p90/p99 over the minutes that had requests (an idle minute has no percentiles)."""
    from matplotlib.ticker import FuncFormatter

    for q in ("p50_ms", "p90_ms", "p99_ms"):
        points = part[part[q] > 0]
        if not points.empty:
            ax.plot(_days(points["ts"]), points[q], label=q, **_style(len(points)))
    if not ax.get_lines():
        _no_data(ax)
        return
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 0.2 rather than 2x10^-1
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if _decades(ax) < 1 else ""))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=7)


def _bars(ax, frame, key: str, value: str) -> None:
    if frame.empty:
        _no_data(ax)
        ax.set_xticks([])
        return
    head = frame.head(TOP_BARS).iloc[::-1]
    ax.barh(head[key].astype(str), head[value])
    ax.grid(alpha=0.3, axis="x")


def charts(f: Mapping[str, Any], period: TimeRange) -> dict[str, Figure]:
    """Every chart the report shows, by name (CHARTS); an empty one says so on the chart."""
    figures: dict[str, Figure] = {}
    top_topics = list(f["top_topics"]["topic"])
    top_groups = list(f["top_groups"]["group"])

    def timed(key, frame, series, value, order, title, ylabel):
        fig, (ax,) = _figure()
        _time_lines(ax, frame, series, value, order, other=False)  # 'other' would dwarf them
        _time_axis(ax, frame["ts"], period)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        figures[key] = fig

    timed("topic_tps", f["topic_tps"], "topic", "tps", top_topics, f"Put TPS, top {TOP_LINES} topics", "messages/s")
    timed("group_tps", f["group_tps"], "group", "tps", top_groups, f"Pull TPS, top {TOP_LINES} consumer groups",
          "messages/s")
    lag = f["consumer_lag"]
    lag_order = list(f["lag_summary"].groupby("group")["peak_lag"].max().sort_values(ascending=False).index)
    timed("consumer_lag", lag, "group", "lag", lag_order,
          f"Consumer lag, top {TOP_LINES} groups by peak (all queues and brokers)", "messages behind")

    for key, frame, col, value, title in (("top_topics", f["top_topics"], "topic", "put_msgs", "Top topics (put)"),
                                          ("top_groups", f["top_groups"], "group", "get_msgs", "Top groups (pull)")):
        fig, (ax,) = _figure()
        _bars(ax, frame, col, value)
        ax.set_title(title)
        ax.set_xlabel("messages")
        figures[key] = fig

    latency = f["latency"]
    fig, axes = _figure(2)
    for ax, kind in zip(axes, ("send", "pull")):
        _latency_lines(ax, latency[latency["kind"] == kind])
        ax.set_title(f"{kind} latency (histograms merged across brokers)")
        ax.set_ylabel("ms")
    _time_axis(axes[-1], latency.loc[latency["count"] > 0, "ts"], period)
    figures["latency"] = fig

    minutes = f["broker_minutes"].copy()
    minutes["label"] = minutes["broker"] + minutes["broker_id"].map(lambda i: f"#{i}" if i else "")
    order = list(minutes.groupby("label")["put_msgs"].sum().sort_values(ascending=False).index)
    fig, axes = _figure(2)
    for ax, value, title in zip(axes, ("put_tps", "get_tps"), ("put TPS per broker", "pull TPS per broker")):
        _time_lines(ax, minutes, "label", value, order, other=True)
        ax.set_title(title)
        ax.set_ylabel("messages/s")
    _time_axis(axes[-1], minutes["ts"], period)
    figures["broker_load"] = fig
    figures["mqtt"] = _mqtt_chart(f["mqtt"], period)
    return figures


def _mqtt_chart(frame, period: TimeRange):
    """PUBLISH packets from and to devices per second; connections and sessions (all brokers)."""
    long = frame.melt(id_vars=["ts"], value_vars=["in_tps", "out_tps", "connections", "sessions"])
    fig, axes = _figure(2)
    for ax, names, title, ylabel in ((axes[0], ["in_tps", "out_tps"], "MQTT messages in (from devices) and out "
                                      "(to devices)", "messages/s"),
                                     (axes[1], ["connections", "sessions"], "MQTT connections and sessions at each "
                                      "minute's end", "")):
        _time_lines(ax, long[long["variable"].isin(names)], "variable", "value", names, other=False)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
    _time_axis(axes[-1], frame["ts"], period)
    return fig


def plot_all(out: Path, f: Mapping[str, Any], period: TimeRange) -> dict[str, Figure]:
    """<out>/<name>.png for every chart; the drawn Figures by name."""
    figures = charts(f, period)
    for name, fig in figures.items():
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=90)
    return figures


# ----------------------------------------------------------------------------- HTML

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}
.bad{color:#a00}.note{color:#666;font-size:.85em}img{max-width:100%}
code{background:#f4f4f4;padding:0 3px}
"""


def _kv_table(rows: Sequence[tuple[str, object]]) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _frame_html(frame, name: str) -> str:
    shown = frame.head(HTML_ROWS)
    table = shown.to_html(index=False, border=0, escape=True, float_format=lambda x: f"{x:,.2f}", na_rep="")
    more = f"first {HTML_ROWS} of {len(frame):,} rows; " if len(frame) > HTML_ROWS else ""
    return (f"{table}<p class='note'>{more}all rows: <a href='tables/{name}.csv'>{name}.csv</a>, "
            f"<a href='tables/{name}.parquet'>{name}.parquet</a></p>")


def write_html(out: Path, summary, time_range, frames: Mapping[str, Any], generated: str) -> Path:
    sections = [
        Section("Put TPS per topic over time", "Messages stored per second, summed over brokers; the top "
                f"{TOP_LINES} topics by volume (every topic in topic_tps).", "topic_tps", ["top_topics"]),
        Section("Top topics", "By messages stored in the range.", "top_topics", []),
        Section("Top consumer groups", "By messages pulled in the range; per group and topic in consumption.",
                "top_groups", ["top_groups", "consumption"]),
        Section("Pull TPS per group over time", "", "group_tps", []),
        Section("Consumer lag per group over time", "Sum over queues and brokers of (queue max offset - "
                "committed offset), as each broker snapshotted it at the end of the minute.",
                "consumer_lag", ["lag_summary"]),
        Section("Send and pull latency percentiles", "Server-side latency: per minute, the brokers' histograms "
                "are added and p50/p90/p99 read off the merged histogram (never averaged).",
                "latency", ["latency_overall"]),
        Section("Per-broker load", "", "broker_load", ["broker_load"]),
        Section("MQTT devices", "PUBLISH packets from devices (in) and to devices (out) per second, summed over "
                "the brokers' MQTT actors; connections and sessions as each broker had them at the minute's end. "
                "Per QoS in the table.", "mqtt", ["mqtt"]),
        Section("Transactions and dead letters", "Transactions committed and rolled back per topic; messages "
                "each consumer group sent to its dead-letter queue, per original topic.", "",
                ["transactions", "dead_letters"]),
    ]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>SmartGo traffic report</title>"
             f"<style>{_STYLE}</style></head><body><h1>SmartGo traffic report</h1>"]
    rows = [("time range", f"{format_time(time_range.first_ts)} .. {format_time(time_range.last_ts)} "
                           f"({time_range.minutes:,} minutes with data)"),
            ("stats folders", ", ".join(summary.folders)),
            ("files read", f"{summary.files:,}" + (f" ({summary.files_skipped_by_time} outside the time range "
                                                    "not read)" if summary.files_skipped_by_time else "")),
            ("lines", f"{summary.lines:,}"), ("good lines", f"{summary.good:,}"),
            ("bad lines", f"{summary.bad_total:,}"),
            ("outside --since/--until", f"{summary.out_of_range:,}"),
            ("duplicate broker-minutes", f"{summary.duplicates:,}"),
            ("records used", f"{summary.used:,}"), ("generated", generated)]
    parts.append("<h2>Input</h2>" + _kv_table(rows))
    if summary.bad:
        parts.append("<h2 class='bad'>Bad lines (skipped)</h2>" + _kv_table(list(summary.bad.items())))
        example_rows = "".join(
            f"<tr><td>{html.escape(f)}</td><td>{html.escape(r)}</td><td><code>{html.escape(e or '')}</code></td></tr>"
            for f, r, e in summary.bad_examples)
        parts.append(f"<table><tr><th>file</th><th>reason</th><th>line (start)</th></tr>{example_rows}</table>")
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        if s.text:
            parts.append(f"<p class='note'>{html.escape(s.text)}</p>")
        if s.chart:
            parts.append(f"<img src='{html.escape(s.chart)}.png' alt='{html.escape(s.title)}'>")
        for name in s.tables:
            parts.append(_frame_html(frames[name], name))
    links = ", ".join(f"<a href='tables/{n}.csv'>{n}</a>" for n in frames)
    parts.append(f"<h2>All tables</h2><p>{links} (also as .parquet)</p></body></html>")
    path = out / "index.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
