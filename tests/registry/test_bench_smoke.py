"""The registry benchmark runs end to end (--quick) and reports its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_bench_registry_quick() -> None:
    out = subprocess.run([sys.executable, "benchmarks/bench_registry.py", "--quick", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=110, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["route_json_per_s"] > 0 and figures["route_msgpack_per_s"] > 0
    assert figures["route_body_bytes"] > 100 and figures["clients"] == 8
