"""The supervisor's watchdog tells a busy actor (progress, no heartbeat) from a hung one."""

from __future__ import annotations

import psutil
import pytest

from smartgo.actors.board import SlotView
from smartgo.actors.watchdog import Verdict, Watchdog, crowded, judge

pytestmark = pytest.mark.timeout(60)

BUSY = "tests.support.actors:BusyActor"
S = 10**9


@pytest.mark.parametrize("age, quiet, verdict", [
    (0.5, 9.0, Verdict.OK),             # heartbeat in time: whatever the counter does
    (1.5, 0.1, Verdict.BUSY),           # late, the counter moved just now
    (1.5, 1.2, Verdict.HUNG),           # late, the counter still for longer than PROGRESS_WINDOW
    (1.5, 1.5, Verdict.HUNG),           # never moved since the heartbeat stopped
    (31.0, 0.1, Verdict.OVERDUE),       # busy, but past heartbeat_busy_limit
])
def test_judge(age, quiet, verdict):
    assert judge(age, deadline=1.0, quiet=quiet, busy_limit=30.0) is verdict


def test_progress_window_never_exceeds_a_short_deadline():
    assert judge(0.3, deadline=0.25, quiet=0.3, busy_limit=30.0) is Verdict.HUNG


def view(pid: int, heartbeat_s: float, progress: int) -> SlotView:
    return SlotView("net-0", pid, 1, 0, 3, 5 * S, 0, 0, pid, int(heartbeat_s * S), 2, 0, progress, 0, 0)


def test_a_busy_episode_is_told_once_then_killed_past_the_limit_and_a_new_process_starts_afresh():
    dog = Watchdog(busy_limit=4.0)
    assert dog.check(0, view(7, 10.0, 5), 1.0, int(10.5 * S)) == (Verdict.OK, "")
    verdict, why = dog.check(0, view(7, 10.0, 9), 1.0, 12 * S)          # late, counter moved
    assert verdict is Verdict.BUSY and "2.00s old (deadline 1s) but busy (progress 9" in why
    assert dog.check(0, view(7, 10.0, 12), 1.0, int(12.5 * S)) == (Verdict.BUSY, "")   # told once
    verdict, why = dog.check(0, view(7, 12.6, 12), 1.0, int(12.7 * S))
    assert verdict is Verdict.OK and why == "heartbeats again: its loop turned after 2.60s of work"
    verdict, why = dog.check(0, view(7, 12.6, 13), 1.0, int(16.7 * S))   # busy again, for too long
    assert verdict is Verdict.OVERDUE and "heartbeat_busy_limit (4s)" in why
    verdict, why = dog.check(0, view(7, 12.6, 13), 1.0, int(18.0 * S))   # the counter stopped too
    assert verdict is Verdict.HUNG and why.endswith("no progress for 1.30s: hung")
    assert dog.check(0, view(8, 19.0, 0), 1.0, int(19.5 * S)) == (Verdict.OK, "")   # restarted: its own count


def test_a_busy_actor_is_warned_about_not_killed(start_node):
    node = start_node({"actor": [{"name": "busy", "cls": BUSY, "heartbeat_deadline": 0.5,
                                  "kwargs": {"busy_after": 0.2, "busy_for": 2.5}}]})
    pid = node.actor("busy")["pid"]
    node.logged("done being busy", timeout=20)
    node.logged(f"actor busy (pid {pid}) heartbeat", "but busy (progress", "heartbeats again: its loop turned after")
    busy = node.wait_healthy()["actors"][1]
    assert (busy["pid"], busy["restarts"]) == (pid, 0) and busy["progress"] >= 100
    assert busy["loop_lag_max_ms"] >= 2000                  # the stretch shows as the loop's lag
    assert "killing it" not in node.log_text()


def test_a_busy_actor_is_killed_past_the_busy_limit(start_node):
    node = start_node({"heartbeat_busy_limit": 1.5,
                       "actor": [{"name": "busy", "cls": BUSY, "heartbeat_deadline": 0.5,
                                  "kwargs": {"busy_after": 0.2, "busy_for": 3600}}]})
    pid = node.actor("busy")["pid"]
    report = node.wait_healthy(check=lambda r: r["actors"][1]["restarts"] >= 1, timeout=30)
    assert report["actors"][1]["pid"] != pid and not psutil.pid_exists(pid) or \
        psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    node.logged(f"actor busy (pid {pid}) heartbeat", "while busy (progress",
                "its loop has not turned for longer than heartbeat_busy_limit (1.5s); killing it")


def test_a_crowded_node_stretches_its_deadlines_in_proportion():
    """A million devices need 56 MQTT actors besides the broker's ten: on two CPUs each loop gets a
    thirty-third of a CPU, and a fixed 5 s deadline killed actors that were working."""
    assert crowded(5.0, 12, 2) == 5.0                  # a default node: as configured
    assert crowded(5.0, 16, 2) == 5.0
    assert crowded(5.0, 66, 2) == pytest.approx(5.0 * 66 / 16)
    assert crowded(5.0, 66, 16) == 5.0                 # the same node on 16 CPUs
    assert crowded(5.0, 3, 0) == 5.0
