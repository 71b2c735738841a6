"""The backlog benchmark's --quick run: every scenario's figures, and a second run on the same
--store that reuses the fill instead of filling again, with the catch-up's master/slave variant
(--slave-read-enable), then removes the store (--clean)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support.waits import run_benchmark

SCENARIOS = {"write_rate", "write_p99", "rss", "restart", "kill", "syncflush", "catchup_consumer",
             "catchup_producer", "query", "cleanup"}


@pytest.fixture
def short_tmp():
    """The benchmark's TMPDIR, short: its nodes' fork server puts a socket there, whose path must
    fit AF_UNIX's 108 bytes (a folder under pytest's basetemp in CI does not)."""
    tmp = Path(tempfile.mkdtemp(prefix="bbl-", dir="/tmp"))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.timeout(900)
def test_bench_backlog_quick_then_reused(tmp_path, short_tmp):
    store = tmp_path / "backlog"
    tmp = short_tmp
    r = run_benchmark("bench_backlog.py", "--store", str(store), timeout=280, tmpdir=tmp)
    assert (r["quick"], r["reused_store"], r["kept_store"], r["unclean_stops"]) == (True, False, str(store), 0)
    assert r["wide"] == {"queues": 10_000, "topics": 1}                 # a new store: one topic of 10,000 queues
    assert r["fill"]["refilled"] and r["fill"]["added"] >= r["messages"] == 200_000 and r["fill"]["errors"] == 0
    w = r["write"]
    assert len(w["tenths"]) == 10 and all(t["msgs_s"] > 0 and t["p99_ms"] > 0 for t in w["tenths"])
    assert w["first_10pct"]["msgs"] >= 20_000 and w["last_10pct"]["msgs_s"] > 0 and w["empty_p99_ms"] > 0
    assert w["rate_ratio"] > 0 and w["p99_ratio"] > 0
    assert 0 < sum(t["rollovers"] for t in w["tenths"]) <= r["commitlog_files"]  # each new file once
    assert 100 < r["rss"]["max_mb"] < 4000 and {"fill", "catchup", "cleanup"} <= set(r["rss"]["by_phase_mb"])
    assert all(a["rss"] >= a["anon"] > 0 for a in r["rss"]["per_actor_mb"].values())
    assert 0 < r["restart"]["served_s"] < 120 and 0 < r["coldrestart"]["served_s"] < 300
    assert "cache_dropped" in r["coldrestart"]
    assert 0 < r["kill"]["served_s"] < 120
    assert r["syncflush"]["acked"] >= 500 and r["syncflush"]["lost"] == 0 and r["syncflush"]["served_s"] > 0
    c = r["catchup"]
    assert c["consumer"]["msgs"] > 0 and c["consumer"]["errors"] == 0 and c["producer"]["msgs_s"] > 0
    assert c["producer"]["p99_ms"] > 0 and c["producer_empty_store"]["p99_ms"] > 0 and "cache_dropped" in c
    q = r["query"]
    assert q["queries"] >= 5 and q["by_key"]["found"] == q["by_time"]["in_range"] == q["queries"]
    assert 0 < q["by_key"]["p50_ms"] <= q["by_key"]["max_ms"] and q["by_time"]["max_ms"] > 0
    cl = r["cleanup"]
    assert cl["at_75pct"]["deleted_mb"] > 0 and cl["at_85pct"]["deleted_mb"] > 0 and cl["max_send_gap_ms"] > 0
    assert cl["at_90pct"]["refused_sends"] > 0 and cl["at_90pct"]["accepted_again_s"] > 0
    assert set(r["pass"]) == SCENARIOS
    again = run_benchmark("bench_backlog.py", "--store", str(store), "--only", "write,query,catchup",
                          "--slave-read-enable", "--clean", timeout=280, tmpdir=tmp)
    assert again["reused_store"] and again["fill"] == {"refilled": False, "messages_before": again["fill"][
        "messages_before"], "added": 0} and again["fill"]["messages_before"] >= 200_000
    assert again["write"]["tenths"] == w["tenths"]                  # the first run's figures, kept in fill.json
    assert again["query"]["by_key"]["found"] == again["query"]["queries"] > 0
    # the master/slave variant: every record counts as old (ratio 0), so the group reads at the slave
    s = again["catchup_slave"]
    assert s["slave_read_enable"] and s["access_message_in_memory_max_ratio"] == 0 and s["replicated_gb"] > 0
    assert s["consumer"]["errors"] == 0 and s["consumer"]["at_slave"]["msgs"] > s["consumer"]["msgs"] // 2 > 0
    assert s["producer"]["msgs_s"] > 0 and s["producer_empty_store"] == again["catchup"]["producer_empty_store"]
    assert "at_slave" not in again["catchup"]["consumer"] and s["slave_max_rss_mb"] > 100
    assert {"catchup_slave_consumer", "catchup_slave_producer"} <= set(again["pass"])
    assert again["kept_store"] is None and not store.exists() and not any(tmp.iterdir())
