"""Transactional sends against a real node, next to plain sends of the same SDK producer.

A node (bench_broker's settings, async flush, 1 net actor) and, in this process, one AsyncProducer
whose `concurrency` coroutines each send one message at a time (128-byte bodies) for --seconds:

  plain   await producer.send(msg)
  tx      await producer.send_in_transaction(msg): the half message, the listener's execute
          (a coroutine answering COMMIT_MESSAGE), END_TRANSACTION oneway; the broker then stores
          the message again in its topic and an op record (three records a transaction)

Figures per mode: msgs/s, p50/p99 of the call (ms), broker CPU µs a message (psutil, every
actor), and for tx the ratio to plain. After each tx run every committed transaction must be in
the topic (`delivered` == `committed`, from the queues' max offsets once dispatch caught up).
host_probe_ms: the CPU time of a fixed Python loop before each run, median: higher is a slower
host (host_probe.py; this VM's CPU speed varies up to 2x second to second).

    .venv/bin/python benchmarks/bench_transactions.py [--runs 3] [--seconds 5] [--concurrency 16] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_broker import BODY, TOPIC, actor_cpu, broker_node, max_offsets, percentile, wait_dispatched  # noqa: E402
from host_probe import HostProbe  # noqa: E402
from smartgo.client import AsyncProducer, LocalTransactionState, Message  # noqa: E402
from smartgo.net.loop import run  # noqa: E402


class Commit:
    async def execute(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    async def check(self, msg) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


async def load(registry: str, mode: str, seconds: float, concurrency: int) -> dict:
    async with AsyncProducer(f"bench_{mode}", registry, transaction_listener=Commit()) as producer:
        send = producer.send_in_transaction if mode == "tx" else producer.send
        await send(Message(TOPIC, BODY))                        # routes and connection before the clock starts
        latencies: list[float] = []
        done = [0]
        end = time.perf_counter() + seconds

        async def one() -> None:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                await send(Message(TOPIC, BODY))
                latencies.append(time.perf_counter() - t0)
                done[0] += 1
        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return {"msgs": done[0], "seconds": elapsed, "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000}


def scenario(workdir: Path, mode: str, seconds: float, concurrency: int) -> dict:
    with broker_node(workdir) as (node, _addr):
        registry = f"127.0.0.1:{node.registry_port}"
        before = actor_cpu(node)
        r = run(load(registry, mode, seconds, concurrency))
        after = actor_cpu(node)
        wait_dispatched(node, 60)
        delivered = sum(max_offsets(node).values())
    cpu = sum(after.values()) - sum(before.values())
    return {"msgs_s": r["msgs"] / r["seconds"], "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"],
            "broker_cpu_us_per_msg": cpu / max(r["msgs"], 1) * 1e6, "committed": r["msgs"] + 1,
            "delivered": delivered}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs per mode (median reported)")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    ap.add_argument("--concurrency", type=int, default=16, help="sends in flight (one coroutine each)")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--quick", action="store_true", help="a few-second smoke run")
    args = ap.parse_args()
    runs, seconds = (1, 1.0) if args.quick else (args.runs, args.seconds)
    probe = HostProbe()
    report: dict = {"quick": args.quick, "runs": runs, "seconds": seconds, "concurrency": args.concurrency}
    with tempfile.TemporaryDirectory(prefix="bench-tx-") as tmp:
        for mode in ("plain", "tx"):
            results = [scenario(Path(tmp), mode, seconds, args.concurrency) for _ in probe.before_each(runs)]
            report[mode] = {k: round(statistics.median(r[k] for r in results), 3)
                            for k in ("msgs_s", "p50_ms", "p99_ms", "broker_cpu_us_per_msg")}
            if mode == "tx":
                report[mode]["all_delivered"] = all(r["delivered"] == r["committed"] for r in results)
    report["tx_to_plain"] = round(report["tx"]["msgs_s"] / report["plain"]["msgs_s"], 3)
    report["host_probe_ms"] = probe.ms
    for mode in ("plain", "tx"):
        f = report[mode]
        print(f"{mode:<5} {f['msgs_s']:>9,.0f} msgs/s  p50 {f['p50_ms']:.2f} ms  p99 {f['p99_ms']:.2f} ms  "
              f"broker {f['broker_cpu_us_per_msg']:.0f} µs/msg", file=sys.stderr if args.json else sys.stdout)
    print(f"tx / plain {report['tx_to_plain']}, every committed message delivered: {report['tx']['all_delivered']}, "
          f"host probe {probe.ms} ms", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
