"""Connections benchmark (issue 45): how many idle MQTT devices a node holds and what each costs, SmartGo
side by side with Mosquitto 2 (Debian's package), same load generator (smartgo/mqtt/swarm.py), in one run.

Every device is one MQTT 3.1.1 connection (client id `d<id>`, keep-alive 300 s, clean session) subscribed
at QoS 1 to `devices/<id>/cmd`. The devices grow in steps (default 1k, 10k, 100k, 250k, 500k, 1M, each
step adding to the last) and after each step, with all of them connected:
  connect rate    devices set up (CONNACK and SUBACK) a second over the step, and TCP accepts a second
  memory          PSS (/proc/PID/smaps_rollup: shared pages counted once) of every process of the broker,
                  its growth per device from the baseline with none (and per process for SmartGo)
  kernel memory   per device, reported apart: TCP buffer memory (/proc/net/sockstat `mem` pages) and the
                  slab caches of a socket (/proc/slabinfo: TCP, sock_inode_cache, filp, dentry, eventpoll_epi);
                  machine-wide, so both ends of each loopback connection (the load generator's end too)
  settle          after a step, the seconds until the broker went quiet (a second under 1.5 x its CPU at
                  rest with no device + 10 % of a core): memory, CPU and latencies are read after it
  CPU at rest     the broker's processes over --rest seconds with every device idle, % of one core
                  (and the busiest processes)
  load generator  PSS of the swarm's processes per device (its whole size: interpreters included)
  ping p99        a PINGREQ to every device, spread at --ping-rate a second: round trip p50/p99
  command p99     --commands QoS 1 publishes to random devices at --command-rate a second from one more
                  MQTT connection (SmartGo: also through the RocketMQ API, topic MQTT, tag = MQTT topic):
                  publish -> arrival at exactly that device, p50/p99
SmartGo is a real node (supervisor.py, role master) with mqtt_actors = ceil(largest step / 18,000), so no
actor holds more connections than its descriptor limit allows. Mosquitto is one process: its column stops at
the first step it cannot hold (its descriptor limit, or the failures seen), saying why. The brokers run one
after the other (the kernel's socket memory is machine-wide). Stores and configs live in a temporary
directory, removed at the end.

    .venv/bin/python benchmarks/bench_connections.py [--steps 1000,10000,100000] [--brokers smartgo,mosquitto]
                                                    [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_mqtt import MOSQUITTO, MOSQUITTO_CONF, Broker, _spawn  # noqa: E402
from smartgo.mqtt.swarm import (PSS_FIELDS, Arrival, Commander, Grown, Swarm, SwarmConfig, percentile,  # noqa: E402
                                pss_kib, pss_parts, socket_slab_kib, tcp_mem_kib)
from tests.support.broker import start_broker  # noqa: E402
from tests.support.nodes import warnings_in  # noqa: E402
from tests.support.waits import LOOPBACK, free_port  # noqa: E402

BROKERS = ("smartgo", "mosquitto")
STEPS = (1_000, 10_000, 100_000, 250_000, 500_000, 1_000_000)
QUICK_STEPS = (300, 1_000)
PER_ACTOR = 18_000          # connections an MQTT actor (or a load generator process) holds at most
NODE = {"log_level": "WARNING", "mqtt_ws_port": 0}


def _open_files_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise RuntimeError(f"no open-files limit in /proc/{pid}/limits")


def _processes(root_pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


class Target:
    """A broker under test: its port, its processes by name, how to stop it."""

    def __init__(self, broker: Broker, node: object = None) -> None:
        self.broker = broker
        self.node = node            # tests.support.nodes.Node for SmartGo
        self.name = broker.name
        self.port = broker.port
        self.limit = None if node else _open_files_limit(broker.root_pid) - 10   # listener, log, ...

    def named(self) -> dict[str, int]:
        """pid of each process: SmartGo's actors by name (health report), the supervisor, the rest by pid."""
        names = {self.broker.root_pid: "supervisor" if self.node else self.name}
        if self.node is not None:
            report = self.node.health() or {"actors": []}  # type: ignore[attr-defined]  # a Node
            names.update({a["pid"]: a["name"] for a in report["actors"] if a.get("pid")})
        return {names.get(p.pid, f"{p.name()}-{p.pid}"): p.pid for p in _processes(self.broker.root_pid)}

    def memory(self) -> dict[str, dict[str, int]]:
        """PSS (KiB) of each process, and its anonymous, file and shared-memory parts."""
        return {name: pss_parts(pid) for name, pid in self.named().items()}

    def settle(self, least: float, most: float, quiet_pct: float) -> float:
        """Wait at least `least` s, then until a second in which the broker used under `quiet_pct` % of a
        core (after a connect storm SmartGo's actors work on for a while), at most `most` s: the wait."""
        start = time.monotonic()
        time.sleep(least)
        while time.monotonic() - start < most:
            before = self.broker.cpu_s()
            time.sleep(1.0)
            if (self.broker.cpu_s() - before) * 100 < quiet_pct:
                break
        return round(time.monotonic() - start, 1)

    def cpu_at_rest(self, seconds: float) -> tuple[float, dict[str, float]]:
        """% of one core the broker's processes used over `seconds`: in all, and by process (the busiest)."""
        def times() -> dict[str, float]:
            out = {}
            for name, pid in self.named().items():
                try:
                    t = psutil.Process(pid).cpu_times()
                except psutil.NoSuchProcess:
                    continue
                out[name] = t.user + t.system
            return out
        before, total = times(), self.broker.cpu_s()
        time.sleep(seconds)
        after, total = times(), self.broker.cpu_s() - total
        busy = sorted(((n, (after[n] - before.get(n, 0.0)) / seconds * 100) for n in after), key=lambda x: -x[1])
        return round(total / seconds * 100, 2), {n: round(pct, 2) for n, pct in busy[:8]}


def start_target(name: str, work: Path, actors: int) -> Target:
    port = free_port()
    if name == "smartgo":
        node = start_broker(work / "smartgo", {**NODE, "mqtt_port": port, "mqtt_actors": actors})

        def stop() -> None:
            try:
                node.stop(timeout=120)
            finally:
                node.reap()
        node.wait_healthy(timeout=120)
        return Target(Broker("smartgo", port, node.proc.pid, stop), node)
    if not Path(MOSQUITTO).exists():
        raise RuntimeError(f"no {MOSQUITTO}: apt-get install mosquitto")
    conf = work / "mosquitto.conf"
    conf.write_text(MOSQUITTO_CONF.format(port=port, host=LOOPBACK) + "max_connections -1\n")
    return Target(_spawn("mosquitto", [MOSQUITTO, "-c", str(conf)], port, work / "mosquitto.log"))


def commands(swarm: Swarm, send: object, count: int, rate: float, wait: float = 15.0) -> dict:
    """`count` commands to random devices through send(device) -> stamp, at `rate` a second: how many
    arrived at exactly their device, and publish -> arrival p50/p99/max."""
    swarm.arrivals()                            # forget what came before
    expect: dict[int, int] = {}                 # stamp -> device
    start = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        device = random.randrange(swarm.devices)
        expect[send(device)] = device  # type: ignore[operator]  # a callable
    got: list[Arrival] = []
    deadline = time.monotonic() + wait
    while len(got) < count and time.monotonic() < deadline:
        got += swarm.arrivals()
        time.sleep(0.05)
    right = [a for a in got if expect.get(a.sent_ns) == a.device and a.own_topic]
    latencies = sorted(a.latency_ms for a in right)
    return {"sent": count, "arrived": len(right), "wrong": len(got) - len(right),
            "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
            "max_ms": latencies[-1] if latencies else None}


def rocketmq_sender(target: Target) -> tuple[object, object]:
    """send(device) -> stamp through the RocketMQ API (a Producer of the SmartGo client), and close()."""
    from smartgo.client.blocking import Producer
    from smartgo.client.message import Message
    producer = Producer("bench_connections", f"{LOOPBACK}:{target.node.registry_port}")  # type: ignore[attr-defined]
    producer.start()

    def send(device: int) -> int:
        stamp = time.monotonic_ns()
        producer.send(Message("MQTT", stamp.to_bytes(8, "big") + bytes(8), tags=f"devices/{device}/cmd"))
        return stamp
    return send, producer.close


def _totals(memory: dict[str, dict[str, int]]) -> dict[str, int]:
    return {f: sum(parts[f] for parts in memory.values()) for f in PSS_FIELDS}


def measure_step(target: Target, swarm: Swarm, step: int, grown: Grown, base: dict, args: argparse.Namespace) -> dict:
    counts = swarm.counts()
    held = counts["open"]
    settled = target.settle(args.settle, args.settle_max, base["quiet_pct"])
    memory = target.memory()
    tcp_kib, slab_kib = tcp_mem_kib(), socket_slab_kib()
    added = max(1, held)
    total = _totals(memory)
    zero = dict.fromkeys(PSS_FIELDS, 0)

    def per_conn(now: dict[str, int], then: dict[str, int]) -> dict[str, float]:
        return {f"{f.lower()}_kib_per_conn": round((now[f] - then[f]) / added, 2) for f in PSS_FIELDS}
    figures: dict = {
        "step": step, "connections": held, "connect_rate": grown.rate, "accept_rate": grown.accept_rate,
        "connect_seconds": grown.seconds, "failures": grown.failures, "settle_seconds": settled,
        "pss_mib": round(total["Pss"] / 1024, 1), **per_conn(total, base["totals"]),
        "pss_kib_per_conn_marginal": round((total["Pss"] - base["last"][0]) / max(1, held - base["last"][1]), 2),
        "processes": {name: {"pss_kib": parts["Pss"], **per_conn(parts, base["processes"].get(name, zero))}
                      for name, parts in sorted(memory.items())},
        "tcp_mem_kib_per_conn": round((tcp_kib - base["tcp_kib"]) / added, 2),
        "slab_kib_per_conn": None if slab_kib is None else round((slab_kib - base["slab_kib"]) / added, 2),
        "swarm_kib_per_conn": round(sum(pss_kib(p) for p in swarm.pids()) / max(1, held), 2)}
    figures["cpu_rest_pct"], figures["cpu_rest_busiest"] = target.cpu_at_rest(args.rest)
    pinged = swarm.ping(spread=max(1.0, held / args.ping_rate), timeout=30)
    figures["ping"] = {"sent": pinged.sent, "answered": pinged.answered, "p50_ms": pinged.percentile(50),
                       "p99_ms": pinged.percentile(99)}
    commander = Commander(LOOPBACK, target.port, client_id=f"commander-{os.getpid()}")
    try:
        figures["command"] = commands(swarm, commander.send, args.commands, args.command_rate)
        figures["command"]["unacked"] = commander.drain()
    finally:
        commander.close()
    if target.node is not None and args.rocketmq:
        send, close = rocketmq_sender(target)
        try:
            figures["rocketmq_command"] = commands(swarm, send, max(1, args.commands // 2), args.command_rate)
        finally:
            close()  # type: ignore[operator]  # a callable
    lost = swarm.counts()["lost"] - counts["lost"]
    figures["lost"] = lost
    base["last"] = (total["Pss"], held)
    return figures


def run_broker(name: str, steps: list[int], work: Path, args: argparse.Namespace) -> dict:
    actors = args.mqtt_actors or math.ceil(max(steps) / PER_ACTOR)
    try:
        target = start_target(name, work, actors)
    except Exception as exc:                    # the other broker still runs; the table says why
        return {"available": False, "reason": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
    out: dict = {"available": True, "steps": [], "stopped": None}
    if name == "smartgo":
        out["mqtt_actors"] = actors
    try:
        with Swarm(SwarmConfig(LOOPBACK, target.port, per_worker=PER_ACTOR, per_source=args.per_source)) as swarm:
            time.sleep(args.settle)
            memory = target.memory()
            base = {"totals": _totals(memory), "processes": memory, "tcp_kib": tcp_mem_kib(),
                    "slab_kib": socket_slab_kib() or 0}
            base["last"] = (base["totals"]["Pss"], 0)
            out["baseline"] = {"pss_mib": round(base["totals"]["Pss"] / 1024, 1), "processes": memory}
            out["baseline"]["cpu_rest_pct"], out["baseline"]["cpu_rest_busiest"] = target.cpu_at_rest(args.rest)
            base["quiet_pct"] = out["baseline"]["cpu_rest_pct"] * 1.5 + 10
            for step in steps:
                if target.limit is not None and step > target.limit:
                    out["stopped"] = (f"{step:,} connections need {step:,} descriptors; one {name} process may have "
                                      f"{target.limit + 10:,} (Max open files in /proc/PID/limits)")
                    break
                grown = swarm.grow(step - swarm.devices, _progress_line(name, step))
                print(file=sys.stderr)
                figures = measure_step(target, swarm, step, grown, base, args)
                out["steps"].append(figures)
                print(f"{name} {step:,}: {_summary(figures)}", file=sys.stderr, flush=True)
                if grown.failed:
                    out["stopped"] = f"{grown.failed:,} connections failed at {step:,}: {grown.failures}"
                    break
            out["failures"] = swarm.failures()
            if out["failures"] and target.node is not None:    # the node log says why; it goes with the store
                out["node_warnings"] = warnings_in(target.node.store, 20)  # type: ignore[attr-defined]  # a Node
    finally:
        target.broker.stop()
    return out


def _progress_line(name: str, step: int):  # noqa: ANN202 - a callback
    def show(counts: dict[str, int], elapsed: float) -> None:
        print(f"\r{name} -> {step:,}: {counts['subscribed']:,} subscribed, {counts['failed']:,} failed, "
              f"{elapsed:.1f} s", end="", file=sys.stderr, flush=True)
    return show


def _summary(f: dict) -> str:
    return (f"{f['connect_rate']:,.0f} conn/s, PSS {f['pss_kib_per_conn']} KiB/conn "
            f"(anon {f['pss_anon_kib_per_conn']}), kernel "
            f"{f['tcp_mem_kib_per_conn']} KiB/conn, ping p99 {f['ping']['p99_ms']} ms "
            f"({f['ping']['answered']:,}/{f['ping']['sent']:,}), command p99 {f['command']['p99_ms']} ms "
            f"({f['command']['arrived']}/{f['command']['sent']}), CPU at rest {f['cpu_rest_pct']} %")


ROWS = (("connect rate /s", "connect_rate"), ("accepts /s", "accept_rate"), ("settled after, s", "settle_seconds"),
        ("PSS MiB", "pss_mib"),
        ("PSS KiB/conn", "pss_kib_per_conn"), ("  since the step before", "pss_kib_per_conn_marginal"),
        ("  anonymous", "pss_anon_kib_per_conn"),
        ("  file-mapped", "pss_file_kib_per_conn"), ("  shared memory", "pss_shmem_kib_per_conn"),
        ("kernel TCP buffers KiB/conn", "tcp_mem_kib_per_conn"), ("kernel socket slabs KiB/conn", "slab_kib_per_conn"),
        ("ping p99 ms", ("ping", "p99_ms")), ("command p99 ms", ("command", "p99_ms")),
        ("RocketMQ command p99 ms", ("rocketmq_command", "p99_ms")), ("CPU at rest %", "cpu_rest_pct"),
        ("load generator KiB/conn", "swarm_kib_per_conn"))


def _value(step: dict | None, key: str | tuple[str, str]) -> object:
    if step is None:
        return None
    if isinstance(key, tuple):
        return (step.get(key[0]) or {}).get(key[1])
    return step.get(key)


def table(results: dict, steps: list[int], brokers: list[str]) -> str:
    lines = []
    for step in steps:
        cells = [(f"{step:,} connections", *brokers)]
        found = {b: next((s for s in results[b].get("steps", []) if s["step"] == step), None) for b in brokers}
        for label, key in ROWS:
            cells.append((label, *(_cell(_value(found[b], key)) for b in brokers)))
        widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
        lines += ["  ".join(c[i].rjust(w) if i else c[i].ljust(w) for i, w in enumerate(widths)) for c in cells]
        lines.append("")
    for b in brokers:
        if results[b].get("stopped"):
            lines.append(f"{b}: stopped: {results[b]['stopped']}")
        if not results[b].get("available", True):
            lines.append(f"{b}: not available: {results[b]['reason']}")
    return "\n".join(lines)


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and abs(v) < 100:
        return f"{v:.2f}"
    return f"{v:,.0f}" if isinstance(v, (int, float)) else str(v)


def engine_heap(devices: int, prefer_uvloop: bool) -> dict:
    """Where an idle connection's memory goes inside an MQTT actor's engine: an Engine (with the
    store side of tests/support/engine.py, which stores nothing) serving swarm devices on the event loop
    the actors use, in this process. First `devices` devices without tracing: anonymous PSS and the new
    objects the garbage collector tracks, per device; then as many more under tracemalloc: the Python
    allocations per device by source line (what uvloop/libuv allocate in C is not traced: the gap
    between the two is theirs)."""
    import gc
    import threading

    from smartgo.mqtt.auth import Authenticator
    from smartgo.mqtt.engine import Connection, Engine, Limits
    from smartgo.net.loop import new_event_loop
    from tests.support.engine import Store
    loop = new_event_loop(prefer_uvloop)
    engine = Engine(Limits(), Store(), Authenticator())
    port = free_port()
    def factory() -> Connection:
        return Connection(engine, "tcp")
    server = loop.run_until_complete(loop.create_server(factory, LOOPBACK, port, backlog=4096))
    swarm = Swarm(SwarmConfig(LOOPBACK, port, per_worker=PER_ACTOR, first_source=200))

    def grow() -> Grown:
        result: list[Grown] = []
        thread = threading.Thread(target=lambda: result.append(swarm.grow(devices)), daemon=True)
        thread.start()
        while thread.is_alive():                # the engine serves while the swarm connects
            loop.run_until_complete(asyncio.sleep(0.05))
        failures.update(result[0].failures)
        return result[0]
    failures: Counter[str] = Counter()
    try:
        gc.collect()
        seen = {id(o) for o in gc.get_objects()}
        anon = pss_parts(os.getpid())["Pss_Anon"]
        first = grow().subscribed
        gc.collect()
        anon = pss_parts(os.getpid())["Pss_Anon"] - anon
        kinds: Counter[str] = Counter()
        sizes: Counter[str] = Counter()
        for o in gc.get_objects():
            if id(o) not in seen:
                kinds[type(o).__name__] += 1
                sizes[type(o).__name__] += sys.getsizeof(o)
        del seen
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        second = grow().subscribed
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        lines = [(_where(d.traceback[0], factory.__code__.co_firstlineno + 1), d.size_diff, d.count_diff)
                 for d in after.compare_to(before, "lineno")[:15]]
        traced = sum(d.size_diff for d in after.compare_to(before, "filename"))
    finally:
        swarm.close()
        server.close()
        loop.run_until_complete(asyncio.sleep(0.2))
        loop.close()
    first, second = max(1, first), max(1, second)
    return {"devices": devices, "loop": "uvloop" if prefer_uvloop else "asyncio", "failures": dict(failures),
            "anon_kib_per_conn": round(anon / first, 2),
            "traced_bytes_per_conn": round(traced / second),
            "objects_per_conn": {k: {"count": round(n / first, 2), "bytes": round(sizes[k] / first)}
                                 for k, n in kinds.most_common(12)},
            "top_lines": [{"line": line, "bytes_per_conn": round(size / second), "blocks_per_conn":
                           round(count / second, 2)} for line, size, count in lines]}


def _where(frame: tracemalloc.Frame, factory_line: int) -> str:
    """A traced allocation's source line; those made while this file's frame was the innermost are the
    protocol factory's (the Connection object) or the event loop's own, in C (transport, handles)."""
    if frame.filename == __file__:
        return "Connection() (the protocol factory)" if frame.lineno == factory_line else \
            "the event loop's C code (transport, socket handle)"
    return f"{frame.filename.split('/site-packages/')[-1].replace(str(ROOT) + '/', '')}:{frame.lineno}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default=",".join(map(str, STEPS)), help="connection counts, ascending")
    ap.add_argument("--brokers", default=",".join(BROKERS), help=f"comma-separated ({','.join(BROKERS)})")
    ap.add_argument("--quick", action="store_true", help=f"steps {QUICK_STEPS}, short waits")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--commands", type=int, default=200, help="MQTT commands per step (half as many via RocketMQ)")
    ap.add_argument("--command-rate", type=float, default=100.0, help="commands a second")
    ap.add_argument("--ping-rate", type=float, default=20_000.0, help="PINGREQs a second over all devices")
    ap.add_argument("--rest", type=float, default=5.0, help="seconds of the CPU-at-rest measurement")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds to wait at least before memory is read")
    ap.add_argument("--settle-max", type=float, default=180.0,
                    help="then at most this long for the broker to go quiet (its CPU under 1.5 x at rest + 10 %%)")
    ap.add_argument("--per-source", type=int, default=25_000, help="devices per loopback source address")
    ap.add_argument("--no-rocketmq", dest="rocketmq", action="store_false", help="no commands via RocketMQ")
    ap.add_argument("--mqtt-actors", type=int, default=0,
                    help=f"SmartGo's MQTT actors (default: the largest step / {PER_ACTOR:,}, rounded up)")
    ap.add_argument("--engine-heap", type=int, default=0, metavar="N",
                    help="also profile an in-process MQTT engine holding N (then 2N) devices, uvloop and asyncio")
    args = ap.parse_args()
    steps = list(QUICK_STEPS) if args.quick else sorted(int(s) for s in args.steps.split(",") if s)
    fds = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if 2 * args.engine_heap + 1000 > fds:
        ap.error(f"--engine-heap {args.engine_heap}: this process would hold {2 * args.engine_heap:,} connections; "
                 f"it may open {fds:,} files (at most {(fds - 1000) // 2:,})")
    if args.quick:
        args.commands, args.rest, args.settle, args.settle_max, args.per_source = 40, 1.0, 1.0, 20.0, 500
    brokers = [b for b in args.brokers.split(",") if b]
    if set(brokers) - set(BROKERS):
        ap.error(f"unknown broker: {', '.join(sorted(set(brokers) - set(BROKERS)))}")
    results: dict = {"steps": steps, "quick": args.quick, "cpus": os.cpu_count(),
                     "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_connections_") as tmp:
        for name in brokers:
            (Path(tmp) / name).mkdir()
            results[name] = run_broker(name, steps, Path(tmp) / name, args)
    if args.engine_heap:
        results["engine_heap"] = []
        for prefer in (True, False):
            try:
                results["engine_heap"].append(engine_heap(args.engine_heap, prefer))
            except Exception as exc:            # the broker figures above still count
                results["engine_heap"].append({"error": f"{type(exc).__name__}: {exc}"})
    results["seconds"] = round(time.monotonic() - started, 1)
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    text = table(results, steps, brokers)
    print(text, file=sys.stderr if args.json else sys.stdout)
    print(json.dumps(results) if args.json else json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
