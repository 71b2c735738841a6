"""Broker data-path benchmark: a real node (supervisor.py --role master) and load generator processes.

Scenarios (128-byte bodies, loopback, async flush unless noted):
  batch      batched send, 32 messages a request, one producer connection (--batch-depth requests in flight)
             target >= 150,000 msgs/s
  sync       single sends from 16 concurrent synchronous producers                target >= 20,000 msgs/s, p99 <= 5 ms
             (one connection each; --sync-connections 1: all on one, as a RocketMQ client instance's threads)
  syncflush  the same with --flush sync                                           target >= 10,000 msgs/s
  pull       pull a 1,000,000-message backlog, 32 per request                     target >= 200,000 msgs/s
  pullsql    a 1,000,000-message backlog with properties, pulled once with "*" and once with a SQL92
             selector that takes half: scanned msgs/s of each and their ratio (no target)
  wake       long-poll wake latency, send -> consumer receipt, p99                target <= 10 ms
  scaling    the sync scenario with --net-actors 1, 2 and 4: msgs/s, broker CPU-us per message (psutil)
  rss        total RSS of all actors with a 5 GB backlog (a consumer reads the oldest 1 GB)   target <= 400 MB

Every figure is the median of --runs runs (each on a fresh node). The machine is shared (2 vCPU):
the load average is reported with the results, and with each scenario its host_probe_ms (the
CPU time of a fixed pure-Python workload, sampled during the runs: higher is a slower host; see
HostProbe). `accel` says which C accelerators ran (smartgo.accel: none under SMARTGO_PURE_PYTHON=1,
which every process of the run inherits). --json: the last line is one JSON object.
--profile DIR: cProfile the net and commit actors during the batch and sync scenarios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from host_probe import HostProbe  # noqa: E402
from smartgo import accel  # noqa: E402
from tests.support.nodes import Node  # noqa: E402
from tests.support.broker import (batch_command, message_properties, pull_command, send_command,  # noqa: E402
                                    start_broker, uniq_key)
from smartgo.net.client import RemotingClient  # noqa: E402
from smartgo.net.codes import FLAG_SMARTGO, LanguageCode, ResponseCode, SerializeType, code_name  # noqa: E402
from smartgo.net.busy_poll import poller_for  # noqa: E402
from smartgo.net.frame import FrameDecoder, encode_command  # noqa: E402

BODY = b"b" * 128
TOPIC = "Bench"
QUEUES = 8
TARGETS = {"batch_msgs_s": 150_000, "sync_msgs_s": 20_000, "sync_p99_ms": 5.0, "syncflush_msgs_s": 10_000,
           "pull_msgs_s": 200_000, "wake_p99_ms": 10.0, "rss_mb": 400}
SCENARIOS = ("batch", "sync", "syncflush", "pull", "pullsql", "wake", "scaling", "rss")
NODE = {"topics": f"{TOPIC}:{QUEUES}", "commitlog_file_size": 256 << 20, "consume_queue_file_size": 300_000 * 20,
        "index_slot_count": 500_000, "index_entry_count": 2_000_000, "heartbeat_interval": 0.2,
        "log_level": "WARNING"}


# ---- load generator processes ------------------------------------------------------------------------------

def _run_worker(kind: str, args: dict, ready, go, out) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(WORKERS[kind](args, ready, go))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_s"] = usage.ru_utime + usage.ru_stime          # the load generator's own CPU (all of its life)
    out.put(result)


async def _wait(ready, go) -> None:
    ready.set()
    while not go.is_set():
        await asyncio.sleep(0.005)


async def batch_worker(a: dict, ready, go) -> dict:
    """One connection, `depth` batches of 32 in flight."""
    client = RemotingClient()
    conn = await client.connection(a["addr"])
    variants = [batch_command(TOPIC, [(BODY, message_properties(uniq=uniq_key())) for _ in range(a["batch"])],
                              queue_id=q % QUEUES) for q in range(64)]
    done = asyncio.get_running_loop().create_future()
    stats = {"msgs": 0, "errors": 0}
    end = [0.0]
    k = [0]

    def send_next() -> None:
        if time.perf_counter() >= end[0]:
            if not done.done():
                done.set_result(None)
            return
        k[0] += 1
        conn.invoke_async(variants[k[0] % 64], 10.0, on_reply)

    def on_reply(r, err) -> None:
        if err is None and r.code == ResponseCode.SUCCESS:
            if time.perf_counter() < end[0]:
                stats["msgs"] += a["batch"]
        else:
            stats["errors"] += 1
        stats["last_reply"] = time.monotonic()      # CLOCK_MONOTONIC: comparable with the parent's clock
        send_next()

    await _wait(ready, go)
    start = time.perf_counter()
    end[0] = start + a["seconds"]
    for _ in range(a["depth"]):
        send_next()
    await done
    stats["seconds"] = time.perf_counter() - start
    await asyncio.sleep(0.5)
    await client.close()
    return stats


class _RawSender(asyncio.Protocol):
    """A raw load-generator connection: answers decoded with the broker's FrameDecoder and counted
    into the worker's `run` (msgs, errors, latencies until run["end"]); the last one closed ends it."""

    def __init__(self, run: dict) -> None:
        self.run = run
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def answered(self, ok: bool, t0: float) -> None:
        run = self.run
        t1 = time.perf_counter()
        if not ok:
            run["errors"] += 1
        elif t1 < run["end"]:
            run["msgs"] += 1
            run["latencies"].append(t1 - t0)

    def connection_lost(self, exc: Exception | None) -> None:
        self.run["open"] -= 1
        if self.run["open"] == 0 and not self.run["done"].done():
            self.run["done"].set_result(None)


class _SyncProducer(_RawSender):
    """One synchronous producer on a raw connection: send, wait for the answer, send the next.

    Its requests are encoded once with the sans-IO codec (one request in flight, so a fixed opaque
    correlates), and answers are decoded with the same FrameDecoder the broker uses. The load
    generator shares the two cores with the broker, and this costs it ~18 instead of ~26 µs a
    message (no future, no per-request encoding). The broker sees exactly what a SmartGo client
    sends (msgpack headers with FLAG_SMARTGO).
    """

    def __init__(self, frames: list[bytes], run: dict) -> None:
        super().__init__(run)
        self.frames = frames
        self.kick = run["kick"]
        self.n = 0
        self.t0 = 0.0

    def data_received(self, data: bytes) -> None:
        for r in self.decoder.feed(data):
            self.answered(r.code == ResponseCode.SUCCESS, self.t0)
            self.send_next()

    def send_next(self) -> None:
        if time.perf_counter() >= self.run["end"]:
            self.transport.close()
            return
        self.n += 1
        self.t0 = time.perf_counter()
        self.transport.write(self.frames[self.n % len(self.frames)])
        if self.kick is not None:
            self.kick()


async def sync_worker(a: dict, ready, go) -> dict:
    """`producers` synchronous producers (send, wait, send) on `connections` connections, taken
    in turn."""
    clients = [RemotingClient(busy_poll_us=a["busy_poll_us"]) for _ in range(a["connections"])]
    shared = [await c.connection(a["addr"]) for c in clients]
    conns = [shared[i % len(shared)] for i in range(a["producers"])]
    latencies: list[float] = []
    stats = {"msgs": 0, "errors": 0, "connections": len(shared)}
    error_codes: dict[str, int] = {}            # what the errors were: a response code's name, or the exception's
    cmds = [send_command(TOPIC, BODY, queue_id=q % QUEUES, uniq=uniq_key()) for q in range(64)]

    def error(what: str) -> None:
        stats["errors"] += 1
        error_codes[what] = error_codes.get(what, 0) + 1

    async def producer(i: int, conn) -> None:
        n = i
        while time.perf_counter() < end:
            n += 1
            t0 = time.perf_counter()
            try:
                r = await conn.invoke(cmds[n % 64], 5.0)
            except Exception as exc:
                error(type(exc).__name__)
                continue
            t1 = time.perf_counter()
            if r.code == ResponseCode.SUCCESS and t1 < end:
                stats["msgs"] += 1
                latencies.append(t1 - t0)
            elif r.code != ResponseCode.SUCCESS:
                error(code_name(r.code))

    await _wait(ready, go)
    start = time.perf_counter()
    end = start + a["seconds"]
    await asyncio.gather(*(producer(i, c) for i, c in enumerate(conns)))
    stats["seconds"] = time.perf_counter() - start
    latencies.sort()
    stats["latencies"] = latencies[::max(1, len(latencies) // 20000)]   # a sample, for the percentiles
    stats["error_codes"] = error_codes
    for c in clients:
        await c.close()
    return stats


#: Opaques of the Java-wire requests: ten digits each, so a frame's opaque is patched in place.
JAVA_OPAQUES = 1_000_000_000


def java_frames(count: int) -> list[tuple[bytes, bytes]]:
    """SEND_MESSAGE_V2 as RocketMQ 4.9's Java client writes it (JSON header, language JAVA, version
    399, no SmartGo flag, header fields a-m with k and m, properties ending in a separator), split
    around the opaque's digits: (before, after)."""
    frames = []
    for q in range(count):
        cmd = send_command(TOPIC, BODY, queue_id=q % QUEUES, uniq=uniq_key())
        cmd.ext_fields.update({"i": f"UNIQ_KEY\x01{uniq_key()}\x02WAIT\x01true\x02", "k": "false", "m": "false"})
        cmd.serialize_type, cmd.language, cmd.version = SerializeType.JSON, LanguageCode.JAVA, 399
        cmd.opaque = JAVA_OPAQUES
        # split at the opaque field itself: the digits alone also turn up in a UNIQ_KEY whose hex prefix
        # ends in 1 before its zero-padded counter, and every request then kept one opaque
        head, field, after = b"".join(encode_command(cmd, 0)).partition(b'"opaque":%d' % JAVA_OPAQUES)
        assert field, "the opaque is where a Java client writes it"
        frames.append((head + b'"opaque":', after))
    return frames


class _JavaWire(_RawSender):
    """RocketMQ's benchmark Producer as the broker sees it: the threads of one DefaultMQProducer share
    one connection, each with one send in flight, answers matched by opaque (RemotingClient would
    negotiate SmartGo's msgpack headers instead)."""

    def __init__(self, frames: list[tuple[bytes, bytes]], run: dict) -> None:
        super().__init__(run)
        self.frames = frames
        self.sent: dict[int, float] = {}           # opaque -> send time
        self.opaque = JAVA_OPAQUES

    def data_received(self, data: bytes) -> None:
        for r in self.decoder.feed(data):
            t0 = self.sent.pop(r.opaque, None)
            self.answered(t0 is not None and r.code == ResponseCode.SUCCESS, t0 or 0.0)
            self.send_next()

    def send_next(self) -> None:
        if time.perf_counter() >= self.run["end"]:
            if not self.sent:
                self.transport.close()
            return
        self.opaque += 1
        before, after = self.frames[self.opaque % len(self.frames)]
        self.sent[self.opaque] = time.perf_counter()
        self.transport.write(b"%s%d%s" % (before, self.opaque, after))


async def java_sync_worker(a: dict, ready, go) -> dict:
    """`producers` senders on one connection, JSON headers as the Java client writes them (--java-wire)."""
    loop = asyncio.get_running_loop()
    host, port = a["addr"].rsplit(":", 1)
    run = {"msgs": 0, "errors": 0, "latencies": [], "end": 0.0, "open": 1, "done": loop.create_future()}
    _, conn = await loop.create_connection(lambda: _JavaWire(java_frames(64), run), host, int(port))
    await _wait(ready, go)
    start = time.perf_counter()
    run["end"] = start + a["seconds"]
    for _ in range(a["producers"]):
        conn.send_next()
    try:
        await asyncio.wait_for(asyncio.shield(run["done"]), a["seconds"] + 10)
    except asyncio.TimeoutError:                    # sends never answered (or answered under another opaque)
        run["errors"] += len(conn.sent)
        conn.transport.close()
    latencies = sorted(run["latencies"])
    return {"msgs": run["msgs"], "errors": run["errors"], "seconds": time.perf_counter() - start, "connections": 1,
            "latencies": latencies[::max(1, len(latencies) // 20000)]}


async def raw_sync_worker(a: dict, ready, go) -> dict:
    """The sync scenario with _SyncProducer connections (--raw-producers)."""
    loop = asyncio.get_running_loop()
    host, port = a["addr"].rsplit(":", 1)
    frames = []
    for q in range(64):
        cmd = send_command(TOPIC, BODY, queue_id=q % QUEUES, uniq=uniq_key())
        cmd.serialize_type, cmd.opaque = SerializeType.MSGPACK, 1
        frames.append(b"".join(encode_command(cmd, FLAG_SMARTGO)))
    poller = poller_for(a["busy_poll_us"])
    run = {"msgs": 0, "errors": 0, "latencies": [], "end": 0.0, "open": a["producers"], "done": loop.create_future(),
           "kick": poller.kick if poller else None}
    conns = [(await loop.create_connection(lambda: _SyncProducer(frames, run), host, int(port)))[1]
             for _ in range(a["producers"])]
    await _wait(ready, go)
    start = time.perf_counter()
    run["end"] = start + a["seconds"]
    for i, c in enumerate(conns):
        c.n = i
        c.send_next()
    await asyncio.wait_for(run["done"], a["seconds"] + 30)
    latencies = sorted(run["latencies"])
    return {"msgs": run["msgs"], "errors": run["errors"], "seconds": time.perf_counter() - start,
            "connections": len(conns), "latencies": latencies[::max(1, len(latencies) // 20000)]}


async def pull_worker(a: dict, ready, go) -> dict:
    """Pull queues a["queues"] from offset 0 to a["upto"][queue], `depth` requests in flight per queue."""
    client = RemotingClient()
    conn = await client.connection(a["addr"])
    stats = {"msgs": 0, "errors": 0}
    await _wait(ready, go)
    start = time.perf_counter()

    async def drain(q: int) -> None:
        offset, upto = 0, a["upto"][str(q)]
        while offset < upto and time.perf_counter() - start < a["seconds"]:
            r = await conn.invoke(pull_command(TOPIC, q, offset, max_nums=32, subscription=a.get("subscription", "*"),
                                               expression_type=a.get("expression_type", "TAG")), 10.0)
            if r.code not in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY):
                stats["errors"] += 1
                break
            nxt = int(r.ext_fields["nextBeginOffset"])
            stats["msgs"] += nxt - offset
            offset = nxt

    await asyncio.gather(*(drain(q) for q in a["queues"]))
    stats["seconds"] = time.perf_counter() - start
    await client.close()
    return stats


async def wake_worker(a: dict, ready, go) -> dict:
    """Park a pull, send one message, time until the pull's answer arrives; repeat."""
    client = RemotingClient()
    producer = RemotingClient()
    addr = a["addr"]
    conn = await client.connection(addr)
    pconn = await producer.connection(addr)
    await _wait(ready, go)
    latencies = []
    offset = a["offset"]
    for _ in range(a["samples"]):
        pull = asyncio.ensure_future(conn.invoke(pull_command("Wake", 0, offset, suspend_ms=15000), 20.0))
        await asyncio.sleep(0.02)                           # parked by now
        t0 = time.perf_counter()
        r = await pconn.invoke(send_command("Wake", BODY), 5.0)
        assert r.code == ResponseCode.SUCCESS, r.remark
        got = await pull
        latencies.append(time.perf_counter() - t0)
        assert got.code == ResponseCode.SUCCESS, got.remark
        offset = int(got.ext_fields["nextBeginOffset"])
    await client.close()
    await producer.close()
    latencies.sort()
    return {"latencies": latencies, "msgs": len(latencies), "errors": 0, "seconds": 0}


WORKERS = {"batch": batch_worker, "sync": sync_worker, "raw_sync": raw_sync_worker, "java_sync": java_sync_worker,
           "pull": pull_worker, "wake": wake_worker}


def run_workers(jobs: list[tuple[str, dict]], node: Node | None = None, target=None) -> tuple[list[dict], dict]:
    """Start the worker processes, release them together; their results and the broker's CPU time
    per actor. target(kind, args, ready, go, out) runs a worker (default: this module's)."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    out = ctx.Queue()
    procs, readies = [], []
    for kind, args in jobs:
        ready = ctx.Event()
        p = ctx.Process(target=target or _run_worker, args=(kind, args, ready, go, out), daemon=True)
        p.start()
        procs.append(p)
        readies.append(ready)
    for r in readies:
        if not r.wait(60):
            raise RuntimeError("a load generator did not get ready")
    before = actor_cpu(node) if node else {}
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    after = actor_cpu(node) if node else {}
    for p in procs:
        p.join(10)
    cpu = {name: after[name] - before.get(name, 0.0) for name in after}
    return results, cpu


# ---- node helpers -------------------------------------------------------------------------------------------

def actor_processes(node: Node) -> dict[str, psutil.Process]:
    return {a["name"]: psutil.Process(a["pid"]) for a in node.health()["actors"] if a["pid"]}


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process's threads from the scheduler's nanosecond counts
    (/proc/PID/task/*/schedstat): psutil's clock ticks are 10 ms, about all that a quick run's
    heartbeats, or a quick consume, cost a process. psutil.NoSuchProcess once the process is gone."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        raise psutil.NoSuchProcess(pid) from None
    total = 0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except FileNotFoundError:       # a thread that just ended
            pass
    return total / 1e9


def actor_cpu(node: Node) -> dict[str, float]:
    """CPU seconds per actor so far."""
    return {name: cpu_seconds(p.pid) for name, p in actor_processes(node).items()}


@contextmanager
def broker_node(workdir: Path, settings: dict | None = None):
    """A fresh node on its own store, removed when the node is gone: a full run starts ~20 nodes,
    and their stores together (5 GB for rss alone) must not push the disk towards the watermarks."""
    base = Path(tempfile.mkdtemp(dir=workdir))
    node = start_broker(base / "node", {**NODE, **(settings or {})})
    try:
        yield node, f"127.0.0.1:{node.port}"
        node.stop()
    finally:
        node.reap()
        shutil.rmtree(base, ignore_errors=True)


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(p / 100 * len(sorted_values)))]


def fill(addr: str, messages: int, body: bytes = BODY, batch: int = 32, properties: tuple[str, ...] = ("",)) -> None:
    """Store `messages` messages spread over the queues (batched sends, several in flight); the
    items of a batch take `properties` in turn."""
    async def main() -> None:
        client = RemotingClient()
        conn = await client.connection(addr)
        items = [(body, properties[i % len(properties)]) for i in range(batch)]
        per_request = [batch_command(TOPIC, items, queue_id=q) for q in range(QUEUES)]
        sem = asyncio.Semaphore(16)
        n_requests = -(-messages // batch)

        async def one(i: int) -> None:
            async with sem:
                r = await conn.invoke(per_request[i % QUEUES], 30.0)
                assert r.code == ResponseCode.SUCCESS, r.remark
        await asyncio.gather(*(one(i) for i in range(n_requests)))
        await client.close()
    asyncio.run(main())


def max_offsets(node: Node) -> dict[str, int]:
    out = {str(q): 0 for q in range(QUEUES)}
    from smartgo.actors.board import Board
    board = Board.open(node.store / "run" / "board", writable=False)
    try:
        for topic, q, v in board.queues.items():
            if topic == TOPIC:
                out[str(q)] = v["max_offset"]
    finally:
        board.close()
    return out


def wait_dispatched(node: Node, timeout: float = 300) -> None:
    from tests.support.waits import wait_until
    wait_until(lambda: (f := node.health()["fields"])["commitlog.dispatched"] == f["commitlog.written"],
               timeout=timeout, interval=0.1, message="dispatch to catch up")


# ---- scenarios ----------------------------------------------------------------------------------------------

def scenario_batch(workdir: Path, seconds: float, extra: dict, depth: int) -> dict:
    with broker_node(workdir, extra) as (node, addr):
        results, cpu = run_workers([("batch", {"addr": addr, "seconds": seconds, "depth": depth, "batch": 32})], node)
    r = results[0]
    return {"msgs_s": r["msgs"] / r["seconds"], "depth": depth, "errors": r["errors"],
            "cpu_us_per_msg": _cpu_per_msg(cpu, r["msgs"]),
            "loadgen_cpu_s": round(r["cpu_s"], 2), "cpu_s": _rounded(cpu)}


@dataclass(frozen=True)
class SyncLoad:
    """How the 16 sync producers are run: worker kind, processes, connections (all processes)."""
    worker: str = "sync"
    processes: int = 1
    connections: int = 16
    producers: int = 16


def scenario_sync(workdir: Path, seconds: float, extra: dict, load: SyncLoad) -> dict:
    with broker_node(workdir, extra) as (node, addr):
        results, cpu = run_workers(sync_jobs(addr, seconds, extra, load), node)
    return sync_figures(results, cpu)


def sync_jobs(addr: str, seconds: float, extra: dict, load: SyncLoad) -> list[tuple[str, dict]]:
    """The load generator processes of a sync scenario against `addr` (for run_workers)."""
    return [(load.worker, {"addr": addr, "seconds": seconds, "producers": load.producers // load.processes,
                           "connections": max(1, load.connections // load.processes),
                           "busy_poll_us": extra.get("net_busy_poll_us", 0)})
            for _ in range(load.processes)]


def sync_figures(results: list[dict], cpu: dict[str, float]) -> dict:
    """A sync scenario's figures from its load generators' results and the broker's CPU."""
    msgs = sum(r["msgs"] for r in results)
    lat = sorted(x for r in results for x in r["latencies"])
    return {"msgs_s": msgs / max(r["seconds"] for r in results), "p50_ms": percentile(lat, 50) * 1000,
            "p99_ms": percentile(lat, 99) * 1000, "errors": sum(r["errors"] for r in results),
            "cpu_us_per_msg": _cpu_per_msg(cpu, msgs), "loadgen_cpu_s": round(sum(r["cpu_s"] for r in results), 2),
            "connections": sum(r["connections"] for r in results), "cpu_s": _rounded(cpu)}


def drain_backlog(node: Node, addr: str, **subscription: str) -> dict:
    """Two pull processes, half the queues each, from offset 0 to the dispatched end: msgs/s
    (offsets passed), msgs, errors, broker CPU-us per message. subscription: subscription= and
    expression_type= of every pull (default "*", TAG)."""
    upto = max_offsets(node)
    halves = [list(range(0, QUEUES, 2)), list(range(1, QUEUES, 2))]
    results, cpu = run_workers([("pull", {"addr": addr, "seconds": 120, "queues": h, "upto": upto, **subscription})
                                for h in halves], node)
    msgs = sum(r["msgs"] for r in results)
    return {"msgs_s": msgs / max(r["seconds"] for r in results), "msgs": msgs,
            "errors": sum(r["errors"] for r in results), "cpu_us_per_msg": _cpu_per_msg(cpu, msgs)}


def scenario_pull(workdir: Path, backlog: int, extra: dict) -> dict:
    with broker_node(workdir, extra) as (node, addr):
        fill(addr, backlog)
        wait_dispatched(node)
        return drain_backlog(node, addr)


#: What the pullsql backlog's messages carry: a tag, a key and three user properties, half in "eu".
SQL_PROPERTIES = tuple(message_properties(tags="Order", keys=f"order-{i}", extra={
    "region": ("eu", "us")[i % 2], "amount": str(10 * i), "channel": "web"}) for i in range(8))
SQL_SELECTOR = "region = 'eu' AND amount >= 0 AND channel IN ('web', 'app')"


def scenario_pull_sql(workdir: Path, backlog: int, extra: dict) -> dict:
    """The same backlog drained twice on one node: with "*" (TAG), then with SQL_SELECTOR."""
    with broker_node(workdir, extra) as (node, addr):
        fill(addr, backlog, properties=SQL_PROPERTIES)
        wait_dispatched(node)
        tag = drain_backlog(node, addr)
        sql = drain_backlog(node, addr, subscription=SQL_SELECTOR, expression_type="SQL92")
    return {"tag_msgs_s": tag["msgs_s"], "tag_cpu_us_per_msg": tag["cpu_us_per_msg"],
            "sql_msgs_s": sql["msgs_s"], "sql_cpu_us_per_msg": sql["cpu_us_per_msg"],
            "sql_to_tag": sql["msgs_s"] / tag["msgs_s"], "errors": tag["errors"] + sql["errors"]}


def scenario_wake(workdir: Path, samples: int, extra: dict) -> dict:
    with broker_node(workdir, {**extra, "topics": f"{TOPIC}:{QUEUES};Wake:1"}) as (node, addr):
        results, _ = run_workers([("wake", {"addr": addr, "samples": samples, "offset": 0})], node)
    lat = results[0]["latencies"]
    return {"p50_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000,
            "max_ms": lat[-1] * 1000, "samples": len(lat)}


def scenario_rss(workdir: Path, backlog_bytes: int, read_bytes: int, extra: dict) -> dict:
    body = b"r" * (16 * 1024)
    with broker_node(workdir, {**extra, "commitlog_file_size": 1 << 30}) as (node, addr):
        fill(addr, backlog_bytes // len(body), body=body, batch=8)
        wait_dispatched(node)
        upto = {q: min(v, read_bytes // len(body) // QUEUES) for q, v in max_offsets(node).items()}
        run_workers([("pull", {"addr": addr, "seconds": 300, "queues": list(range(QUEUES)), "upto": upto})], node)
        per_actor = {name: p.memory_info().rss for name, p in actor_processes(node).items()}
        written = node.health()["fields"]["commitlog.written"]
    return {"rss_mb": sum(per_actor.values()) / 2**20, "backlog_gb": written / 2**30,
            "per_actor_mb": {k: round(v / 2**20, 1) for k, v in per_actor.items()}}


def probed(fn) -> dict:
    """fn()'s figures plus host_probe_ms, the host speed while it ran."""
    with HostProbe() as probe:
        figures = fn()
    return {**figures, "host_probe_ms": probe.ms}


def _cpu_per_msg(cpu: dict[str, float], msgs: int) -> float:
    return sum(cpu.values()) / max(msgs, 1) * 1e6


def _rounded(cpu: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in cpu.items()}


def median_of(runs: list[dict]) -> dict:
    """Per numeric key, the median over the runs (other keys from the last run)."""
    out = dict(runs[-1])
    for key, value in runs[-1].items():
        if isinstance(value, (int, float)):
            out[key] = round(statistics.median(r[key] for r in runs), 3)
    out["runs"] = len(runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few-second smoke run with small sizes")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--runs", type=int, default=3, help="runs per scenario (median reported)")
    ap.add_argument("--only", default="", help=f"comma-separated scenarios ({','.join(SCENARIOS)})")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per throughput run")
    ap.add_argument("--net-actors", type=int, default=0, help="net actors for the non-scaling scenarios "
                                                               "(0: the node default)")
    ap.add_argument("--profile", metavar="DIR", help="write cProfile stats of the net and commit actors to DIR")
    ap.add_argument("--batch-depth", type=int, default=32, help="batch requests in flight on the one connection "
                                                                  "(an async producer's window; 8 is latency-bound)")
    ap.add_argument("--busy-poll-us", type=int, default=0, help="busy-poll window of the net actors and of the sync "
                                                                 "producers (smartgo.net.busy_poll; 0: off)")
    ap.add_argument("--sync-processes", type=int, default=1,
                    help="load generator processes sharing the 16 sync producers (1 measured best on 2 cores: "
                         "each process adds its own loop's wake-ups)")
    ap.add_argument("--raw-producers", action="store_true",
                    help="sync scenarios: producers on raw connections with pre-encoded frames instead of "
                         "RemotingClient (less load-generator CPU on the shared cores)")
    ap.add_argument("--sync-connections", type=int, default=16,
                    help="connections the 16 sync producers share (16: one each; 1: one for all, as the threads of "
                         "RocketMQ's benchmark Producer share one DefaultMQProducer); RemotingClient producers only")
    ap.add_argument("--commit-actor", action="store_true",
                    help="run the commit stage in its own actor (commit_in_net = false), as a node with several "
                         "net actors does; by default a node with one net actor runs it inside the net actor")
    ap.add_argument("--java-wire", action="store_true",
                    help="sync scenarios: the 16 producers on one connection with the Java client's JSON headers, "
                         "as RocketMQ's benchmark Producer puts them on the wire (issue 46)")
    args = ap.parse_args()
    if args.raw_producers and args.sync_connections != 16:
        ap.error("--raw-producers runs one connection per producer: leave --sync-connections at 16")
    if args.java_wire and (args.raw_producers or args.sync_processes != 1):
        ap.error("--java-wire is one process and one connection: no --raw-producers or --sync-processes")
    worker = "java_sync" if args.java_wire else "raw_sync" if args.raw_producers else "sync"
    load = SyncLoad(worker, args.sync_processes, 1 if args.java_wire else args.sync_connections)
    quick = args.quick
    runs = 1 if quick else args.runs
    seconds = 1.5 if quick else args.seconds
    only = set(filter(None, args.only.split(","))) or set(SCENARIOS)
    if quick:
        only -= {"rss", "syncflush", "scaling"}
    extra: dict = {"net_actors": args.net_actors} if args.net_actors else {}
    if args.busy_poll_us:
        extra["net_busy_poll_us"] = args.busy_poll_us
    if args.commit_actor:
        extra["commit_in_net"] = False
    if args.profile:
        os.environ["SMARTGO_PROFILE_DIR"] = str(Path(args.profile).resolve())
    results: dict = {"quick": quick, "accel": accel.in_use(), "raw_producers": args.raw_producers,
                     "java_wire": args.java_wire, "commit_actor": args.commit_actor,
                     "sync_processes": args.sync_processes,
                     "sync_connections": args.sync_connections,
                     "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="bench_broker_") as tmp:
        work = Path(tmp)

        def repeat(name: str, fn) -> None:
            results[name] = median_of([probed(fn) for _ in range(runs)])
            print(f"{name}: {results[name]}", file=sys.stderr)

        if "batch" in only:
            repeat("batch", lambda: scenario_batch(work, seconds, extra, args.batch_depth))
        if "sync" in only:
            repeat("sync", lambda: scenario_sync(work, seconds, extra, load))
        if "syncflush" in only:
            repeat("syncflush", lambda: scenario_sync(work, seconds, {**extra, "flush": "sync"}, load))
        if "pull" in only:
            repeat("pull", lambda: scenario_pull(work, 20_000 if quick else 1_000_000, extra))
        if "pullsql" in only:
            repeat("pullsql", lambda: scenario_pull_sql(work, 20_000 if quick else 1_000_000, extra))
        if "wake" in only:
            repeat("wake", lambda: scenario_wake(work, 30 if quick else 300, extra))
        if "scaling" in only:
            for n in ((1, 2) if quick else (1, 2, 4)):
                repeat(f"scaling_net{n}", lambda n=n: scenario_sync(work, seconds, {"net_actors": n}, load))
        if "rss" in only:
            repeat("rss", lambda: scenario_rss(work, 5 << 30, 1 << 30, extra))
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    results["targets"] = TARGETS
    results["pass"] = {k: _passes(results, k) for k in TARGETS if _figure(results, k) is not None}
    if args.json:
        print(json.dumps(results))
    else:
        print(json.dumps(results, indent=1))


def _figure(results: dict, key: str) -> float | None:
    scenario, _, metric = key.partition("_")
    return results.get(scenario, {}).get(metric)


def _passes(results: dict, key: str) -> bool:
    value = _figure(results, key)
    return value <= TARGETS[key] if key.endswith(("_ms", "_mb")) else value >= TARGETS[key]


if __name__ == "__main__":
    main()
