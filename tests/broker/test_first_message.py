"""The README's "Send and read a first message" example, against a real node."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waits import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "first_message.py"


@pytest.mark.timeout(90)
def test_first_message_example_sends_and_reads_back(start_node):
    node = start_node().node
    runs = []

    def example_ran() -> bool:     # the broker registers with the embedded registry shortly after it is healthy
        runs.append(subprocess.run([sys.executable, str(EXAMPLE), "--registry", f"127.0.0.1:{node.registry_port}"],
                                   capture_output=True, text=True, timeout=30))
        return runs[-1].returncode == 0 or "no broker registered" not in runs[-1].stderr

    wait_until(example_ran, timeout=30, interval=0.2, message="a registered broker for the example")
    run = runs[-1]
    assert run.returncode == 0, run.stderr
    sent, read = run.stdout.splitlines()
    assert sent.startswith("sent: msgId ") and "queue 0 offset 0" in sent
    assert read.startswith("read: 'Hello SmartGo' tags TagA keys ['first']")
