"""MQTT codec: packets per second through smartgo.mqtt.codec on one core, the broker's per-message cost.

    python benchmarks/bench_mqtt_codec.py [--quick] [--json] [--count N]

A QoS 1 PUBLISH of a 128-byte payload to devices/00042/telemetry, at 3.1.1 and at 5.0 (no properties, and
with a content type and a user property):
- decode: one packet per Decoder.feed (a device that sends one at a time);
- decode_batch: 64 packets per feed (a socket read from a busy publisher);
- encode: encode(Publish, version), as a delivery to one subscriber;
- decode_encode: feed then encode, the relay of one message.
Each figure is the best of 3 rounds, in CPU time (process_time: the machine is shared). host_probe_ms: the CPU
time of a fixed Python loop (host_probe.py; higher is a slower host).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from host_probe import HostProbe
from smartgo.mqtt.codec import Connect, Decoder, Publish, encode

PAYLOAD = bytes(range(128))
BATCH = 64


def rate(fn: Callable[[], object], count: int, per_call: int = 1) -> float:
    best = 0.0
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(count // per_call):
            fn()
        best = max(best, count // per_call * per_call / (time.process_time() - t0))
    return round(best)


def scenario(version: int, properties: dict[str, Any], count: int) -> dict[str, int]:
    packet = Publish("devices/00042/telemetry", PAYLOAD, 1, False, False, 4242, properties)
    decoder = Decoder()
    decoder.feed(encode(Connect("MQTT", version, client_id="bench"), version))
    wire = encode(packet, version)
    assert decoder.feed(wire) == [packet] and len(PAYLOAD) == 128
    feed = decoder.feed
    batch = wire * BATCH
    report = {"packet_bytes": len(wire),
              "decode": rate(lambda: feed(wire), count),
              "decode_batch": rate(lambda: feed(batch), count, BATCH),
              "encode": rate(lambda: encode(packet, version), count),
              "decode_encode": rate(lambda: encode(feed(wire)[0], version), count)}
    print(f"  {version} {sorted(properties)}: {report}", file=sys.stderr, flush=True)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20,000 packets a figure: a one-second smoke run")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--count", type=int, default=0, help="packets a figure (default 300,000; quick 20,000)")
    args = ap.parse_args()
    count = args.count or (20_000 if args.quick else 300_000)
    probe = HostProbe()
    probe_ms = [probe.once()]
    print(f"MQTT codec, QoS 1 PUBLISH of 128 bytes, {count:,} packets a figure", file=sys.stderr, flush=True)
    report: dict[str, Any] = {
        "count": count, "python": sys.version.split()[0],
        "v311": scenario(4, {}, count),
        "v5": scenario(5, {}, count),
        "v5_properties": scenario(5, {"content_type": "application/json", "user_property": [("site", "b7")]},
                                  count),
    }
    probe_ms.append(probe.once())
    report["host_probe_ms"] = round(sum(probe_ms) / len(probe_ms), 2)
    for name in ("v311", "v5", "v5_properties"):
        r = report[name]
        print(f"{name:13}: decode {r['decode']:,}/s, batched {r['decode_batch']:,}/s, encode {r['encode']:,}/s, "
              f"decode+encode {r['decode_encode']:,}/s ({r['packet_bytes']}-byte packet)")
    print(f"host probe: {report['host_probe_ms']} ms (higher is a slower host)")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
