"""Shared-memory ring between processes: throughput, scaling with producers, wake-up latency.

    python benchmarks/bench_ring.py [--quick] [--json] [--runs N]

- throughput: one producer process -> one consumer process (this one), 128-byte records in
  batches of 32 (one frame, one tail store, at most one wake-up each), records/s and MB/s;
- scaling: 1, 2 and 4 producer processes, each with its own ring, into one consumer that sleeps
  on one doorbell shared by all rings (the commit actor's shape);
- wake-up latency: the producer writes one record holding its send time and then sleeps, so the
  consumer is asleep on its doorbell every time; latency = receipt (after the asyncio wake-up)
  minus send time. Both processes pinned to one CPU, then unpinned (on 2 CPUs the kernel then
  usually has to wake the other one).
- host_probe_ms: the CPU time of a fixed Python loop before each run, median: higher is a slower
  host (host_probe.py; this VM's CPU speed varies up to 2x second to second).

Targets (issue 5): >= 1,000,000 records/s; wake-up p99 <= 300 us.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import struct
import tempfile
import time
from pathlib import Path

from host_probe import HostProbe
from smartgo.actors.ring import CONSUMER, PRODUCER, Doorbell, Ring, wait_any
from smartgo.net.loop import run as run_loop

RECORD = 128
BATCH = 32
CAPACITY = 1 << 22
STAMP = struct.Struct("<q")
TARGET_RPS = 1_000_000
TARGET_WAKE_P99_US = 300.0


def _producer(path: str, records: int, barrier, cpu) -> None:
    ring = Ring.attach(Path(path), PRODUCER, CAPACITY)
    batch = [bytes([i]) * RECORD for i in range(BATCH)]
    barrier.wait()
    t0 = time.process_time()
    for _ in range(records // BATCH):
        ring.write(batch)
    cpu.value = time.process_time() - t0
    ring.close()


def throughput(producers: int, records: int, workdir: Path) -> tuple[float, float, float]:
    """(records/s, consumer CPU ns per record, producer CPU ns per record) into one consumer from
    `producers` processes writing `records` each. The CPU costs say what a quiet machine allows."""
    ctx = multiprocessing.get_context("spawn")
    bell = Doorbell(workdir / f"consumer-{producers}.bell")
    paths = [workdir / f"t{producers}-{i}.ring" for i in range(producers)]
    rings = [Ring.attach(p, CONSUMER, CAPACITY, bell) for p in paths]
    barrier = ctx.Barrier(producers + 1)
    cpus = [ctx.Value("d", 0.0) for _ in paths]
    procs = [ctx.Process(target=_producer, args=(str(p), records, barrier, c)) for p, c in zip(paths, cpus)]
    for p in procs:
        p.start()
    total = producers * (records // BATCH) * BATCH

    async def consume() -> tuple[float, float]:
        got = 0
        barrier.wait()
        t0 = time.perf_counter()
        c0 = time.process_time()
        while got < total:
            n = 0
            for r in rings:
                recs = r.read()
                if recs:
                    n += len(recs)
                    r.release()
            if n:
                got += n
            else:
                await wait_any(rings, bell)
        return total / (time.perf_counter() - t0), (time.process_time() - c0) * 1e9 / total

    try:
        rate, consumer_ns = run_loop(consume())
        for p in procs:
            p.join(30)
        return rate, consumer_ns, sum(c.value for c in cpus) * 1e9 / total
    finally:
        for p in procs:
            p.join(30)
        for r in rings:
            r.close()
        bell.close()


def _pinger(path: str, samples: int, cpu: int | None, seed: int) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    ring = Ring.attach(Path(path), PRODUCER, 1 << 16)
    rnd = random.Random(seed)
    pad = b"\0" * (RECORD - STAMP.size)
    time.sleep(0.2)
    for _ in range(samples):
        time.sleep(rnd.uniform(0.0005, 0.002))       # long enough for the consumer to fall asleep
        ring.write([STAMP.pack(time.perf_counter_ns()) + pad])
    ring.close()


def wake_latency(samples: int, pinned: bool, workdir: Path, tag: str) -> dict:
    """p50/p99 microseconds from write to receipt by a sleeping asyncio consumer."""
    cpu = 0 if pinned else None
    old = os.sched_getaffinity(0)
    if pinned:
        os.sched_setaffinity(0, {0})
    path = workdir / f"wake-{tag}.ring"
    ring = Ring.attach(path, CONSUMER, 1 << 16)
    proc = multiprocessing.get_context("spawn").Process(target=_pinger, args=(str(path), samples, cpu, 7))
    proc.start()

    async def consume() -> list[float]:
        lat: list[float] = []
        while len(lat) < samples:
            for r in ring.read():
                lat.append((time.perf_counter_ns() - STAMP.unpack_from(r)[0]) / 1000)
            ring.release()
            if len(lat) < samples:
                await ring.wait_readable()
        return lat

    try:
        lat = sorted(run_loop(consume()))
    finally:
        proc.join(30)
        ring.close()
        os.sched_setaffinity(0, old)
    return {"p50": round(lat[len(lat) // 2], 1), "p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few-second smoke run")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--runs", type=int, default=0, help="runs per figure, medians reported (default 3, quick 1)")
    args = ap.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    records = 64_000 if args.quick else 2_000_000
    samples = 200 if args.quick else 3000
    probe = HostProbe()

    with tempfile.TemporaryDirectory(prefix="bench-ring-") as tmp:
        work = Path(tmp)
        scaling, cpu_ns = {}, {}
        for n in (1, 2, 4):
            per = max(BATCH, records // n)
            results = [throughput(n, per, work) for _ in probe.before_each(runs)]
            scaling[str(n)] = round(statistics.median(r[0] for r in results))
            cpu_ns[str(n)] = {"consumer": round(statistics.median(r[1] for r in results)),
                              "producer": round(statistics.median(r[2] for r in results))}
        wake = {}
        for pinned in (True, False):
            tag = "pinned" if pinned else "unpinned"
            results = [wake_latency(samples, pinned, work, f"{tag}{i}") for i in probe.before_each(runs)]
            wake[tag] = {k: statistics.median(r[k] for r in results) for k in ("p50", "p99")}

    rps = scaling["1"]
    report = {
        "records_per_s": rps,
        "mb_per_s": round(rps * RECORD / 1e6, 1),
        "record_bytes": RECORD, "batch": BATCH, "runs": runs, "quick": args.quick,
        "scaling_records_per_s": scaling,
        "cpu_ns_per_record": cpu_ns,
        "wake_us": wake,
        "host_probe_ms": probe.ms,
        "targets": {"records_per_s": TARGET_RPS, "wake_p99_us": TARGET_WAKE_P99_US},
        "pass": {"records_per_s": rps >= TARGET_RPS,
                 "wake_p99_us": max(w["p99"] for w in wake.values()) <= TARGET_WAKE_P99_US},
    }
    print(f"ring throughput, 1 producer: {rps:,} records/s ({report['mb_per_s']} MB/s), "
          f"{RECORD}-byte records, {BATCH} per batch, median of {runs}")
    for n, v in scaling.items():
        print(f"  {n} producer(s) -> 1 consumer: {v:,} records/s; CPU per record: consumer "
              f"{cpu_ns[n]['consumer']} ns, producers {cpu_ns[n]['producer']} ns")
    for tag, w in wake.items():
        print(f"wake-up latency {tag}: p50 {w['p50']} us, p99 {w['p99']} us")
    print(f"host probe: {probe.ms} ms (higher is a slower host)")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
