"""The MQTT codec benchmark still runs (--quick) and reports every figure (--json)."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(120)
def test_bench_mqtt_codec_quick() -> None:
    r = run_benchmark("bench_mqtt_codec.py", timeout=100)
    assert r["count"] == 20_000 and r["host_probe_ms"] > 0
    for name in ("v311", "v5", "v5_properties"):
        figures = r[name]
        assert set(figures) == {"packet_bytes", "decode", "decode_batch", "encode", "decode_encode"}
        assert all(value > 0 for value in figures.values())
    assert r["v311"]["packet_bytes"] == 3 + 2 + len("devices/00042/telemetry") + 2 + 128  # remaining length: 2 bytes
