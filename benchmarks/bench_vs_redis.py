"""SmartGo and Redis 7 request by request: the same workloads in one run, the two alternating (issue 46).

Redis Streams is the peer (Debian's redis-server, driven by its own C redis-benchmark; installed
with apt-get when missing, as the tests do). SmartGo is a real node driven by bench_broker.py's load
generator processes. Every workload runs SmartGo then Redis, --runs times (SmartGo run 1, Redis run
1, SmartGo run 2, ...), each run on a fresh node or server and store; figures are medians, and the
ratio SmartGo/Redis is the median of the runs' pairwise ratios, so a host that slows down between
runs moves both sides alike. 128-byte bodies, loopback:

  sync      16 producers, one request in flight each        Redis: redis-benchmark -c 16 -P 1 XADD
  durable   the same, fsync before the answer               Redis: appendonly, appendfsync always
  pipe32    32 requests of one message in flight, one conn  Redis: -c 1 -P 32
  pipe1024  1,024 messages in flight on one connection      Redis: -c 1 -P 1024
            (SmartGo: 32 requests of 32 messages)
  consume   drain a backlog 32 messages a call, 8 calls in flight, committing the consumed offset as
            a consumer group does. Redis: XREADGROUP ... COUNT 32 NOACK with -c 8 (NOACK advances the
            group's last-delivered id at once: the commit). SmartGo: pulls with FLAG_COMMIT_OFFSET,
            two load generator processes of 4 queues each (bench_broker's pull scenario)

Per workload and side: msgs/s, broker CPU µs a message (user + system of every actor process of the
node; redis-server's threads' run time from /proc/PID/task/*/schedstat, in ns, as a quick consume costs
Redis about one 10 ms clock tick; over the measured window), the load generator's CPU µs a message (over the
same window: SmartGo's are Python processes, Redis's is C), the messages in flight, host_probe_ms
(the host's speed while the side ran: higher is slower). Ratios below 1 favour Redis for msgs/s and
SmartGo for CPU. --json: the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_broker  # noqa: E402
from bench_broker import (BODY, QUEUES, TOPIC, SyncLoad, broker_node, fill, max_offsets, median_of,  # noqa: E402
                          probed, run_workers, sync_figures, sync_jobs, wait_dispatched)
from smartgo import accel  # noqa: E402
from smartgo.net.client import BlockingRemotingClient  # noqa: E402
from smartgo.net.codes import RequestCode  # noqa: E402
from tests.support.broker import offset_command, pull_command  # noqa: E402
from tests.support.debian import need  # noqa: E402
from tests.support.waits import LOOPBACK, end_process, free_port, wait_for_port, wait_until  # noqa: E402

#: SmartGo/Redis ratios the issue asks for: (figure, "min" or "max", bound).
TARGETS: dict[str, tuple[str, str, float]] = {
    "sync_msgs_s": ("sync", "min", 0.6),
    "sync_cpu_us_per_msg": ("sync", "max", 1.75),
    "durable_msgs_s": ("durable", "min", 0.8),
    "pipe32_msgs_s": ("pipe32", "min", 0.8),
    "pipe1024_msgs_s": ("pipe1024", "min", 1.0),
    "pipe1024_cpu_us_per_msg": ("pipe1024", "max", 1.0),
    "consume_msgs_s": ("consume", "min", 1.5),
}
WORKLOADS = ("sync", "durable", "pipe32", "pipe1024", "consume")
GROUP = "bench_group"
#: Redis's stream and the cap that keeps its memory bounded on the long pipelined runs.
STREAM = "bench"
FILL = ["XADD", STREAM, "*", "f", BODY.decode()]
XADD = [*FILL[:2], "MAXLEN", "~", "1000000", *FILL[2:]]
XREADGROUP = ["XREADGROUP", "GROUP", "g", "c", "COUNT", "32", "NOACK", "STREAMS", STREAM, ">"]


@dataclass(frozen=True)
class Shape:
    """What is in flight: Redis's connections and pipeline; SmartGo's requests and messages a request."""
    clients: int
    pipeline: int
    smartgo_depth: int
    smartgo_batch: int = 1

    @property
    def in_flight(self) -> int:
        return self.clients * self.pipeline


SHAPES = {"sync": Shape(16, 1, 16), "durable": Shape(16, 1, 16), "pipe32": Shape(1, 32, 32, 1),
          "pipe1024": Shape(1, 1024, 32, 32), "consume": Shape(8, 1, 8, 32)}


# ---- SmartGo -------------------------------------------------------------------------------------------------

class _GoWatch:
    """The load generator's `go` event as its worker polls it: notes the process's CPU time when it
    is first seen set, so the worker's CPU is counted over the measured window only (not its imports)."""

    def __init__(self, go) -> None:
        self.go = go
        self.cpu_at_go: float | None = None

    def is_set(self) -> bool:
        if not self.go.is_set():
            return False
        if self.cpu_at_go is None:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            self.cpu_at_go = usage.ru_utime + usage.ru_stime
        return True


class _WindowOut:
    """The result queue: takes the CPU spent before `go` off the worker's cpu_s."""

    def __init__(self, out, watch: _GoWatch) -> None:
        self.out, self.watch = out, watch

    def put(self, result: dict) -> None:
        result["cpu_s"] -= self.watch.cpu_at_go or 0.0
        self.out.put(result)


def _committing_pull(topic: str, queue_id: int, offset: int, **fields):
    """pull_command as a consumer group's pull: FLAG_COMMIT_OFFSET with the offset consumed so far."""
    return pull_command(topic, queue_id, offset, group=GROUP, commit_offset=offset, **fields)


def _windowed_worker(kind: str, args: dict, ready, go, out) -> None:
    """bench_broker's load generator process, its CPU counted from `go` on; kind "pull_commit" is
    its pull worker with every pull committing the group's offset."""
    if kind == "pull_commit":
        bench_broker.pull_command = _committing_pull
        kind = "pull"
    watch = _GoWatch(go)
    bench_broker._run_worker(kind, args, ready, watch, _WindowOut(out, watch))


def _figures(msgs: int, seconds: float, cpu: dict[str, float], loadgen_cpu_s: float, in_flight: int) -> dict:
    return {"msgs_s": msgs / seconds, "cpu_us_per_msg": sum(cpu.values()) / max(msgs, 1) * 1e6,
            "loadgen_cpu_us_per_msg": loadgen_cpu_s / max(msgs, 1) * 1e6, "in_flight": in_flight,
            "msgs": msgs}


def smartgo_sync(work: Path, seconds: float, settings: dict, load: SyncLoad) -> dict:
    with broker_node(work, settings) as (node, addr):
        results, cpu = run_workers(sync_jobs(addr, seconds, settings, load), node, target=_windowed_worker)
    f = sync_figures(results, cpu)
    msgs, loadgen = sum(r["msgs"] for r in results), sum(r["cpu_s"] for r in results)
    return {**_figures(msgs, max(r["seconds"] for r in results), cpu, loadgen, load.producers),
            "p99_ms": f["p99_ms"], "errors": f["errors"]}


def smartgo_pipelined(work: Path, seconds: float, shape: Shape) -> dict:
    """bench_broker's batch worker: `smartgo_depth` requests of `smartgo_batch` messages in flight."""
    with broker_node(work) as (node, addr):
        job = {"addr": addr, "seconds": seconds, "depth": shape.smartgo_depth, "batch": shape.smartgo_batch}
        (r,), cpu = run_workers([("batch", job)], node, target=_windowed_worker)
    return {**_figures(r["msgs"], r["seconds"], cpu, r["cpu_s"], shape.in_flight), "errors": r["errors"]}


def smartgo_consume(work: Path, backlog: int) -> dict:
    """Fill a backlog, then drain it with committing pulls, one in flight per queue (8), two processes."""
    shape = SHAPES["consume"]
    with broker_node(work) as (node, addr):
        fill(addr, backlog)
        wait_dispatched(node)
        upto = max_offsets(node)
        halves = [list(range(0, QUEUES, 2)), list(range(1, QUEUES, 2))]
        results, cpu = run_workers([("pull_commit", {"addr": addr, "seconds": 120, "queues": h, "upto": upto})
                                    for h in halves], node, target=_windowed_worker)
        msgs = sum(r["msgs"] for r in results)
        committed = committed_offsets(addr, msgs - 32 * QUEUES)
    return {**_figures(msgs, max(r["seconds"] for r in results), cpu, sum(r["cpu_s"] for r in results),
                     shape.in_flight),
            "errors": sum(r["errors"] for r in results), "committed": committed}


def committed_offsets(addr: str, at_least: int) -> int:
    """The group's committed offsets summed over the queues, once they reach `at_least` (commits are
    applied asynchronously; each pull commits where it starts, so the last pull's 32 stay uncommitted)."""
    client = BlockingRemotingClient()
    seen = [0]

    def total() -> int:
        answers = [client.invoke(addr, offset_command(RequestCode.QUERY_CONSUMER_OFFSET, TOPIC, q,
                                                      consumerGroup=GROUP), 5.0) for q in range(QUEUES)]
        seen[0] = sum(int((a.ext_fields or {}).get("offset", 0)) for a in answers)   # QUERY_NOT_FOUND: none yet
        return seen[0]
    try:
        wait_until(lambda: total() >= at_least, timeout=30, interval=0.1, message="the group's commits")
    finally:
        client.close()
    return seen[0]


# ---- Redis ---------------------------------------------------------------------------------------------------

@dataclass
class Redis:
    """A redis-server of its own on a free loopback port, its files in `folder`."""
    proc: subprocess.Popen
    port: int
    folder: Path

    def cli(self, *args: str) -> list[str]:
        out = subprocess.run([need("redis-cli", "redis-tools"), "-h", LOOPBACK, "-p", str(self.port), *args],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.splitlines()

    def field(self, name: str, *args: str) -> int:
        """An integer field of an XINFO answer (raw output: a name, then its value on the next line)."""
        lines = self.cli(*args)
        return int(lines[lines.index(name) + 1])

    def cpu_s(self) -> float:
        """CPU seconds of all its threads (bench_broker.cpu_seconds: nanosecond counts)."""
        return bench_broker.cpu_seconds(self.proc.pid)

    def benchmark(self, clients: int, pipeline: int, requests: int, command: list[str]) -> dict:
        """redis-benchmark's requests/s, and its own CPU seconds (wait4's rusage of that process)."""
        cmd = [need("redis-benchmark", "redis-tools"), "-h", LOOPBACK, "-p", str(self.port), "-c", str(clients),
               "-P", str(pipeline), "-n", str(requests), "--csv", *command]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        out, err = proc.stdout.read(), proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        proc.stderr.close()
        rows = out.decode().strip().splitlines()
        if proc.returncode != 0 or len(rows) < 2:
            raise RuntimeError(f"redis-benchmark failed ({proc.returncode}): {err.decode()[-1000:]} {out[-500:]!r}")
        return {"rps": float(rows[-1].split('","')[1]), "cpu_s": usage.ru_utime + usage.ru_stime}


@contextmanager
def redis_server(work: Path, durable: bool = False) -> Iterator[Redis]:
    """A redis-server serving (in memory; durable: AOF fsync'd before every answer, no rewrites);
    afterwards ended by pid and its folder removed."""
    folder = Path(tempfile.mkdtemp(dir=work, prefix="redis_"))
    port = free_port()
    persistence = ["--appendonly", "yes", "--appendfsync", "always", "--auto-aof-rewrite-percentage", "0"] \
        if durable else ["--appendonly", "no"]
    cmd = [need("redis-server", "redis-server"), "--port", str(port), "--bind", LOOPBACK, "--save", "",
           "--dir", str(folder), "--logfile", str(folder / "redis.log"), "--daemonize", "no", *persistence]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, timeout=30)
        yield Redis(proc, port, folder)
    finally:
        try:
            end_process(proc)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def redis_produce(work: Path, seconds: float, shape: Shape, durable: bool, rate: dict[str, float],
                  name: str) -> dict:
    """XADDs for about `seconds`: the request count from the last run's rate (a short calibration
    run first, if there was none). Messages counted by the stream's entries-added."""
    with redis_server(work, durable) as redis:
        calibrated = name not in rate
        if calibrated:
            rate[name] = redis.benchmark(shape.clients, shape.pipeline, max(20_000, 20 * shape.in_flight), XADD)["rps"]
        requests = max(1, round(rate[name] * seconds / shape.in_flight)) * shape.in_flight   # no partial pipeline
        added = redis.field("entries-added", "XINFO", "STREAM", STREAM) if calibrated else 0
        cpu = redis.cpu_s()
        b = redis.benchmark(shape.clients, shape.pipeline, requests, XADD)
        cpu = {"redis-server": redis.cpu_s() - cpu}
        msgs = redis.field("entries-added", "XINFO", "STREAM", STREAM) - added
    rate[name] = b["rps"]
    return {**_figures(msgs, requests / b["rps"], cpu, b["cpu_s"], shape.in_flight),
            "errors": requests - msgs}


def redis_consume(work: Path, backlog: int) -> dict:
    """Fill `backlog` entries, create group g at the start, drain it 32 a call with 8 connections."""
    shape = SHAPES["consume"]
    with redis_server(work) as redis:
        bulk = backlog // 1024 * 1024               # redis-benchmark completes its last pipeline: no partial one
        for pipeline, count in ((1024, bulk), (1, backlog - bulk)):
            if count:
                redis.benchmark(1, pipeline, count, FILL)
        assert redis.field("entries-added", "XINFO", "STREAM", STREAM) == backlog
        redis.cli("XGROUP", "CREATE", STREAM, "g", "0")
        requests = -(-backlog // 32)
        cpu = redis.cpu_s()
        b = redis.benchmark(shape.clients, shape.pipeline, requests, XREADGROUP)
        cpu = {"redis-server": redis.cpu_s() - cpu}
        msgs = redis.field("entries-read", "XINFO", "GROUPS", STREAM)
    return {**_figures(msgs, requests / b["rps"], cpu, b["cpu_s"], shape.in_flight),
            "errors": backlog - msgs,
            "committed": msgs}


# ---- the run -------------------------------------------------------------------------------------------------

def ratios(pairs: list[tuple[dict, dict]]) -> dict:
    """SmartGo/Redis per run, the median over the runs."""
    return {k: round(statistics.median(s[k] / r[k] for s, r in pairs), 3)
            for k in ("msgs_s", "cpu_us_per_msg", "loadgen_cpu_us_per_msg") if all(r[k] > 0 for _, r in pairs)}


def passes(workloads: dict) -> dict[str, bool]:
    out = {}
    for key, (name, how, bound) in TARGETS.items():
        value = workloads.get(name, {}).get("ratio", {}).get(key.removeprefix(f"{name}_"))
        if value is not None:
            out[key] = value >= bound if how == "min" else value <= bound
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one short run of each workload, a small backlog")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--runs", type=int, help="runs of each side per workload, alternating (medians; default 3, "
                                             "1 with --quick)")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds of each producing run")
    ap.add_argument("--backlog", type=int, default=1_000_000, help="messages the consume workload drains")
    ap.add_argument("--only", default="", help=f"comma-separated workloads ({','.join(WORKLOADS)})")
    ap.add_argument("--raw-producers", action="store_true",
                    help="SmartGo's sync producers on raw connections with pre-encoded frames (bench_broker's "
                         "--raw-producers: less load-generator CPU) instead of RemotingClient")
    args = ap.parse_args()
    only = [w for w in WORKLOADS if w in (set(filter(None, args.only.split(","))) or set(WORKLOADS))]
    runs, seconds = args.runs or (1 if args.quick else 3), 1.0 if args.quick else args.seconds
    backlog = 20_000 if args.quick else args.backlog
    load = SyncLoad("raw_sync" if args.raw_producers else "sync")
    version = subprocess.run([need("redis-server", "redis-server"), "--version"], capture_output=True,
                             text=True, check=True).stdout.split()
    out: dict = {"quick": args.quick, "runs": runs, "seconds": seconds, "backlog": backlog, "accel": accel.in_use(),
                 "redis": next((w.split("=")[1] for w in version if w.startswith("v=")), "?"),
                 "smartgo_sync_worker": load.worker, "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    rate: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench_vs_redis_") as tmp:
        work = Path(tmp)
        sides: dict[str, tuple[Callable[[], dict], Callable[[], dict]]] = {
            "sync": (lambda: smartgo_sync(work, seconds, {}, load),
                     lambda: redis_produce(work, seconds, SHAPES["sync"], False, rate, "sync")),
            "durable": (lambda: smartgo_sync(work, seconds, {"flush": "sync"}, load),
                        lambda: redis_produce(work, seconds, SHAPES["durable"], True, rate, "durable")),
            "pipe32": (lambda: smartgo_pipelined(work, seconds, SHAPES["pipe32"]),
                       lambda: redis_produce(work, seconds, SHAPES["pipe32"], False, rate, "pipe32")),
            "pipe1024": (lambda: smartgo_pipelined(work, seconds, SHAPES["pipe1024"]),
                         lambda: redis_produce(work, seconds, SHAPES["pipe1024"], False, rate, "pipe1024")),
            "consume": (lambda: smartgo_consume(work, backlog), lambda: redis_consume(work, backlog)),
        }
        workloads = {}
        for name in only:
            pairs = []
            for i in range(runs):
                smartgo, redis = sides[name]
                pairs.append((probed(smartgo), probed(redis)))
                print(f"{name} run {i + 1}/{runs}: smartgo {pairs[-1][0]['msgs_s']:,.0f} msgs/s "
                      f"{pairs[-1][0]['cpu_us_per_msg']:.1f} µs, redis {pairs[-1][1]['msgs_s']:,.0f} msgs/s "
                      f"{pairs[-1][1]['cpu_us_per_msg']:.1f} µs", file=sys.stderr, flush=True)
            workloads[name] = {"smartgo": median_of([s for s, _ in pairs]), "redis": median_of([r for _, r in pairs]),
                               "ratio": ratios(pairs)}
    out["workloads"] = workloads
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out["targets"] = {k: f"{'>=' if how == 'min' else '<='} {bound}" for k, (_, how, bound) in TARGETS.items()}
    out["pass"] = passes(workloads)
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
