"""The many-queues benchmark's --quick run works, and the node setting it compares bounds what
dispatch and the net actor keep mapped."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark

QUEUES = 400


@pytest.mark.timeout(180)
def test_bench_many_queues_quick():
    r = run_benchmark("bench_many_queues.py", "--queues", str(QUEUES), "--mapped-queue-files", "16,4096",
                      timeout=170)
    assert (r["queues"], r["rounds"], r["quick"]) == (QUEUES, 2, True) and r["host_probe_ms"] > 0
    low, high = r["by_mapped_queue_files"]["16"], r["by_mapped_queue_files"]["4096"]
    for figures in (low, high):
        assert (figures["refused"], figures["missing"]) == (0, 0)
        assert figures["send_msgs_s"] > 0 and figures["pull_msgs_s"] > 0 and figures["total_pss_mb"] > 0
        assert figures["restart_after_stop_s"] > 0 and figures["restart_after_kill_s"] > 0
    for actor in ("dispatch", "net-0"):
        assert low["actors"][actor]["fds"] + QUEUES - 16 <= high["actors"][actor]["fds"], actor
