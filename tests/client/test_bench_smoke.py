"""The client benchmark runs end to end (--quick, stub broker) and reports every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_bench_client_quick() -> None:
    out = subprocess.run([sys.executable, "benchmarks/bench_client.py", "--quick", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=110, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for mode in ("sync", "async", "batch", "consume", "blocking_sync"):
        assert figures[f"{mode}_cpu_us_per_msg"] > 0 and figures[f"{mode}_msgs_per_s"] > 0
    assert figures["batch_cpu_us_per_msg"] < figures["sync_cpu_us_per_msg"]
