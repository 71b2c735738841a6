"""The supervisor end to end: real processes, a real registry on a free loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.nodes import ROOT, SUPERVISOR, events, registry_request, running, toml_dumps, wait_gone
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(60)

LAUNCHER = Path(__file__).with_name("launch_test_node.py")
RECORDER = "tests.support.actors:RecorderActor"


def test_kill_9_restarts_the_actor_and_the_registry_serves_again(start_node):
    node = start_node()
    assert registry_request(node.port, opaque=11)["opaque"] == 11
    first = node.actor("registry")
    assert first["restarts"] == 0 and first["state"] == "running"

    os.kill(first["pid"], signal.SIGKILL)
    report = node.wait_healthy(check=lambda r: r["actors"][0]["pid"] != first["pid"])
    again = report["actors"][0]
    assert again["restarts"] == 1
    assert again["incarnation"] == 2
    response = registry_request(node.port, opaque=12)
    assert response["opaque"] == 12 and response["flag"] & 1 == 1
    # the actor's own records, tagged, in the node log
    node.logged(f"actor registry (pid {first['pid']}) was killed by SIGKILL", f"registry[{again['pid']}]")


def test_actors_are_named_in_ps_and_run_under_the_configured_policy(start_node):
    batch = start_node().actor("registry")["pid"]
    assert Path(f"/proc/{batch}/comm").read_text().strip() == "sg-registry"     # ps, top: which actor is which
    assert os.sched_getscheduler(batch) == os.SCHED_BATCH                       # actor_sched_policy = batch
    other = start_node({"actor_sched_policy": "other"}).actor("registry")["pid"]
    assert os.sched_getscheduler(other) == os.SCHED_OTHER


def test_a_hung_actor_is_killed_and_restarted(start_node):
    node = start_node({"actor": [{"name": "hang", "cls": "tests.support.actors:HangingActor",
                                  "heartbeat_deadline": 1.0, "kwargs": {"hang_after": 0.3}}]})
    hung = node.actor("hang")["pid"]
    report = node.wait_healthy(check=lambda r: r["actors"][1]["restarts"] >= 1)
    assert report["actors"][1]["pid"] != hung
    assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == psutil.STATUS_ZOMBIE
    node.logged("hung; killing it")
    assert report["actors"][0]["restarts"] == 0              # one-for-one: the registry was left alone


def test_restart_intensity_restarts_the_node_and_reruns_recovery(start_node):
    # Crashes three times at start; max_restarts 2: the third crash restarts the node, after which it runs.
    node = start_node({"max_restarts": 2, "actor": [
        {"name": "crashy", "cls": "tests.support.actors:CrashingActor", "kwargs": {"crash_times": 3}}]},
        role="test", launcher=LAUNCHER, wait=False)
    node.wait_healthy(check=lambda r: r["node"]["restarts"] == 1)
    assert len((node.store / "recoveries").read_text().splitlines()) == 2
    node.logged("restart intensity exceeded")
    assert node.stop() == 0


def test_gives_up_with_a_clear_message_when_node_restarts_do_not_help(start_node):
    node = start_node({"max_restarts": 1, "max_node_restarts": 1, "actor": [
        {"name": "crashy", "cls": "tests.support.actors:CrashingActor"}]}, wait=False)
    status = node.proc.wait(30)
    assert status == 1
    err = node.stderr.read_text()
    assert "giving up" in err and "crashy" in err
    assert node.health()["node"]["state"] == "down"
    wait_gone(node.descendants(), 5)


def test_dependents_wait_for_readiness_without_a_busy_supervisor(start_node, tmp_path):
    ev = tmp_path / "events"
    node = start_node({"actor": [
        {"name": "slow", "cls": RECORDER, "kwargs": {"events": str(ev), "start_delay": 1.5}},
        {"name": "after-slow", "cls": RECORDER, "after": ["slow"], "kwargs": {"events": str(ev)}}]}, wait=False)
    wait_until(lambda: node.health() is not None, message="the board")
    sup = psutil.Process(node.proc.pid)
    t0, cpu0 = time.monotonic(), sum(sup.cpu_times()[:2])
    wait_until(lambda: ("start", "slow") in events(ev), timeout=10, message="'slow' to start")  # the supervisor waits
    waited = time.monotonic() - t0
    assert waited > 0.5 and sum(sup.cpu_times()[:2]) - cpu0 < 0.15   # a spinning loop would burn most of it
    node.wait_healthy()
    assert events(ev) == [("start", "slow"), ("start", "after-slow")]
    log = node.logged("slow ready", "started after-slow")
    assert log.index("slow ready") < log.index("started after-slow")


def test_sigterm_stops_in_reverse_dependency_order_and_exits_0(start_node, tmp_path):
    ev = tmp_path / "events"
    node = start_node({"actor": [
        {"name": "a", "cls": RECORDER, "after": ["registry"], "kwargs": {"events": str(ev), "stop_delay": 0.2}},
        {"name": "b", "cls": RECORDER, "after": ["a"], "kwargs": {"events": str(ev), "stop_delay": 0.2}}]})
    assert events(ev) == [("start", "a"), ("start", "b")]
    children = node.descendants()
    assert len(children) >= 3
    t0 = time.monotonic()
    assert node.stop(timeout=15) == 0
    assert time.monotonic() - t0 < 10
    assert events(ev)[2:] == [("stop", "b"), ("stop", "a")]
    wait_gone(children, 5)
    log = node.logged("stopping b", "stopping a", "stopping registry")
    assert log.index("stopping b") < log.index("stopping a") < log.index("stopping registry")


def test_an_actor_that_missed_its_sigterm_stops_through_its_control_pipe(start_node, tmp_path):
    """A signal sent before an actor has its handler is lost (a node restart can stop an actor
    spawned a moment earlier): the stop also goes down the control pipe, which keeps it."""
    ev = tmp_path / "events"
    node = start_node({"actor": [{"name": "deaf", "cls": RECORDER, "kwargs": {"events": str(ev), "deaf": True}}]})
    t0 = time.monotonic()
    assert node.stop(timeout=15) == 0
    assert time.monotonic() - t0 < 5                     # not shutdown_timeout (10 s)
    assert events(ev) == [("start", "deaf"), ("stop", "deaf")]
    assert "still running after shutdown_timeout" not in node.log_text()


def test_a_second_signal_stops_at_once(start_node, tmp_path):
    node = start_node({"actor": [{"name": "slow", "cls": RECORDER,
                                  "kwargs": {"events": str(tmp_path / "ev"), "stop_delay": 30.0}}]})
    children = node.descendants()
    os.kill(node.proc.pid, signal.SIGTERM)
    wait_until(lambda: "stopping slow" in node.log_text(), timeout=10, message="graceful stop to begin")
    t0 = time.monotonic()
    assert node.stop(signal.SIGINT) == 1
    assert time.monotonic() - t0 < 5
    wait_gone(children, 5)


def test_a_stop_that_overruns_shutdown_timeout_is_killed(start_node, tmp_path):
    node = start_node({"shutdown_timeout": 1.0, "actor": [
        {"name": "slow", "cls": RECORDER, "kwargs": {"events": str(tmp_path / "ev"), "stop_delay": 30.0}}]})
    children = node.descendants()
    t0 = time.monotonic()
    assert node.stop() == 0
    assert time.monotonic() - t0 < 5
    node.logged("still running after shutdown_timeout")
    wait_gone(children, 5)


def test_a_slow_stop_that_counts_progress_may_overrun_shutdown_timeout(start_node, tmp_path):
    """A stop still making progress (the flush actor counting the queues it flushes) is waited for past
    shutdown_timeout, up to a second one: SIGKILL would leave the abort file for the next start."""
    ev = tmp_path / "ev"
    node = start_node({"shutdown_timeout": 1.0, "actor": [
        {"name": "slow", "cls": RECORDER, "kwargs": {"events": str(ev), "stop_delay": 1.6, "stop_counts": True}}]})
    assert node.stop() == 0
    assert events(ev) == [("start", "slow"), ("stop", "slow")]
    log = node.logged("shutdown_timeout (1s) passed while slow still count progress")
    assert "still running after shutdown_timeout" not in log and "killing" not in log


def test_supervisor_killed_9_takes_its_actors_with_it(start_node):
    node = start_node()
    children = node.descendants()
    node.stop(signal.SIGKILL)
    wait_gone(children, 10)            # EOF on their control pipes stops them


def test_one_supervisor_per_store_dir(start_node):
    node = start_node()
    out = subprocess.run([sys.executable, str(SUPERVISOR), "--role", "registry", "--store-dir", str(node.store),
                          "--listen-port", "0"], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 1
    assert f"another supervisor (pid {node.proc.pid})" in out.stderr
    assert all(running(p) for p in node.descendants())


@pytest.mark.parametrize("args, message", [
    (["--role", "slave", "--broker-id", "0"], "broker_id 0: a master is 0, a slave 1 or more"),
    (["--role", "slave", "--replication", "sync"], "replication=sync is a master's setting"),
    (["--role", "nope"], "unknown role 'nope'"),
    ([], "no role"),
    (["--role", "registry", "--config", "/nonexistent.toml"], "config file /nonexistent.toml not found"),
])
def test_bad_settings_are_one_line_and_status_2(args, message):
    out = subprocess.run([sys.executable, str(SUPERVISOR), *args], capture_output=True, text=True, timeout=30,
                         cwd=ROOT)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_help_documents_every_setting_with_its_default():
    from dataclasses import fields

    from smartgo.config import NodeConfig, setting_text
    out = subprocess.run([sys.executable, str(SUPERVISOR), "--help"], capture_output=True, text=True, timeout=30,
                         cwd=ROOT)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for f in fields(NodeConfig):
        if f.metadata["flag"]:
            assert "--" + f.name.replace("_", "-") in text
            if f.default != "":
                assert f"(default: {setting_text(f.default)})" in text, f.name


def test_an_actor_class_that_cannot_be_found_is_a_settings_error(tmp_path):
    cfg = tmp_path / "node.toml"
    cfg.write_text(toml_dumps({"actor": [{"name": "ghost", "cls": "smartgo.no_such_module:Ghost"}]}))
    out = subprocess.run([sys.executable, str(SUPERVISOR), "--role", "registry", "--config", str(cfg),
                          "--store-dir", str(tmp_path / "s")], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr.strip() == "supervisor.py: error: no module 'smartgo.no_such_module' " \
                                 "(from 'smartgo.no_such_module:Ghost')"
