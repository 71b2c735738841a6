"""The remoting benchmark runs end to end (--quick) and reports every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_bench_remoting_quick() -> None:
    out = subprocess.run([sys.executable, "benchmarks/bench_remoting.py", "--quick", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=170, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("header_json_us", "header_msgpack_us", "sync_json_per_s", "pipelined_json_per_s",
                 "conn16_json_per_s", "sync_pinned_json_per_s", "pipelined_msgpack_per_s"):
        assert figures[name] > 0, name
    assert figures["quick"] is True
