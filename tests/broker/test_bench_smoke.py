"""The broker benchmark's --quick run works end to end and reports every figure it promises."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(180)
def test_bench_broker_quick():
    # net actors and producers poll; the 16 sync producers share 4 connections
    r = run_benchmark("bench_broker.py", "--busy-poll-us", "100", "--sync-connections", "4", timeout=170)
    assert r["quick"] is True
    for scenario in ("batch", "sync", "pull", "wake"):
        assert r[scenario]["errors" if scenario != "wake" else "samples"] == (0 if scenario != "wake" else 30), r
    assert r["batch"]["msgs_s"] > 0 and r["sync"]["msgs_s"] > 0 and r["sync"]["p99_ms"] > 0
    assert r["sync_connections"] == 4 and r["sync"]["connections"] == 4
    assert r["pull"]["msgs"] == 20_000                     # the whole backlog came back
    assert 0 < r["wake"]["p50_ms"] <= r["wake"]["p99_ms"]
    assert set(r["pass"]) >= {"batch_msgs_s", "sync_msgs_s", "pull_msgs_s", "wake_p99_ms"}
    assert all(r[s]["host_probe_ms"] > 0 for s in ("batch", "sync", "pull", "wake")), r   # sampled during each run


@pytest.mark.timeout(120)
def test_bench_broker_raw_producers_quick(tmp_path):
    r = run_benchmark("bench_broker.py", "--only", "sync", "--raw-producers", timeout=110, tmpdir=tmp_path)
    assert list(tmp_path.iterdir()) == []          # every node's store is gone
    assert r["raw_producers"] is True and "batch" not in r
    assert r["sync"]["errors"] == 0 and r["sync"]["msgs_s"] > 0 and r["sync"]["connections"] == 16
    assert 0 < r["sync"]["p50_ms"] <= r["sync"]["p99_ms"]


@pytest.mark.timeout(120)
def test_bench_broker_java_wire_quick(tmp_path):
    """16 sends in flight on one connection, JSON headers as the Java client writes them: every answer
    matches its request's opaque (a mismatched or missing one counts as an error)."""
    r = run_benchmark("bench_broker.py", "--only", "sync", "--java-wire", timeout=110, tmpdir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert r["java_wire"] is True and r["sync"]["connections"] == 1
    assert r["sync"]["errors"] == 0 and r["sync"]["msgs_s"] > 0 and 0 < r["sync"]["p50_ms"] <= r["sync"]["p99_ms"]


def test_java_wire_frames_patch_the_opaque_even_when_a_key_holds_its_digits(monkeypatch):
    """A UNIQ_KEY like ...1000000000003202 (a hex prefix ending in 1, a zero-padded counter) holds the
    opaque's ten digits: the frame must still be split at the opaque field, or every request of the
    run carries one opaque and every answer is an error."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_broker
    monkeypatch.setattr(bench_broker, "uniq_key", lambda: "5CC5EC8658FA27910000000000003202")
    for before, after in bench_broker.java_frames(4):
        frame = b"%s%d%s" % (before, 1_000_000_123, after)
        assert before.endswith(b'"opaque":') and b'"opaque":1000000123,' in frame
        assert b"UNIQ_KEY\\u00015CC5EC8658FA27910000000000003202" in frame
