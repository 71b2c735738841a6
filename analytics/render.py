"""The report's files: PNG plots (matplotlib, Agg), tables as CSV and Parquet, and index.html.

Everything here works on small pandas frames collected from Spark on the driver, so the
output folder is a plain local folder even when the job ran on a cluster.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path

from analytics.timespec import format_time

log = logging.getLogger("smartgo.analytics.render")

TOP_LINES = 10  # series per time plot (the rest is summed as "other" where that makes sense)
TOP_BARS = 20
HTML_ROWS = 25


@dataclass(slots=True)
class Section:
    title: str
    text: str
    plot: str | None  # PNG file name (None: no data to plot; "": a section of tables only)
    tables: list[str] = field(default_factory=list)  # table names shown (head) and linked


def write_tables(out: Path, frames: Mapping[str, object]) -> None:
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
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, 1, figsize=(11, 3.6 * rows), squeeze=False, sharex=rows > 1)
    return plt, fig, [a[0] for a in axes]


def _save(plt, fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def _time_lines(ax, frame, key: str, value: str, order: list, other: bool) -> None:
    """One line per key in order (top first), the rest summed as 'other'."""
    from matplotlib.dates import DateFormatter

    if frame.empty:
        return
    pivot = frame.pivot_table(index="time", columns=key, values=value, aggfunc="sum").fillna(0.0)
    shown = [k for k in order if k in pivot.columns][:TOP_LINES]
    for k in shown:
        ax.plot(pivot.index, pivot[k], label=str(k), linewidth=1)
    rest = [c for c in pivot.columns if c not in shown]
    if other and rest:
        ax.plot(pivot.index, pivot[rest].sum(axis=1), label=f"other ({len(rest)})", linewidth=1, color="grey")
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_formatter(DateFormatter("%m-%d %H:%M", tz=timezone.utc))


def _bars(ax, frame, key: str, value: str) -> None:
    head = frame.head(TOP_BARS).iloc[::-1]
    ax.barh(head[key].astype(str), head[value])
    ax.grid(alpha=0.3, axis="x")


def _with_time(frame):
    import pandas as pd

    frame = frame.copy()
    frame["time"] = pd.to_datetime(frame["ts"], unit="ms", utc=True)
    return frame


def plot_all(out: Path, f: Mapping[str, object]) -> dict[str, str | None]:
    """Every plot the report shows: section key -> PNG name (None when there is no data)."""
    plots: dict[str, str | None] = {}
    top_topics = list(f["top_topics"]["topic"])
    top_groups = list(f["top_groups"]["group"])

    def timed(key, frame, series, value, order, title, ylabel):
        if frame.empty:
            plots[key] = None
            return
        plt, fig, (ax,) = _figure()
        _time_lines(ax, _with_time(frame), series, value, order, other=False)  # 'other' would dwarf them
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        plots[key] = _save(plt, fig, out / f"{key}.png")

    timed("topic_tps", f["topic_tps"], "topic", "tps", top_topics, f"Put TPS, top {TOP_LINES} topics", "messages/s")
    timed("group_tps", f["group_tps"], "group", "tps", top_groups, f"Pull TPS, top {TOP_LINES} consumer groups",
          "messages/s")
    lag = f["consumer_lag"]
    lag_order = list(f["lag_summary"].groupby("group")["peak_lag"].max().sort_values(ascending=False).index)
    timed("consumer_lag", lag, "group", "lag", lag_order,
          f"Consumer lag, top {TOP_LINES} groups by peak (all queues and brokers)", "messages behind")

    for key, frame, col, value, title in (("top_topics", f["top_topics"], "topic", "put_msgs", "Top topics (put)"),
                                          ("top_groups", f["top_groups"], "group", "get_msgs", "Top groups (pull)")):
        if frame.empty:
            plots[key] = None
            continue
        plt, fig, (ax,) = _figure()
        _bars(ax, frame, col, value)
        ax.set_title(title)
        ax.set_xlabel("messages")
        plots[key] = _save(plt, fig, out / f"{key}.png")

    latency = f["latency"]
    if latency.empty:
        plots["latency"] = None
    else:
        latency = _with_time(latency)
        plt, fig, axes = _figure(2)
        for ax, kind in zip(axes, ("send", "pull")):
            part = latency[latency["kind"] == kind]
            for q in ("p50_ms", "p90_ms", "p99_ms"):
                ax.plot(part["time"], part[q], label=q, linewidth=1)
            ax.set_title(f"{kind} latency (histograms merged across brokers)")
            ax.set_ylabel("ms")
            ax.set_yscale("log", nonpositive="mask")
            ax.grid(alpha=0.3)
            ax.legend(loc="upper left", fontsize=7)
        plots["latency"] = _save(plt, fig, out / "latency.png")

    minutes = f["broker_minutes"]
    if minutes.empty:
        plots["broker_load"] = None
    else:
        minutes = _with_time(minutes)
        minutes["label"] = minutes["broker"] + minutes["broker_id"].map(lambda i: f"#{i}" if i else "")
        order = list(minutes.groupby("label")["put_msgs"].sum().sort_values(ascending=False).index)
        plt, fig, axes = _figure(2)
        for ax, value, title in zip(axes, ("put_tps", "get_tps"), ("put TPS per broker", "pull TPS per broker")):
            _time_lines(ax, minutes, "label", value, order, other=True)
            ax.set_title(title)
            ax.set_ylabel("messages/s")
        plots["broker_load"] = _save(plt, fig, out / "broker_load.png")
    return plots


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


def _kv_table(rows: list[tuple[str, object]]) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _frame_html(frame, name: str) -> str:
    shown = frame.head(HTML_ROWS)
    table = shown.to_html(index=False, border=0, escape=True, float_format=lambda x: f"{x:,.2f}", na_rep="")
    more = f"first {HTML_ROWS} of {len(frame):,} rows; " if len(frame) > HTML_ROWS else ""
    return (f"{table}<p class='note'>{more}all rows: <a href='tables/{name}.csv'>{name}.csv</a>, "
            f"<a href='tables/{name}.parquet'>{name}.parquet</a></p>")


def write_html(out: Path, summary, time_range, plots: Mapping[str, str | None], frames: Mapping[str, object],
               generated: str) -> Path:
    sections = [
        Section("Put TPS per topic over time", "Messages stored per second, summed over brokers; the top "
                f"{TOP_LINES} topics by volume (every topic in topic_tps).", plots.get("topic_tps"), ["top_topics"]),
        Section("Top topics", "By messages stored in the range.", plots.get("top_topics"), []),
        Section("Top consumer groups", "By messages pulled in the range; per group and topic in consumption.",
                plots.get("top_groups"), ["top_groups", "consumption"]),
        Section("Pull TPS per group over time", "", plots.get("group_tps"), []),
        Section("Consumer lag per group over time", "Sum over queues and brokers of (queue max offset - "
                "committed offset), as each broker snapshotted it at the end of the minute.",
                plots.get("consumer_lag"), ["lag_summary"]),
        Section("Send and pull latency percentiles", "Server-side latency: per minute, the brokers' histograms "
                "are added and p50/p90/p99 read off the merged histogram (never averaged).",
                plots.get("latency"), ["latency_overall"]),
        Section("Per-broker load", "", plots.get("broker_load"), ["broker_load"]),
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
        if s.plot != "":
            parts.append(f"<img src='{html.escape(s.plot)}' alt='{html.escape(s.title)}'>" if s.plot
                         else "<p class='note'>no data in the range</p>")
        for name in s.tables:
            parts.append(_frame_html(frames[name], name))
    links = ", ".join(f"<a href='tables/{n}.csv'>{n}</a>" for n in frames)
    parts.append(f"<h2>All tables</h2><p>{links} (also as .parquet)</p></body></html>")
    path = out / "index.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
