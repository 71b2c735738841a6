"""Request-reply round trips: a real node, requester processes and one replying consumer process.

Each requester process runs --concurrency loops of `await producer.request(msg)` (128-byte body)
against one topic; the replier is an AsyncPushConsumer whose coroutine listener answers every
request with `producer.send(create_reply_message(msg, msg.body))`. A round trip is: the request's
send, the consumer's long-polling pull, the reply's send (SEND_REPLY_MESSAGE_V2), its stored copy
and its push through the broker actor to the requester's connection (PUSH_REPLY_MESSAGE_TO_CLIENT).

Figures: round trips per second, p50/p99 latency (request() call to its return), errors
(timeouts), and the broker's CPU per round trip by actor. No target in issue 9; the figures are
recorded in docs/BENCHMARKS.md. Every figure is the median of --runs runs, each on a fresh node;
the machine is shared (2 vCPU), the load average is reported. --json: the last line is one JSON
object. --quick: one short run (the smoke test).
host_probe_ms: the CPU time of a fixed Python loop before each run, median: higher is a slower host
(host_probe.py; this VM's CPU speed varies up to 2x second to second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_broker import broker_node, median_of, percentile, run_workers  # noqa: E402
from host_probe import HostProbe  # noqa: E402
from smartgo.client import (AsyncProducer, AsyncPushConsumer, ClientError, Message,  # noqa: E402
                            create_reply_message)

TOPIC = "RpcBench"
QUEUES = 4
BODY = b"q" * 128


def _uvloop() -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    logging.basicConfig(level=logging.WARNING)


def _with_cpu(result: dict) -> dict:
    """The process's own CPU seconds (user + system, its whole life) added to its result."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {**result, "cpu_s": usage.ru_utime + usage.ru_stime}


# ---- the replier ---------------------------------------------------------------------------------------------

def _replier(registry: str, ready, stop, out) -> None:
    _uvloop()
    out.put(_with_cpu(asyncio.run(replier(registry, ready, stop))))


async def replier(registry: str, ready, stop) -> dict:
    producer = AsyncProducer("PG_BENCH_REPLIER", registry)
    replied = [0]

    async def answer(msg) -> None:
        await producer.send(create_reply_message(msg, msg.body))
        replied[0] += 1
    consumer = AsyncPushConsumer("G_BENCH_REPLIER", registry, listener=answer, consume_threads=64,
                                 consume_from="CONSUME_FROM_LAST_OFFSET")
    consumer.subscribe(TOPIC)
    async with producer, consumer:
        while len([q for q in consumer.process_queues if q.topic == TOPIC]) < QUEUES:
            await asyncio.sleep(0.02)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
    return {"replied": replied[0]}


# ---- requesters ----------------------------------------------------------------------------------------------

def _requester(kind: str, args: dict, ready, go, out) -> None:
    _uvloop()
    out.put(_with_cpu(asyncio.run(requester(args, ready, go))))


async def requester(a: dict, ready, go) -> dict:
    async with AsyncProducer(f"PG_BENCH_REQ_{os.getpid()}", a["registry"]) as producer:
        await producer.request(Message(TOPIC, BODY), timeout=30)     # route, heartbeat, the whole path once
        ready.set()
        while not go.is_set():
            await asyncio.sleep(0.005)
        latencies: list[float] = []
        errors = [0]
        start = time.perf_counter()
        end = start + a["seconds"]

        async def loop() -> None:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                try:
                    await producer.request(Message(TOPIC, BODY), timeout=a["timeout"])
                except ClientError:
                    errors[0] += 1
                    continue
                t1 = time.perf_counter()
                if t1 <= end:
                    latencies.append(t1 - t0)
        await asyncio.gather(*(loop() for _ in range(a["concurrency"])))
    return {"latencies": latencies, "errors": errors[0], "seconds": end - start}


# ---- a run ---------------------------------------------------------------------------------------------------

def run_once(workdir: Path, seconds: float, requesters: int, concurrency: int, net_actors: int) -> dict:
    settings = {"topics": f"{TOPIC}:{QUEUES}", "net_actors": net_actors}
    with broker_node(workdir, settings) as (node, _addr):
        registry = f"127.0.0.1:{node.registry_port}"
        ctx = multiprocessing.get_context("spawn")
        ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
        rep = ctx.Process(target=_replier, args=(registry, ready, stop, out), daemon=True)
        rep.start()
        try:
            if not ready.wait(60):
                raise RuntimeError("the replier did not get its queues")
            jobs = [("request", {"registry": registry, "seconds": seconds, "concurrency": concurrency,
                                 "timeout": 10.0}) for _ in range(requesters)]
            results, cpu = run_workers(jobs, node, _requester)
            stop.set()
            rep_result = out.get(timeout=30)
        finally:
            stop.set()
            rep.join(15)
            if rep.is_alive():
                rep.kill()
    lat = sorted(x for r in results for x in r["latencies"])
    trips = len(lat)
    return {"round_trips_s": trips / max(r["seconds"] for r in results), "p50_ms": percentile(lat, 50) * 1000,
            "p99_ms": percentile(lat, 99) * 1000, "errors": sum(r["errors"] for r in results),
            "round_trips": trips, "replied": rep_result["replied"],
            "broker_cpu_us_per_round_trip": sum(cpu.values()) / max(trips, 1) * 1e6,
            "requester_cpu_s": round(sum(r["cpu_s"] for r in results), 2),
            "replier_cpu_s": round(rep_result["cpu_s"], 2),
            "cpu_s": {k: round(v, 2) for k, v in cpu.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one short smoke run")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--runs", type=int, default=3, help="runs (median reported), each on a fresh node")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    ap.add_argument("--requesters", type=int, default=1, help="requester processes")
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight per requester process")
    ap.add_argument("--net-actors", type=int, default=1, help="the node's net actors")
    args = ap.parse_args()
    runs, seconds = (1, 1.5) if args.quick else (args.runs, args.seconds)
    concurrency = min(args.concurrency, 4) if args.quick else args.concurrency
    results: dict = {"quick": args.quick, "requesters": args.requesters, "concurrency": concurrency,
                     "net_actors": args.net_actors, "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    probe = HostProbe()
    with tempfile.TemporaryDirectory(prefix="bench_reply_") as tmp:
        results["reply"] = median_of([run_once(Path(tmp), seconds, args.requesters, concurrency, args.net_actors)
                                      for _ in probe.before_each(runs)])
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    results["host_probe_ms"] = probe.ms
    print(f"reply: {results['reply']}", file=sys.stderr)
    print(json.dumps(results) if args.json else json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
