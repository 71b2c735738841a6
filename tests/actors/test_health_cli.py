"""`smartgo health`: table, JSON, exit status as a probe, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.nodes import ROOT
from tests.support.broker import start_broker

pytestmark = pytest.mark.timeout(60)


def smartgo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "smartgo.cli", *args], capture_output=True, text=True,
                          timeout=30, cwd=ROOT)


def test_health_of_a_running_then_stopped_node(start_node):
    node = start_node()
    out = smartgo("health", "--store-dir", str(node.store), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["healthy"] and report["verdict"] == "healthy"
    (actor,) = report["actors"]
    assert actor["name"] == "registry" and actor["state"] == "running" and actor["restarts"] == 0
    assert actor["rss_bytes"] > 1_000_000 and actor["cpu_percent"] is not None
    assert 0 <= actor["heartbeat_age_s"] < 5 and actor["mailbox_depth"] == 0
    assert report["node"]["role"] == "registry" and report["node"]["pid"] == node.proc.pid

    table = smartgo("health", "--store-dir", str(node.store))
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0] == f"checked: store dir {node.store}"
    assert lines[2].split() == ["ACTOR", "PID", "STATE", "HEARTBEAT", "RESTARTS", "CPU%", "RSS", "MAILBOX"]
    assert lines[3].split()[:3] == ["registry", str(actor["pid"]), "running"]
    assert lines[-1] == "healthy"

    assert node.stop() == 0
    down = smartgo("health", "--store-dir", str(node.store))
    assert down.returncode == 1
    assert down.stdout.splitlines()[-1].startswith("unhealthy: supervisor")


def test_errors_are_one_line(tmp_path):
    out = smartgo("health", "--store-dir", str(tmp_path))
    assert out.returncode == 1
    assert out.stderr.strip() == f"smartgo health: no board at {tmp_path}/run/board " \
                                 "(has the node ever started with this store dir?)"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "board").write_bytes(b"garbage" * 100)
    out = smartgo("health", "--store-dir", str(tmp_path))
    assert out.returncode == 1 and "not a SmartGo board" in out.stderr and "Traceback" not in out.stderr


def test_bare_health_checks_the_node_a_bare_master_command_starts(tmp_path, monkeypatch):
    """README: `python supervisor.py --role master`, then `smartgo health`: both resolve
    ~/smartgo/master (HOME is tmp_path for the node and the CLI); the board, not a port, finds it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    store = tmp_path / "smartgo" / "master"
    assert smartgo("health").stderr.strip() == (
        f"smartgo health: no board at {store}/run/board (has the node ever started with this store dir?); "
        "checked the default store dir of `python supervisor.py --role master`: "
        "give --store-dir DIR or --broker HOST:PORT for another node")
    node = start_broker(store)
    try:
        out = smartgo("health")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == f"checked: store dir {store} (the default of `python supervisor.py --role master`)"
        assert lines[1].startswith(f"node master  pid {node.proc.pid}  running") and lines[-1] == "healthy"
        assert not [line for line in lines if "schedule.idle=" in line]      # counters only with --verbose

        verbose = smartgo("health", "--verbose").stdout.splitlines()
        assert "schedule.idle=" in verbose[-2] and verbose[-1] == "healthy"
        report = json.loads(smartgo("health", "--json").stdout)
        assert report["checked"] == {"store_dir": str(store), "default": True}
        assert report["node"]["pid"] == node.proc.pid and "schedule.idle" in report["fields"]

        wire = smartgo("health", "--broker", f"127.0.0.1:{node.port}")
        assert wire.returncode == 0 and wire.stdout.splitlines()[0] == f"checked: broker 127.0.0.1:{node.port}"
    finally:
        node.reap()


def test_usage_errors_exit_2():
    out = smartgo("health", "--store-dir", "/nowhere", "--broker", "127.0.0.1:1")
    assert out.returncode == 2 and "not allowed with argument" in out.stderr
    assert smartgo("no-such-command").returncode == 2
