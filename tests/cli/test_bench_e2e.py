"""`smartgo bench e2e` against a real node holding a backlog that `smartgo bench produce` left:
only the messages the run sent itself are received and timed."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.support.nodes import ROOT
from tests.support.broker import start_broker


@pytest.fixture
def node(tmp_path):
    node = start_broker(tmp_path / "node")
    yield node
    node.reap()


def bench(node, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "smartgo.cli", "bench", *args, "-n",
                          f"127.0.0.1:{node.registry_port}", "--duration", "2"],
                         capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.timeout(240)
def test_e2e_over_a_backlog_counts_only_its_own_messages(node):
    produced = json.loads(bench(node, "produce", "--batch", "32", "--concurrency", "1", "--json").splitlines()[-1])
    assert produced["total"] > 1000

    lines = [json.loads(line) for line in bench(node, "e2e", "--concurrency", "2", "--json").splitlines()]
    start = lines[0]
    assert start["type"] == "start" and start["skipped"] > 1000          # the backlog (cleanup may trim it)
    sent, received = (line for line in lines if line["type"] == "summary")
    assert (sent["kind"], received["kind"]) == ("Send", "Receive(send->receipt)")
    assert sent["total"] > 0 and sent["failed"] == 0
    assert received["total"] == sent["total"] and received["sent"] == sent["total"]
    assert received["ignored"] < produced["total"]  # backlog the broker had not yet dispatched: seen, not counted
    assert received["p50_rt_ms"] < 1000             # the backlog was born seconds before the run

    human = bench(node, "e2e", "--concurrency", "1").splitlines()
    assert re.fullmatch(r"e2e: run \w+: only this run's messages count \(property benchRunId\); group \S+ starts "
                        r"after the \d+ messages already in BenchmarkTest's \d+ queues", human[0]), human[0]
    got = re.fullmatch(r"e2e: received (\d+) of the (\d+) messages this run sent; ignored \d+ others "
                       r"\(sent before it or by others\)", human[-1])
    assert got and got[1] == got[2] != "0", human[-1]
