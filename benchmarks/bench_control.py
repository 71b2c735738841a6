"""Control-plane benchmark: a real node (supervisor.py --role master) and load generator processes.

Scenarios (clients speak JSON headers, as Java clients do):
  heartbeat   1,000 clients (50 consumer groups of 20, 2 subscriptions each, plus a producer group),
              each heartbeating every 30 s on its own connection: the CPU the broker spends (net
              actors + broker actor), % of one core, over one whole 30 s cycle; and the same
              minus an idle window of the same length (the marginal cost)        target < 5 %
  heartbeat_max   100 connections heartbeating back to back: heartbeats/s and broker CPU-us each
  offsets     UPDATE_CONSUMER_OFFSET as Java's offset persistence sends it (oneway), from 4
              connections in 2 processes, until the broker has applied every one   target >= 20,000/s
  offsets_sync    the same answered (8 in flight per connection)
  route       UPDATE_AND_CREATE_TOPIC -> the route visible on the node's registry: median, p99
  metrics     GET /metrics (metrics_port) of a broker with 1,000 topics of 4 queues, a message in each
              queue and 200 groups committed in 5 topics each (1,000 lagging topic/group pairs): page
              build time (median, p99), size, and the broker actor's CPU per scrape; then the
              same gzipped (gzip_*), as Prometheus asks for it

Every figure is the median of --runs runs (each on a fresh node; --quick, a smoke run, puts one
run of each on one node). The machine is shared (2 vCPU):
the load average is reported with the results. --json: the last line is one JSON object.
host_probe_ms: the CPU time of a fixed Python loop before each run, median: higher is a slower host
(host_probe.py; this VM's CPU speed varies up to 2x second to second).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_broker import actor_cpu, broker_node, median_of, percentile, run_workers  # noqa: E402
from host_probe import HostProbe  # noqa: E402
from tests.support.nodes import Node  # noqa: E402
from tests.support.broker import group_command, heartbeat_body, send_command, update_offset_command  # noqa: E402
from smartgo.net.client import RemotingClient  # noqa: E402
from smartgo.net.codes import FLAG_RESPONSE, RequestCode, ResponseCode, SerializeType  # noqa: E402
from smartgo.net.command import RemotingCommand  # noqa: E402
from smartgo.net.frame import FrameDecoder, encode_frame  # noqa: E402
from tests.support.waits import free_port  # noqa: E402

TARGETS = {"heartbeat_cpu_pct": 5.0, "offsets_updates_s": 20_000}
NODE = {"heartbeat_interval": 0.2, "log_level": "WARNING", "commitlog_file_size": 64 << 20,
        "consume_queue_file_size": 60_000 * 20, "index_slot_count": 50_000, "index_entry_count": 200_000}
CONTROL_ACTORS = ("broker", "net-")


# ---- a raw client connection: pre-encoded frames out, responses counted ------------------------------------

class Conn(asyncio.Protocol):
    """Writes ready-made frames; counts responses (and errors); answers nothing the broker sends
    (NOTIFY_CONSUMER_IDS_CHANGED is oneway)."""

    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.responses = 0
        self.errors = 0
        self.waiting: dict[int, asyncio.Future] = {}
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for cmd in self.decoder.feed(data):
            if not cmd.flag & FLAG_RESPONSE:
                continue
            self.responses += 1
            if cmd.code != ResponseCode.SUCCESS:
                self.errors += 1
            fut = self.waiting.pop(cmd.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(cmd)

    def call(self, frame: bytes, opaque: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.waiting[opaque] = fut
        self.transport.write(frame)
        return fut


def frame(cmd: RemotingCommand, opaque: int = 0) -> bytes:
    cmd.opaque = opaque
    cmd.serialize_type = SerializeType.JSON
    return encode_frame(cmd)


async def connect(addr: str, n: int) -> list[Conn]:
    host, port = addr.split(":")
    loop = asyncio.get_running_loop()
    conns = []
    for _ in range(n):
        _, proto = await loop.create_connection(Conn, host, int(port))
        conns.append(proto)
    return conns


# ---- load generator processes ------------------------------------------------------------------------------

def _run_worker(kind: str, args: dict, ready, go, out) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    out.put(asyncio.run(WORKERS[kind](args, ready, go)))


async def _released(ready, go) -> None:
    ready.set()
    while not go.is_set():
        await asyncio.sleep(0.005)


def heartbeat_frames(first: int, count: int, groups: int) -> list[bytes]:
    out = []
    for i in range(first, first + count):
        g = f"BenchGroup{i % groups}"
        body = heartbeat_body(f"10.0.{i // 250}.{i % 250}@{4000 + i}", {g: {"BenchTopicA": "TagA || TagB",
                                                                                 "%RETRY%" + g: "*"}},
                              producers=("BenchProducer",), version=1_700_000_000_000)
        out.append(frame(RemotingCommand(RequestCode.HEART_BEAT, body=body), i + 1))
    return out


async def heartbeat_worker(a: dict, ready, go) -> dict:
    """a: addr, first, clients, groups, period (s), join_seconds, seconds, blast (back to back).
    Every client heartbeats once to join (spread over join_seconds), then every `period`, client i
    at phase i/clients of it; the measured window starts after the joins."""
    frames = heartbeat_frames(a["first"], a["clients"], a["groups"])
    conns = await connect(a["addr"], a["clients"])
    n = len(conns)
    for i, (conn, f) in enumerate(zip(conns, frames)):           # join
        conn.transport.write(f)
        if i % 50 == 49:
            await asyncio.sleep(a["join_seconds"] * 50 / n)
    await asyncio.sleep(1.0)
    joined = sum(c.responses for c in conns)
    await _released(ready, go)
    start = time.perf_counter()
    before = sum(c.responses for c in conns)
    if a["blast"]:                                           # one in flight per connection
        async def loop(conn: Conn, f: bytes, opaque: int) -> None:
            while time.perf_counter() - start < a["seconds"]:
                await conn.call(f, opaque)
        await asyncio.gather(*(loop(c, f, a["first"] + i + 1) for i, (c, f) in enumerate(zip(conns, frames))))
    else:
        period, seconds = a["period"], a["seconds"]
        order = sorted(range(n), key=lambda i: i / n * period)
        k = 0
        while time.perf_counter() - start < seconds:
            due = (k // n) * period + (order[k % n] / n) * period
            delay = start + due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.perf_counter() - start >= seconds:
                break
            conns[order[k % n]].transport.write(frames[order[k % n]])
            k += 1
    elapsed = time.perf_counter() - start
    done = sum(c.responses for c in conns) - before
    for c in conns:
        c.transport.close()
    return {"heartbeats": done, "seconds": elapsed, "joined": joined, "errors": sum(c.errors for c in conns)}


async def offsets_worker(a: dict, ready, go) -> dict:
    """a: addr, conns, first_conn, seconds, oneway, depth. Each connection updates 256 queues
    in turn; the last update of each is unique, and a final QUERY shows it applied."""
    conns = await connect(a["addr"], a["conns"])
    pools = [[frame(update_offset_command("BenchOffsets", "BenchTopic", (a["first_conn"] + c) * 1000 + q, 1000 + q,
                                          oneway=True), 7) for q in range(256)] for c in range(a["conns"])]
    await _released(ready, go)
    start = time.perf_counter()
    sent = [0] * len(conns)

    async def oneway(i: int, conn: Conn) -> None:
        chunk = b"".join(pools[i])
        while time.perf_counter() - start < a["seconds"]:
            conn.transport.write(chunk)
            sent[i] += len(pools[i])
            while conn.transport.get_write_buffer_size() > 1 << 20:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0)

    async def answered(i: int, conn: Conn) -> None:
        async def lane(j: int) -> None:                    # one in flight per lane, `depth` lanes
            opaque = 2 + j
            queue = (a["first_conn"] + i) * 1000
            lane_frames = [frame(update_offset_command("BenchOffsets", "BenchTopic", queue + j * 16 + k, 1000 + k),
                                 opaque) for k in range(16)]
            n = 0
            while time.perf_counter() - start < a["seconds"]:
                await conn.call(lane_frames[n % 16], opaque)
                n += 1
            sent[i] += n
        await asyncio.gather(*(lane(j) for j in range(a["depth"])))

    await asyncio.gather(*((oneway if a["oneway"] else answered)(i, c) for i, c in enumerate(conns)))
    checks = []
    for i, conn in enumerate(conns):                       # a unique last update, then read it back
        cid = a["first_conn"] + i
        final = update_offset_command("BenchOffsets", "BenchTopic", cid * 1000, 10**9 + cid, oneway=a["oneway"])
        conn.transport.write(frame(final, 1))
        sent[i] += 1
        checks.append((conn, cid))
    for conn, cid in checks:
        while True:
            r = await conn.call(frame(group_command(RequestCode.QUERY_CONSUMER_OFFSET, "BenchOffsets",
                                                    topic="BenchTopic", queueId=cid * 1000), 99), 99)
            if r.ext_fields and r.ext_fields.get("offset") == str(10**9 + cid):
                break
            await asyncio.sleep(0.001)
    elapsed = time.perf_counter() - start
    for c in conns:
        c.transport.close()
    return {"updates": sum(sent), "seconds": elapsed, "errors": sum(c.errors for c in conns)}


WORKERS = {"heartbeat": heartbeat_worker, "offsets": offsets_worker}


def run(jobs: list[tuple[str, dict]], node: Node) -> tuple[list[dict], float]:
    """The workers' results and the CPU seconds the control actors spent while they ran."""
    results, cpu = run_workers(jobs, node, _run_worker)
    return results, _control(cpu)


def control_cpu(node: Node) -> float:
    return _control(actor_cpu(node))


def _control(per_actor: dict[str, float]) -> float:
    """CPU seconds of the net actors and the broker actor."""
    return sum(v for name, v in per_actor.items() if name.startswith(CONTROL_ACTORS))


@contextlib.contextmanager
def control_node(workdir: Path):
    """A node with its Prometheus endpoint on a free loopback port (`node.metrics_port`)."""
    port = free_port()
    with broker_node(workdir, {**NODE, "metrics_port": port, "metrics_host": "127.0.0.1"}) as (node, addr):
        node.metrics_port = port        # type: ignore[attr-defined]
        yield node, addr


#: what a scenario gets its node from: `with nodes() as (node, addr)`
Nodes = Callable[[], AbstractContextManager[tuple[Node, str]]]


# ---- scenarios ----------------------------------------------------------------------------------------------

def scenario_heartbeat(nodes: Nodes, clients: int, period: float, quick: bool) -> dict:
    with nodes() as (node, addr):
        idle_before = control_cpu(node)
        time.sleep(period)
        idle = control_cpu(node) - idle_before
        half = clients // 2
        jobs = [("heartbeat", {"addr": addr, "first": first, "clients": half, "groups": 25, "period": period,
                               "join_seconds": 1.0 if quick else 5.0, "seconds": period, "blast": False})
                for first in (0, half)]
        results, cpu = run(jobs, node)
    beats = sum(r["heartbeats"] for r in results)
    seconds = max(r["seconds"] for r in results)
    return {"clients": clients, "period_s": period, "heartbeats": beats, "heartbeats_s": beats / seconds,
            "cpu_pct": cpu / seconds * 100, "idle_cpu_pct": idle / period * 100,
            "marginal_cpu_pct": max(0.0, cpu / seconds - idle / period) * 100,
            "cpu_us_per_heartbeat": max(0.0, cpu - idle * seconds / period) / max(beats, 1) * 1e6,
            "errors": sum(r["errors"] for r in results), "joined": sum(r["joined"] for r in results)}


def scenario_heartbeat_max(nodes: Nodes, seconds: float) -> dict:
    with nodes() as (node, addr):
        jobs = [("heartbeat", {"addr": addr, "first": first, "clients": 50, "groups": 10, "period": 0,
                               "join_seconds": 0.5, "seconds": seconds, "blast": True}) for first in (0, 50)]
        results, cpu = run(jobs, node)
    beats = sum(r["heartbeats"] for r in results)
    return {"heartbeats_s": beats / max(r["seconds"] for r in results), "cpu_us_per_heartbeat": cpu / max(beats, 1) * 1e6,
            "errors": sum(r["errors"] for r in results)}


def scenario_offsets(nodes: Nodes, seconds: float, oneway: bool) -> dict:
    with nodes() as (node, addr):
        jobs = [("offsets", {"addr": addr, "conns": 2, "first_conn": first, "seconds": seconds, "oneway": oneway,
                             "depth": 8}) for first in (0, 2)]
        results, cpu = run(jobs, node)
    updates = sum(r["updates"] for r in results)
    return {"updates_s": updates / max(r["seconds"] for r in results), "updates": updates,
            "cpu_us_per_update": cpu / max(updates, 1) * 1e6, "errors": sum(r["errors"] for r in results)}


def scenario_route(nodes: Nodes, trials: int) -> dict:
    with nodes() as (node, addr):
        registry = f"127.0.0.1:{node.registry_port}"

        async def main() -> list[float]:
            client = RemotingClient()
            out = []
            try:
                for i in range(trials):
                    topic = f"RouteBench{i}"
                    start = time.perf_counter()
                    r = await client.invoke(addr, RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields={
                        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4",
                        "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}), 10.0)
                    assert r.code == ResponseCode.SUCCESS, r.remark
                    while (await client.invoke(registry, RemotingCommand(
                            RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic}), 10.0)).code != 0:
                        await asyncio.sleep(0.0005)
                    out.append(time.perf_counter() - start)
                    await asyncio.sleep(0.05)
            finally:
                await client.close()
            return sorted(out)
        lat = asyncio.run(main())
    return {"median_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000,
            "max_ms": lat[-1] * 1000, "trials": len(lat)}


def scenario_metrics(nodes: Nodes, topics: int, groups: int, scrapes: int) -> dict:
    with nodes() as (node, addr):
        names = [f"MetricsBench{i}" for i in range(topics)]

        async def populate() -> None:
            client = RemotingClient()
            try:
                sem = asyncio.Semaphore(16)

                async def call(cmd: RemotingCommand) -> None:
                    async with sem:
                        r = await client.invoke(addr, cmd, 30.0)
                    assert r.code == ResponseCode.SUCCESS, r.remark
                await asyncio.gather(*(call(RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields={
                    "topic": t, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
                    "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})) for t in names))
                await asyncio.gather(*(call(send_command(t, b"m" * 128, queue_id=q)) for t in names for q in range(4)))
                commits = [(f"MetricsGroup{g}", names[(g * 5 + k) % topics], q)
                           for g in range(groups) for k in range(5) for q in range(4)]
                await asyncio.gather(*(call(update_offset_command(g, t, q, 0)) for g, t, q in commits))
            finally:
                await client.close()
        asyncio.run(populate())
        url = f"http://127.0.0.1:{node.metrics_port}/metrics"
        lag_pairs = counted = 0
        deadline = time.monotonic() + 30
        while (lag_pairs, counted) != (groups * 5, topics) and time.monotonic() < deadline:  # offsets, stats arrive
            with urllib.request.urlopen(url, timeout=30) as r:
                lines = r.read().decode().splitlines()
            lag_pairs = sum(line.startswith("rocketmq_consumer_lag_messages{") and 'group="MetricsGroup' in line
                            for line in lines)
            counted = sum(line.startswith("rocketmq_messages_in_total{") and 'topic="MetricsBench' in line
                          for line in lines)
        figures = {"topics": topics, "counted_topics": counted, "lag_pairs": lag_pairs, "scrapes": scrapes}
        for prefix, headers in (("", {}), ("gzip_", {"Accept-Encoding": "gzip"})):   # Prometheus asks for gzip
            before = actor_cpu(node)["broker"]
            times, size = [], 0
            for _ in range(scrapes):
                start = time.perf_counter()
                with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
                    size = len(r.read())
                times.append(time.perf_counter() - start)
            cpu = actor_cpu(node)["broker"] - before
            times.sort()
            figures.update({f"{prefix}median_ms": percentile(times, 50) * 1000,
                            f"{prefix}p99_ms": percentile(times, 99) * 1000, f"{prefix}page_bytes": size,
                            f"{prefix}broker_cpu_ms_per_scrape": cpu / scrapes * 1000})
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few-second smoke run with small sizes")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--runs", type=int, default=3, help="runs per scenario (median reported)")
    ap.add_argument("--only", default="", help="comma-separated scenarios "
                                               "(heartbeat,heartbeat_max,offsets,offsets_sync,route,metrics)")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per throughput run")
    args = ap.parse_args()
    quick = args.quick
    runs = 1 if quick else args.runs
    seconds = 1.0 if quick else args.seconds
    only = set(filter(None, args.only.split(","))) or {"heartbeat", "heartbeat_max", "offsets", "offsets_sync",
                                                        "route", "metrics"}
    results: dict = {"quick": quick, "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    probe = HostProbe()
    with tempfile.TemporaryDirectory(prefix="bench_control_") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        if quick:           # a smoke run: every scenario on one node saves four starts and stops
            shared = stack.enter_context(control_node(work))
            nodes: Nodes = lambda: contextlib.nullcontext(shared)   # noqa: E731
        else:               # a measurement: a fresh node for each run of each scenario
            nodes = lambda: control_node(work)   # noqa: E731

        def repeat(name: str, fn) -> None:
            results[name] = median_of([fn() for _ in probe.before_each(runs)])
            print(f"{name}: {results[name]}", file=sys.stderr)

        if "heartbeat" in only:
            repeat("heartbeat", lambda: scenario_heartbeat(nodes, 100 if quick else 1000, 1.0 if quick else 30.0, quick))
        if "heartbeat_max" in only:
            repeat("heartbeat_max", lambda: scenario_heartbeat_max(nodes, seconds))
        if "offsets" in only:
            repeat("offsets", lambda: scenario_offsets(nodes, seconds, oneway=True))
        if "offsets_sync" in only:
            repeat("offsets_sync", lambda: scenario_offsets(nodes, seconds, oneway=False))
        if "route" in only:
            repeat("route", lambda: scenario_route(nodes, 5 if quick else 100))
        if "metrics" in only:
            repeat("metrics", lambda: scenario_metrics(nodes, 50 if quick else 1000, 10 if quick else 200,
                                                       3 if quick else 20))
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    results["host_probe_ms"] = probe.ms
    results["targets"] = TARGETS
    results["pass"] = {k: _passes(results, k) for k in TARGETS if _figure(results, k) is not None}
    print(json.dumps(results) if args.json else json.dumps(results, indent=1))


def _figure(results: dict, key: str) -> float | None:
    name, _, metric = key.partition("_")
    return results.get(name, {}).get(metric)


def _passes(results: dict, key: str) -> bool:
    value = _figure(results, key)
    return value < TARGETS[key] if key.endswith("_pct") else value >= TARGETS[key]


if __name__ == "__main__":
    main()
