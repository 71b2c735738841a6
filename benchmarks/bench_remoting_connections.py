"""RocketMQ remoting connections benchmark (issue 45): what 100,000 RocketMQ clients, each on its own connection
heartbeating every 30 s, cost a SmartGo node - target <= 10 % of one core and <= 3 KiB of memory a connection.

The clients come from smartgo/client/swarm.py: each behaves like a RocketMQ 4.x Java push consumer's connection
to the broker (HEART_BEAT in the Java client's JSON encoding right after connect, then every --heartbeat-interval
seconds, spread evenly; one of --groups consumer groups, CLUSTERING, one topic "*", the CLIENT_INNER_PRODUCER
producer group). They grow in steps (default 1k, 10k, 50k, 100k, each adding to the last); after each step:
  connect rate    clients registered (first HEART_BEAT answered SUCCESS) a second, and TCP accepts a second
  settle          the seconds until the broker stopped pushing NOTIFY_CONSUMER_IDS_CHANGED (each join
                  notifies every member of its group) and went quiet; memory and CPU are read after it
  memory          PSS (/proc/PID/smaps_rollup) summed over every process of the node, its growth per
                  connection from the baseline with none, and per process (net-N, broker, ...)
  kernel memory   per connection, apart: TCP buffers (/proc/net/sockstat) and socket slabs (/proc/slabinfo,
                  when readable); machine-wide, so both ends of each loopback connection
  CPU             % of one core the node's processes used over --window seconds (at least one heartbeat
                  interval) with every client heartbeating, in all and the busiest processes
  heartbeats      sent, answered SUCCESS, refused, late, round trip p50/p99 over that window
  registered      GET_CONSUMER_LIST_BY_GROUP of two groups returns exactly the clients that heartbeat into them
The node is a real one (supervisor.py, role master, embedded registry, MQTT off) sized for the largest step
(remoting_connections: as many net actors as hold it, since one process may hold 20,000 descriptors here).
Its store is a temporary directory, removed at the end.

    .venv/bin/python benchmarks/bench_remoting_connections.py [--steps 1000,10000,50000,100000] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from smartgo.client import api  # noqa: E402
from smartgo.client.swarm import ClientSwarm, ClientSwarmConfig  # noqa: E402
from smartgo.mqtt.swarm import PSS_FIELDS, Grown, SwarmConfig, pss_kib, pss_parts, socket_slab_kib, tcp_mem_kib  # noqa: E402
from smartgo.net.client import BlockingRemotingClient  # noqa: E402
from smartgo.net.codes import RequestCode  # noqa: E402
from smartgo.net.command import RemotingCommand  # noqa: E402
from tests.support.broker import start_broker  # noqa: E402
from tests.support.nodes import warnings_in  # noqa: E402
from tests.support.waits import LOOPBACK  # noqa: E402

STEPS = (1_000, 10_000, 50_000, 100_000)
QUICK_STEPS = (300, 1_000)
NODE = {"log_level": "WARNING", "mqtt_port": 0, "mqtt_ws_port": 0}
TARGET_KIB, TARGET_CPU_PCT, TARGET_AT = 3.0, 10.0, 100_000
PER_PROCESS = 18_000        # connections a load generator process holds: 20,000 descriptors here


class NodeUnderTest:
    """A SmartGo node (master, embedded registry) and its processes by name: the supervisor and its actors."""

    def __init__(self, work: Path, connections: int, actors: int) -> None:
        self.node = start_broker(work, {**NODE, "remoting_connections": connections, "net_actors": actors})
        try:
            self.node.wait_healthy(timeout=120)
        except BaseException:
            self.node.reap()
            raise
        self.port = self.node.port

    def processes(self) -> dict[str, psutil.Process]:
        report = self.node.health() or {"actors": []}
        names = {a["pid"]: a["name"] for a in report["actors"] if a.get("pid")}
        names[self.node.proc.pid] = "supervisor"
        try:
            root = psutil.Process(self.node.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return {}
        return {names.get(p.pid, f"{p.name()}-{p.pid}"): p for p in procs}

    def memory(self) -> dict[str, dict[str, int]]:
        """PSS (KiB) of each process, and its anonymous, file and shared-memory parts."""
        return {name: pss_parts(p.pid) for name, p in self.processes().items()}

    def cpu(self, seconds: float) -> tuple[float, dict[str, float]]:
        """% of one core the node's processes used over `seconds`: in all, and the busiest processes."""
        procs = self.processes()
        before = {name: _cpu_s(p) for name, p in procs.items()}
        time.sleep(seconds)
        used = {name: (_cpu_s(p) - before[name]) / seconds * 100 for name, p in procs.items()}
        busiest = dict(sorted(used.items(), key=lambda item: -item[1])[:6])
        return round(sum(used.values()), 2), {name: round(pct, 2) for name, pct in busiest.items()}

    def stop(self) -> None:
        try:
            self.node.stop(timeout=120)
        finally:
            self.node.reap()


def _cpu_s(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return t.user + t.system + t.children_user + t.children_system


def quiet_groups(port: int, cfg: ClientSwarmConfig) -> None:
    """Create the swarm's consumer groups with notifyConsumerIdsChangedEnable false: a join then notifies no
    member (with it, each join pushes NOTIFY_CONSUMER_IDS_CHANGED to every member of its group: n^2 / 2
    pushes a group)."""
    client = BlockingRemotingClient()
    try:
        for n in range(cfg.groups):
            body = api.subscription_group_body(cfg.group(n), notify_consumer_ids_changed=False)
            request = RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
            resp = client.invoke(f"{LOOPBACK}:{port}", request, timeout=30)
            api.check(resp, f"{LOOPBACK}:{port}", f"create group {cfg.group(n)}")
    finally:
        client.close()


def _totals(memory: dict[str, dict[str, int]]) -> dict[str, int]:
    return {f: sum(parts[f] for parts in memory.values()) for f in PSS_FIELDS}


def settle(swarm: ClientSwarm, least: float, most: float) -> float:
    """Wait at least `least` s, then until a second in which the broker pushed no request to the clients
    (the NOTIFY_CONSUMER_IDS_CHANGED of the joins are out), at most `most` s: the wait."""
    start = time.monotonic()
    time.sleep(least)
    while time.monotonic() - start < most:
        before = swarm.counts()["pushed"]
        time.sleep(1.0)
        if swarm.counts()["pushed"] == before:
            break
    return round(time.monotonic() - start, 1)


def registered(port: int, swarm: ClientSwarm) -> dict:
    """GET_CONSUMER_LIST_BY_GROUP of the first and the last group: the broker's member lists against the
    clients the swarm opened into them."""
    client = BlockingRemotingClient()
    out = {"groups": 0, "expected": 0, "listed": 0, "missing": 0, "unexpected": 0}
    try:
        for n in sorted({0, min(swarm.devices, swarm.client.groups) - 1}):
            group = swarm.client.group(n)
            resp = client.invoke(f"{LOOPBACK}:{port}", api.consumer_list_request(group), timeout=30)
            listed = set(api.decode_consumer_list(resp, f"{LOOPBACK}:{port}"))
            expected = swarm.client_ids(group)
            out["groups"] += 1
            out["expected"] += len(expected)
            out["listed"] += len(listed)
            out["missing"] += len(expected - listed)
            out["unexpected"] += len(listed - expected)
    finally:
        client.close()
    return out


def measure_step(target: NodeUnderTest, swarm: ClientSwarm, step: int, grown: Grown, base: dict,
                 args: argparse.Namespace) -> dict:
    held = swarm.counts()["open"]
    settled = settle(swarm, args.settle, args.settle_max)
    memory = target.memory()
    tcp_kib, slab_kib = tcp_mem_kib(), socket_slab_kib()
    total = _totals(memory)
    added = max(1, held)

    def per_conn(now: dict[str, int], then: dict[str, int]) -> dict[str, float]:
        return {f"{f.lower()}_kib_per_conn": round((now[f] - then[f]) / added, 2) for f in PSS_FIELDS}
    zero = dict.fromkeys(PSS_FIELDS, 0)
    figures: dict = {
        "step": step, "connections": held, "connect_rate": grown.rate, "accept_rate": grown.accept_rate,
        "connect_seconds": grown.seconds, "failures": grown.failures, "settle_seconds": settled,
        "pss_mib": round(total["Pss"] / 1024, 1), **per_conn(total, base["totals"]),
        "processes": {name: {"pss_kib": parts["Pss"], **per_conn(parts, base["processes"].get(name, zero))}
                      for name, parts in sorted(memory.items())},
        "tcp_mem_kib_per_conn": round((tcp_kib - base["tcp_kib"]) / added, 2),
        "slab_kib_per_conn": None if slab_kib is None else round((slab_kib - base["slab_kib"]) / added, 2),
        "swarm_kib_per_conn": round(sum(pss_kib(p) for p in swarm.pids()) / added, 2)}
    swarm.beats()                                   # the window's heartbeats only
    figures["cpu_pct"], figures["cpu_busiest"] = target.cpu(args.window)
    beats = swarm.beats()
    figures["heartbeats"] = {"sent": beats.sent, "answered": beats.answered, "refused": beats.refused,
                             "late": beats.late, "in_flight": beats.in_flight, "per_s": round(beats.sent / args.window),
                             "p50_ms": beats.percentile(50), "p99_ms": beats.percentile(99)}
    figures["pushed"] = beats.pushed
    figures["registered"] = registered(target.port, swarm) if swarm.client.heartbeat_interval else None
    figures["lost"] = swarm.counts()["lost"]
    return figures


def run(steps: list[int], work: Path, args: argparse.Namespace) -> dict:
    target = NodeUnderTest(work, max(steps), args.net_actors)
    out: dict = {"net_actors": sum(name.startswith("net-") for name in target.processes()), "steps": [],
                 "stopped": None}
    cfg = ClientSwarmConfig(SwarmConfig(LOOPBACK, target.port, per_worker=PER_PROCESS, per_source=args.per_source),
                            heartbeat_interval=args.heartbeat_interval, groups=args.groups)
    try:
        if not args.notify:
            quiet_groups(target.port, cfg)
        with ClientSwarm(cfg) as swarm:
            time.sleep(args.settle)
            base = baseline(target, args.rest)
            out["baseline"] = base.pop("shown")
            for step in steps:
                grown = swarm.grow(step - swarm.devices, _progress_line(step))
                out["steps"].append(measure_step(target, swarm, step, grown, base, args))
                print(f"\n{step:,}: {_summary(out['steps'][-1])}", file=sys.stderr, flush=True)
                if grown.failed:
                    out["stopped"] = f"{grown.failed:,} connections failed at {step:,}: {grown.failures}"
                    break
            out["failures"] = swarm.beats().failures
        if out["failures"]:
            out["node_warnings"] = warnings_in(target.node.store, 20)
    finally:
        target.stop()
    return out


def baseline(target: NodeUnderTest, rest: float) -> dict:
    """The node with no client: memory (in all, by process), the kernel's socket memory, CPU over `rest` s."""
    memory = target.memory()
    totals = _totals(memory)
    cpu, busiest = target.cpu(rest)
    return {"totals": totals, "processes": memory, "tcp_kib": tcp_mem_kib(), "slab_kib": socket_slab_kib() or 0,
            "shown": {"pss_mib": round(totals["Pss"] / 1024, 1), "processes": memory, "cpu_pct": cpu,
                      "cpu_busiest": busiest}}


def target_check(result: dict) -> dict | None:
    """The issue's target at TARGET_AT connections (the largest step measured, when it is smaller)."""
    if not result["steps"]:
        return None
    s = result["steps"][-1]
    return {"connections": s["connections"], "pss_kib_per_conn": s["pss_kib_per_conn"], "kib_target": TARGET_KIB,
            "kib_ok": s["pss_kib_per_conn"] <= TARGET_KIB, "cpu_pct": s["cpu_pct"], "cpu_target": TARGET_CPU_PCT,
            "cpu_ok": s["cpu_pct"] <= TARGET_CPU_PCT, "at_target_scale": s["connections"] >= TARGET_AT}


def _progress_line(step: int):  # noqa: ANN202 - a callback
    def show(counts: dict[str, int], elapsed: float) -> None:
        print(f"\r-> {step:,}: {counts['subscribed']:,} registered, {counts['failed']:,} failed, "
              f"{counts['pushed']:,} notifications, {elapsed:.1f} s", end="", file=sys.stderr, flush=True)
    return show


def _summary(f: dict) -> str:
    hb = f["heartbeats"]
    return (f"{f['connect_rate']:,.0f} conn/s, settled {f['settle_seconds']} s, PSS {f['pss_kib_per_conn']} KiB/conn "
            f"(anon {f['pss_anon_kib_per_conn']}), kernel {f['tcp_mem_kib_per_conn']} KiB/conn, CPU {f['cpu_pct']} % "
            f"{f['cpu_busiest']}, heartbeats {hb['answered']:,}/{hb['sent']:,} "
            f"p50 {hb['p50_ms']} p99 {hb['p99_ms']} ms, "
            f"registered {f['registered']}")


def table(result: dict) -> str:
    rows: list[tuple[str, str | tuple[str, ...]]] = [
            ("connections", "connections"), ("connect rate /s", "connect_rate"), ("accepts /s", "accept_rate"),
            ("settled after, s", "settle_seconds"), ("node PSS MiB", "pss_mib"),
            ("PSS KiB/conn", "pss_kib_per_conn"), ("  anonymous", "pss_anon_kib_per_conn"),
            ("kernel TCP buffers KiB/conn", "tcp_mem_kib_per_conn"),
            ("kernel socket slabs KiB/conn", "slab_kib_per_conn"), ("CPU % of a core", "cpu_pct"),
            ("heartbeats /s", ("heartbeats", "per_s")), ("heartbeat p50 ms", ("heartbeats", "p50_ms")),
            ("heartbeat p99 ms", ("heartbeats", "p99_ms")), ("load generator KiB/conn", "swarm_kib_per_conn")]
    names = sorted({n for s in result["steps"] for n in s["processes"]})
    rows += [(f"  {n} KiB/conn", ("processes", n, "pss_kib_per_conn")) for n in names]
    cells = [("", *(f"{s['step']:,}" for s in result["steps"]))]
    for label, key in rows:
        cells.append((label, *(_text(_value(s, key)) for s in result["steps"])))
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c[i].rjust(w) if i else c[i].ljust(w) for i, w in enumerate(widths)) for c in cells]
    if result.get("stopped"):
        lines.append(f"stopped: {result['stopped']}")
    return "\n".join(lines)


def _value(step: dict, key: str | tuple[str, ...]) -> object:
    if isinstance(key, str):
        return step.get(key)
    value: object = step
    for k in key:
        value = value.get(k) if isinstance(value, dict) else None
    return value


def _text(v: object) -> str:
    """A table cell: small floats with two decimals, other numbers with thousands separators."""
    if isinstance(v, float) and abs(v) < 100:
        return f"{v:.2f}"
    return "-" if v is None else f"{v:,.0f}" if isinstance(v, (int, float)) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default=",".join(map(str, STEPS)), help="connection counts, ascending")
    ap.add_argument("--quick", action="store_true", help=f"steps {QUICK_STEPS}, 5 s heartbeats, short waits")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--heartbeat-interval", type=float, default=30.0,
                    help="seconds between a client's heartbeats; 0: bare connections that never heartbeat")
    ap.add_argument("--groups", type=int, default=100, help="consumer groups the clients are spread over")
    ap.add_argument("--notify", action="store_true",
                    help="leave the groups' notifyConsumerIdsChangedEnable on (RocketMQ's default): every join then "
                         "notifies each member of its group")
    ap.add_argument("--window", type=float, default=0.0,
                    help="seconds of the CPU and heartbeat measurement (default: the interval + 10 %%)")
    ap.add_argument("--rest", type=float, default=5.0, help="seconds of the baseline CPU measurement")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds to wait at least after a step")
    ap.add_argument("--settle-max", type=float, default=300.0,
                    help="then at most this long for the broker's notifications to stop")
    ap.add_argument("--per-source", type=int, default=25_000, help="clients per loopback source address")
    ap.add_argument("--net-actors", type=int, default=0,
                    help="the node's net actors at least (default: as many as the largest step needs)")
    args = ap.parse_args()
    steps = list(QUICK_STEPS) if args.quick else sorted(int(s) for s in args.steps.split(",") if s)
    if args.quick:
        args.heartbeat_interval, args.groups, args.rest, args.settle, args.settle_max, args.per_source = \
            5.0, 10, 1.0, 1.0, 30.0, 500
    args.window = args.window or args.heartbeat_interval * 1.1 or 10.0
    if args.window < args.heartbeat_interval:
        ap.error(f"--window {args.window} is shorter than a heartbeat interval ({args.heartbeat_interval} s)")
    result: dict = {"steps": steps, "quick": args.quick, "cpus": os.cpu_count(),
                    "heartbeat_interval": args.heartbeat_interval, "groups": args.groups, "notify": args.notify,
                    "window": args.window,
                    "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_remoting_connections_") as tmp:
        result["smartgo"] = run(steps, Path(tmp) / "smartgo", args)
    result["target"] = target_check(result["smartgo"])
    result["seconds"] = round(time.monotonic() - started, 1)
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    text = table(result["smartgo"]) + f"\ntarget: {result['target']}"
    print(text, file=sys.stderr if args.json else sys.stdout)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
