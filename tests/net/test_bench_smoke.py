"""The remoting benchmark runs end to end (--quick) and reports every figure."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["plain", "tls", "permissive-plain"])
def test_bench_remoting_quick(mode: str, tmp_path) -> None:
    figures = run_benchmark("bench_remoting.py", *([] if mode == "plain" else [f"--{mode}"]), timeout=170,
                            tmpdir=tmp_path)
    assert (figures["tls"], figures["permissive_plain"]) == (mode == "tls", mode == "permissive-plain")
    assert list(tmp_path.iterdir()) == []          # the certificate is cleaned up
    for name in ("header_json_us", "header_msgpack_us", "sync_json_per_s", "pipelined_json_per_s",
                 "conn16_json_per_s", "sync_pinned_json_per_s", "pipelined_msgpack_per_s",
                 "sync_busy_poll_json_per_s", "sync_json_cpu_us", "sync_busy_poll_json_cpu_us", "host_probe_ms"):
        assert figures[name] > 0, name
    assert figures["quick"] is True
