"""The registry benchmark runs end to end (--quick) and reports its figures."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(120)
def test_bench_registry_quick() -> None:
    figures = run_benchmark("bench_registry.py", timeout=110)
    assert figures["route_json_per_s"] > 0 and figures["route_msgpack_per_s"] > 0
    assert figures["route_body_bytes"] > 100 and figures["clients"] == 8 and figures["host_probe_ms"] > 0
