"""The MQTT routing-table benchmark still runs (--quick) and reports every figure (--json)."""

from __future__ import annotations

import pytest

from tests.support.waits import run_benchmark


@pytest.mark.timeout(120)
def test_bench_mqtt_topics_quick() -> None:
    r = run_benchmark("bench_mqtt_topics.py", timeout=100)
    assert r["devices"] == 50_000 and r["host_probe_ms"] > 0
    for shape in ("exact", "wildcard"):
        assert set(r[shape]) == {"add_us", "match_us", "match_us_1000_devices", "match_none_us", "remove_us",
                                 "bytes_per_subscription"}
        assert all(value > 0 for value in r[shape].values())
    assert set(r["retained"]) == {"set_us", "match_us", "get_us", "bytes_per_retained"}
    assert all(value > 0 for value in r["retained"].values())
    # a subscription costs less than a kilobyte: the trie keeps no dict for a single child or subscriber
    assert r["exact"]["bytes_per_subscription"] < r["wildcard"]["bytes_per_subscription"] < 1000
