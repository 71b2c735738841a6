"""MQTT routing tables: time and memory per subscription and per retained message at a million devices.

    python benchmarks/bench_mqtt_topics.py [--quick] [--json] [--devices N]

- subscriptions, two shapes: every device subscribed to its own topic (devices/<id>/cmd: the plain-filter
  dict) and to its own branch (devices/<id>/#: the trie). Per shape: CPU microseconds per add, per match of
  a device's topic (100,000 of them, random devices; also with 1,000 devices: the same cost is the point),
  per match of a topic nobody subscribes to, per remove;
  bytes per subscription (tracemalloc over the adds, in a separate build: tracing slows allocation). The
  filter and owner strings are made beforehand: a session holds them anyway.
- retained: one retained message per device (devices/<id>/status): CPU microseconds per set, per match of
  devices/<id>/# and per get; bytes per retained message.
- host_probe_ms: the CPU time of a fixed Python loop (host_probe.py; higher is a slower host).

The routing promise (issue 44): a match costs the same at 1,000 or 1,000,000 devices.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from host_probe import HostProbe
from smartgo.mqtt.topics import RetainedIndex, SubscriptionIndex

MATCHES = 100_000


def per_op_us(fn: Callable[[], object], count: int) -> float:
    """CPU microseconds per operation: process time, which a busy shared host inflates less than wall time."""
    t0 = time.process_time()
    fn()
    return round((time.process_time() - t0) / count * 1e6, 3)


def bytes_per(build: Callable[[], object], count: int) -> float:
    gc.collect()
    tracemalloc.start()
    kept = build()
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return round(size / count, 1)


def build_index(owners: list[str], filters: list[str]) -> SubscriptionIndex[int]:
    index: SubscriptionIndex[int] = SubscriptionIndex()
    add = index.add
    for owner, topic_filter in zip(owners, filters):
        add(owner, topic_filter, 1)
    return index


def match_us(index: SubscriptionIndex[int], devices: int, rng: random.Random) -> float:
    topics = [f"devices/{rng.randrange(devices)}/cmd" for _ in range(MATCHES)]
    match = index.match
    hits: list[int] = []
    cost = per_op_us(lambda: hits.extend(len(match(t)[0]) for t in topics), MATCHES)
    assert hits == [1] * MATCHES, "every device's topic reaches its one subscriber"
    return cost


def subscriptions(shape: str, devices: int, rng: random.Random) -> dict:
    small = 1000
    small_us = match_us(build_index([f"device-{i}" for i in range(small)], [shape.format(i) for i in range(small)]),
                        small, rng)
    filters = [shape.format(i) for i in range(devices)]
    owners = [f"device-{i}" for i in range(devices)]
    holder: list[SubscriptionIndex[int]] = []
    add_us = per_op_us(lambda: holder.append(build_index(owners, filters)), devices)
    index = holder.pop()
    print(f"  {shape}: {devices:,} added, {add_us} us each", file=sys.stderr, flush=True)
    match = index.match
    big_us = match_us(index, devices, rng)
    miss_us = per_op_us(lambda: sum(not match("elsewhere/1/cmd")[0] for _ in range(MATCHES)), MATCHES)
    remove = index.remove
    remove_us = per_op_us(lambda: [remove(o, f) for o, f in zip(owners, filters)], devices)
    assert len(index) == 0
    print(f"  {shape}: match {big_us} us ({small_us} us at {small:,} devices), miss {miss_us} us, "
          f"remove {remove_us} us; measuring memory", file=sys.stderr, flush=True)
    return {"add_us": add_us, "match_us": big_us, f"match_us_{small}_devices": small_us, "match_none_us": miss_us,
            "remove_us": remove_us, "bytes_per_subscription": bytes_per(lambda: build_index(owners, filters), devices)}


def retained(devices: int, rng: random.Random) -> dict:
    topics = [f"devices/{i}/status" for i in range(devices)]
    filters = [f"devices/{rng.randrange(devices)}/#" for _ in range(MATCHES)]

    def build() -> RetainedIndex[int]:
        index: RetainedIndex[int] = RetainedIndex()
        for topic in topics:
            index.set(topic, 1)
        return index

    holder: list[RetainedIndex[int]] = []
    set_us = per_op_us(lambda: holder.append(build()), devices)
    index = holder.pop()
    found: list[int] = []
    match_us = per_op_us(lambda: found.extend(len(index.match(f)) for f in filters), MATCHES)
    assert found == [1] * MATCHES
    get_us = per_op_us(lambda: [index.get(t) for t in topics[:MATCHES]], min(MATCHES, devices))
    print(f"  retained: set {set_us} us, match {match_us} us, get {get_us} us; measuring memory",
          file=sys.stderr, flush=True)
    return {"set_us": set_us, "match_us": match_us, "get_us": get_us,
            "bytes_per_retained": bytes_per(build, devices)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50,000 devices: a few-second smoke run")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--devices", type=int, default=0, help="devices (default 1,000,000; quick 50,000)")
    args = ap.parse_args()
    devices = args.devices or (50_000 if args.quick else 1_000_000)
    rng = random.Random(44)
    probe = HostProbe()
    probe_ms = [probe.once()]
    print(f"MQTT routing tables, {devices:,} devices", file=sys.stderr, flush=True)
    report: dict[str, Any] = {"devices": devices, "python": sys.version.split()[0],
                              "exact": subscriptions("devices/{}/cmd", devices, rng),
                              "wildcard": subscriptions("devices/{}/#", devices, rng),
                              "retained": retained(devices, rng)}
    probe_ms.append(probe.once())
    report["host_probe_ms"] = round(sum(probe_ms) / len(probe_ms), 2)
    for shape in ("exact", "wildcard"):
        r = report[shape]
        print(f"{shape:8}: add {r['add_us']} us, match {r['match_us']} us ({r['match_us_1000_devices']} us at 1,000 "
              f"devices; none {r['match_none_us']} us), "
              f"remove {r['remove_us']} us, {r['bytes_per_subscription']} bytes per subscription")
    r = report["retained"]
    print(f"retained: set {r['set_us']} us, match devices/<id>/# {r['match_us']} us, get {r['get_us']} us, "
          f"{r['bytes_per_retained']} bytes per retained message")
    print(f"host probe: {report['host_probe_ms']} ms (higher is a slower host)")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
