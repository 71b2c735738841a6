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

--nodes K (SmartGo): one registry and K nodes, each its own broker group (`broker-<k>`), store and ports, with
mqtt_actors for its share of the largest step; device i connects to node i mod K. Per step also: the devices
each node's MQTT actors hold (their sum is the total), each node's PSS, and of the commands (all published on
node 0, four in five to devices on other nodes) those that crossed to another node, p50/p99.

--storm (SmartGo, node 0, after the last step): the largest step / K new devices with persistent sessions
(clean session 0) subscribe; the node's supervisor gets SIGTERM, and once it exited is started again on the
same store, config and ports. Every device reconnects at once, retrying refusals and CONNACK 3 after a
randomized backoff (0.1 s doubling to 3 s, +-50 %). Reported: seconds from the restart to every device back,
the reconnect rate, CONNACKs with session present (all must be), retries by reason, PSS before the restart and
its peak (sampled every 0.5 s), the actors' pids (none may change once the node is up), and commands to random
devices, which none of them subscribed to again.

    .venv/bin/python benchmarks/bench_connections.py [--steps 1000,10000,100000] [--brokers smartgo,mosquitto]
                                                    [--nodes K] [--storm] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_mqtt import MOSQUITTO, MOSQUITTO_CONF, Broker, _spawn  # noqa: E402
from smartgo.mqtt.admin import ask_blocking, socket_path  # noqa: E402
from smartgo.mqtt.swarm import (PSS_FIELDS, Arrival, Commander, Grown, Swarm, SwarmConfig, percentile,  # noqa: E402
                                pss_kib, pss_parts, socket_slab_kib, tcp_mem_kib)
from tests.support.broker import start_broker  # noqa: E402
from tests.support.nodes import Node, launch_node, warnings_in  # noqa: E402
from tests.support.waits import LOOPBACK, free_port  # noqa: E402

BROKERS = ("smartgo", "mosquitto")
STEPS = (1_000, 10_000, 100_000, 250_000, 500_000, 1_000_000)
QUICK_STEPS = (300, 1_000)
PER_ACTOR = 18_000          # connections an MQTT actor (or a load generator process) holds at most
#: CommitLog files of the default size: a test node's 1 MiB ones are too small for a checkpoint of many sessions
NODE = {"log_level": "WARNING", "mqtt_ws_port": 0, "commitlog_file_size": 1 << 30}
PROBE_SOURCE = 250          # the cross-node probe's devices come from 127.0.0.250


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

    def __init__(self, broker: Broker, node: Node | None = None) -> None:
        self.broker = broker
        self.node = node            # SmartGo's supervisor (replaced when the storm restarts it)
        self.name = broker.name
        self.port = broker.port
        self.limit = None if node else _open_files_limit(broker.root_pid) - 10   # listener, log, ...

    def named(self) -> dict[str, int]:
        """pid of each process: SmartGo's actors by name (health report), the supervisor, the rest by pid."""
        names = {self.broker.root_pid: "supervisor" if self.node else self.name}
        if self.node is not None:
            names.update(self.actors())
        return {names.get(p.pid, f"{p.name()}-{p.pid}"): p.pid for p in _processes(self.broker.root_pid)}

    def actors(self) -> dict[int, str]:
        """SmartGo's actors now: pid -> name (its health report)."""
        report = self.node.health() if self.node is not None else None
        return {a["pid"]: a["name"] for a in (report or {"actors": []})["actors"] if a.get("pid")}

    def held(self) -> int:
        """The MQTT connections SmartGo's MQTT actors say they hold (their admin channels)."""
        assert self.node is not None
        run = self.node.store / "run"
        return sum(ask_blocking(socket_path(run, name), {"op": "stats"}, timeout=30)["stats"]["connections"]
                   for name in self.actors().values() if name.startswith("mqtt-"))


class Fleet:
    """What a run measures: one broker, or K SmartGo nodes (separate broker groups) behind one registry.
    With K > 1 every process is named after its node (`n1/mqtt-0`)."""

    def __init__(self, targets: list[Target], registry: Node | None = None) -> None:
        self.targets = targets
        self.registry = registry
        self.node = targets[0].node
        self.port = targets[0].port
        self.limit = targets[0].limit
        self.registry_addr = f"{LOOPBACK}:{registry.port}" if registry is not None else \
            f"{LOOPBACK}:{getattr(self.node, 'registry_port', 0)}"

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(t.port for t in self.targets)

    def named(self) -> dict[str, int]:
        if len(self.targets) == 1:
            return self.targets[0].named()
        return {f"n{k}/{name}": pid for k, t in enumerate(self.targets) for name, pid in t.named().items()}

    def memory(self) -> dict[str, dict[str, int]]:
        """PSS (KiB) of each process, and its anonymous, file and shared-memory parts."""
        return {name: pss_parts(pid) for name, pid in self.named().items()}

    def cpu_s(self) -> float:
        return sum(t.broker.cpu_s() for t in self.targets)

    def settle(self, least: float, most: float, quiet_pct: float) -> float:
        """Wait at least `least` s, then until a second in which the brokers used under `quiet_pct` % of a
        core (after a connect storm SmartGo's actors work on for a while), at most `most` s: the wait."""
        start = time.monotonic()
        time.sleep(least)
        while time.monotonic() - start < most:
            before = self.cpu_s()
            time.sleep(1.0)
            if (self.cpu_s() - before) * 100 < quiet_pct:
                break
        return round(time.monotonic() - start, 1)

    def cpu_at_rest(self, seconds: float) -> tuple[float, dict[str, float]]:
        """% of one core the brokers' processes used over `seconds`: in all, and by process (the busiest)."""
        def times() -> dict[str, float]:
            out = {}
            for name, pid in self.named().items():
                try:
                    t = psutil.Process(pid).cpu_times()
                except psutil.NoSuchProcess:
                    continue
                out[name] = t.user + t.system
            return out
        before, total = times(), self.cpu_s()
        time.sleep(seconds)
        after, total = times(), self.cpu_s() - total
        busy = sorted(((n, (after[n] - before.get(n, 0.0)) / seconds * 100) for n in after), key=lambda x: -x[1])
        return round(total / seconds * 100, 2), {n: round(pct, 2) for n, pct in busy[:8]}

    def stop(self) -> None:
        try:
            for t in self.targets:
                t.broker.stop()
        finally:
            if self.registry is not None:
                _stop(self.registry)


def _stop(node: Node) -> None:
    """SIGTERM, then whatever is left killed (a node stopped cleanly removes its temporary files)."""
    try:
        if node.proc.poll() is None:
            node.stop(timeout=120)
    finally:
        node.reap()


def _smartgo_broker(node: Node, port: int) -> Broker:
    return Broker("smartgo", port, node.proc.pid, lambda: _stop(node))


def start_smartgo(base: Path, actors: int, settings: dict | None = None) -> Target:
    port = free_port()
    node = start_broker(base, {**NODE, "mqtt_port": port, "mqtt_actors": actors, **(settings or {})})
    try:
        node.wait_healthy(timeout=120)
    except BaseException:
        node.reap()
        raise
    return Target(_smartgo_broker(node, port), node)


def start_fleet(name: str, work: Path, actors: int, nodes: int) -> Fleet:
    if name == "smartgo" and nodes > 1:
        registry = launch_node(work / "registry", role="registry")
        targets: list[Target] = []
        try:
            for k in range(nodes):
                targets.append(start_smartgo(work / f"node{k}", actors, {
                    "registry": f"{LOOPBACK}:{registry.port}", "broker_name": f"broker-{k}"}))
        except BaseException:
            for t in targets:
                t.broker.stop()
            _stop(registry)
            raise
        return Fleet(targets, registry)
    if name == "smartgo":
        return Fleet([start_smartgo(work / "smartgo", actors)])
    if not Path(MOSQUITTO).exists():
        raise RuntimeError(f"no {MOSQUITTO}: apt-get install mosquitto")
    port = free_port()
    conf = work / "mosquitto.conf"
    conf.write_text(MOSQUITTO_CONF.format(port=port, host=LOOPBACK) + "max_connections -1\n")
    return Fleet([Target(_spawn("mosquitto", [MOSQUITTO, "-c", str(conf)], port, work / "mosquitto.log"))])


def wait_across(fleet: Fleet, timeout: float = 90.0) -> float:
    """Until a command published on node 0 reaches a device on every node (each node's MQTT actors read
    the other brokers' queues once their routes show them): the seconds it took."""
    start = time.monotonic()
    nodes = len(fleet.ports)
    cfg = SwarmConfig(LOOPBACK, fleet.port, ports=fleet.ports, id_prefix="probe-", topic="probe/{}/cmd",
                      first_source=PROBE_SOURCE, per_source=100)
    with Swarm(cfg) as probe:
        grown = probe.grow(nodes)
        if grown.failed:
            raise RuntimeError(f"the cross-node probe devices failed: {grown.failures}")
        commander = Commander(LOOPBACK, fleet.port, client_id=f"probe-commander-{os.getpid()}", topic=cfg.topic)
        try:
            reached: set[int] = set()
            while len(reached) < nodes:
                if time.monotonic() - start > timeout:
                    raise RuntimeError(f"after {timeout:.0f} s a command on node 0 reached nodes {sorted(reached)} "
                                       f"of {nodes}")
                for device in set(range(nodes)) - reached:
                    commander.send(device)
                time.sleep(0.5)
                reached |= {a.device for a in probe.arrivals()}
        finally:
            commander.close()
    return round(time.monotonic() - start, 1)


def pick_device(devices: int, nodes: int, away: float = 0.8) -> int:
    """A random device; with K nodes, one on a node other than node 0 with probability `away`."""
    device = random.randrange(devices)
    if nodes > 1 and devices >= nodes and random.random() < away:
        while device % nodes == 0:
            device = random.randrange(devices)
    return device


def commands(swarm: Swarm, send: object, count: int, rate: float, wait: float = 15.0, nodes: int = 1) -> dict:
    """`count` commands to random devices through send(device) -> stamp, at `rate` a second: how many
    arrived at exactly their device, and publish -> arrival p50/p99/max (with K nodes: also of those to
    devices on the other nodes)."""
    swarm.arrivals()                            # forget what came before
    expect: dict[int, int] = {}                 # stamp -> device
    start = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        device = pick_device(swarm.devices, nodes)
        expect[send(device)] = device  # type: ignore[operator]  # a callable
    got: list[Arrival] = []
    deadline = time.monotonic() + wait
    while len(got) < count and time.monotonic() < deadline:
        got += swarm.arrivals()
        time.sleep(0.05)
    right = [a for a in got if expect.get(a.sent_ns) == a.device and a.own_topic]
    latencies = sorted(a.latency_ms for a in right)
    out: dict = {"sent": count, "arrived": len(right), "wrong": len(got) - len(right),
           "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
           "max_ms": latencies[-1] if latencies else None}
    if nodes > 1:
        away = sorted(a.latency_ms for a in right if a.device % nodes)
        out["other_nodes"] = {"sent": sum(1 for d in expect.values() if d % nodes), "arrived": len(away),
                              "p50_ms": percentile(away, 50), "p99_ms": percentile(away, 99)}
    return out


def rocketmq_sender(fleet: Fleet) -> tuple[object, object]:
    """send(device) -> stamp through the RocketMQ API (a Producer of the SmartGo client) into node 0's
    queues of the bridged topic, and close()."""
    from smartgo.client.blocking import Producer
    from smartgo.client.message import Message
    producer = Producer("bench_connections", fleet.registry_addr)
    producer.start()
    queues = [q for q in producer.fetch_publish_queues("MQTT")
              if fleet.registry is None or q.broker_name == "broker-0"]

    def send(device: int) -> int:
        stamp = time.monotonic_ns()
        producer.send_to_queue(Message("MQTT", stamp.to_bytes(8, "big") + bytes(8), tags=f"devices/{device}/cmd"),
                               random.choice(queues))
        return stamp
    return send, producer.close


def _totals(memory: dict[str, dict[str, int]]) -> dict[str, int]:
    return {f: sum(parts[f] for parts in memory.values()) for f in PSS_FIELDS}


def measure_step(fleet: Fleet, swarm: Swarm, step: int, grown: Grown, base: dict, args: argparse.Namespace) -> dict:
    counts = swarm.counts()
    held = counts["open"]
    nodes = len(fleet.targets)
    settled = fleet.settle(args.settle, args.settle_max, base["quiet_pct"])
    memory = fleet.memory()
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
    if nodes > 1:
        figures["nodes"] = node_figures(fleet, memory, base["processes"])
        figures["held_total"] = sum(n["connections"] for n in figures["nodes"])
    figures["cpu_rest_pct"], figures["cpu_rest_busiest"] = fleet.cpu_at_rest(args.rest)
    pinged = swarm.ping(spread=max(1.0, held / args.ping_rate), timeout=30)
    figures["ping"] = {"sent": pinged.sent, "answered": pinged.answered, "p50_ms": pinged.percentile(50),
                       "p99_ms": pinged.percentile(99)}
    figures.update(command_figures(fleet, swarm, args))
    lost = swarm.counts()["lost"] - counts["lost"]
    figures["lost"] = lost
    base["last"] = (total["Pss"], held)
    return figures


def node_figures(fleet: Fleet, memory: dict[str, dict[str, int]], then: dict[str, dict[str, int]]) -> list[dict]:
    """Per node of a scale-out run: the devices its MQTT actors hold, its PSS and its growth a device."""
    out = []
    for k, target in enumerate(fleet.targets):
        mine = [name for name in memory if name.startswith(f"n{k}/")]
        pss = sum(memory[name]["Pss"] for name in mine)
        grown = pss - sum(then[name]["Pss"] for name in mine if name in then)
        held = target.held()
        out.append({"node": k, "connections": held, "pss_mib": round(pss / 1024, 1),
                    "pss_kib_per_conn": round(grown / max(1, held), 2)})
    return out


def command_figures(fleet: Fleet, swarm: Swarm, args: argparse.Namespace) -> dict:
    """Commands published on node 0 to random devices: through MQTT, and (SmartGo) the RocketMQ API."""
    nodes = len(fleet.targets)
    out = {}
    commander = Commander(LOOPBACK, fleet.port, client_id=f"commander-{os.getpid()}")
    try:
        out["command"] = commands(swarm, commander.send, args.commands, args.command_rate, nodes=nodes)
        out["command"]["unacked"] = commander.drain()
    finally:
        commander.close()
    if fleet.node is not None and args.rocketmq:
        send, close = rocketmq_sender(fleet)
        try:
            out["rocketmq_command"] = commands(swarm, send, max(1, args.commands // 2), args.command_rate,
                                               nodes=nodes)
        finally:
            close()  # type: ignore[operator]  # a callable
    return out


class PssSampler(threading.Thread):
    """The PSS (KiB) of a target's processes every `interval` s, whichever supervisor it has now."""

    def __init__(self, target: Target, interval: float = 0.5) -> None:
        super().__init__(daemon=True, name="pss-sampler")
        self.target = target
        self.interval = interval
        self.peak = (0, 0.0)        # KiB, monotonic s
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            kib = sum(pss_kib(p.pid) for p in _processes(self.target.broker.root_pid))
            self.samples += 1
            if kib > self.peak[0]:
                self.peak = (kib, time.monotonic())

    def stop(self) -> tuple[int, float]:
        self.done.set()
        self.join()
        return self.peak


def storm(nodes: Fleet, devices: int, first_source: int, quiet_pct: float, args: argparse.Namespace) -> dict:
    """The reconnect storm after a node restart: `devices` persistent-session devices (clean session 0)
    subscribe, the node is stopped (SIGTERM to its supervisor) and started again on the same store, config
    and ports, and every device reconnects at once (retrying refusals and CONNACK 3 after a random backoff)
    and must find its session, its subscription included. On node 0 of the fleet."""
    target = nodes.targets[0]
    cfg = SwarmConfig(LOOPBACK, target.port, clean=False, reconnect=True, per_worker=PER_ACTOR,
                      per_source=args.per_source, first_source=first_source, id_prefix="s",
                      reconnect_window=args.storm_window)
    fleet = Fleet([target], nodes.registry)
    out: dict = {"devices": devices, "window": args.storm_window}
    with Swarm(cfg) as swarm:
        grown = swarm.grow(devices, _progress_line("storm", devices))
        print(file=sys.stderr)
        out.update(connect_rate=grown.rate, failures=grown.failures)
        if grown.failed:
            return out
        fleet.settle(args.settle, args.settle_max, quiet_pct)
        before_kib = sum(parts["Pss"] for parts in fleet.memory().values())
        sampler = PssSampler(target)
        sampler.start()
        stop_at = time.monotonic()
        assert target.node is not None
        out["stop_exit_code"] = target.node.stop(timeout=180)
        out["stop_seconds"] = round(time.monotonic() - stop_at, 1)
        during_stop = swarm.counts()
        restart_ns = time.monotonic_ns()
        target.node = restart(target.node, args.storm_timeout)
        target.broker = _smartgo_broker(target.node, target.port)
        out["healthy_seconds"] = round((time.monotonic_ns() - restart_ns) / 1e9, 1)
        actors = target.actors()
        counts = wait_back(swarm, devices, restart_ns, args.storm_timeout)
        back_s = (counts["back_ns"] - restart_ns) / 1e9
        out.update(
            back=counts["open"], back_seconds=round(back_s, 2),
            reconnect_rate=round(devices / max(back_s, 1e-6), 1),
            reconnected=counts["reconnected"], resumed=counts["resumed"],
            reconnected_during_stop=during_stop["reconnected"], sessions_lost=counts["reconnected"] - counts["resumed"],
            retries=counts["retries"], reconnects=swarm.reconnects(),
            settle_seconds=fleet.settle(args.settle, args.settle_max, quiet_pct))
        peak_kib, peak_at = sampler.stop()
        out.update(pss_mib_before=round(before_kib / 1024, 1), pss_mib_peak=round(peak_kib / 1024, 1),
                   pss_peak_after_restart_s=round(peak_at - restart_ns / 1e9, 1), pss_samples=sampler.samples,
                   pss_mib_after=round(sum(p["Pss"] for p in fleet.memory().values()) / 1024, 1))
        report = target.node.health() or {"node": {}}
        out["actors_restarted"] = sorted(name for pid, name in actors.items() if target.actors().get(pid) != name)
        out["supervisor_restarts"] = report["node"].get("restarts")
        out["actor_restarts"] = {a["name"]: a["restarts"] for a in report.get("actors", []) if a.get("restarts")}
        out.update(command_figures(fleet, swarm, args))
        out["lost"] = swarm.counts()["dropped"] - counts["dropped"]
    out["node_warnings"] = warning_counts(target.node.store)
    return out


def warning_counts(store: Path) -> dict[str, int]:
    """The node log's warnings and errors, counted by kind (numbers and addresses left out)."""
    kinds = Counter(re.sub(r"\d+(\.\d+)*", "N", line.split(" ", 3)[-1])[:160] for line in warnings_in(store, 10**9))
    return dict(kinds.most_common(20))


def restart(node: Node, timeout: float) -> Node:
    """The node started again on its store, config and ports (restart_broker), given `timeout` s to be
    healthy while its devices storm it; failing that, the end of its log in the error."""
    with open(node.stderr, "ab") as err:
        again = Node(subprocess.Popen(node.proc.args, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT), node.store,
                     node.port, node.stderr)
    for name in ("registry_port", "ha_port", "metrics_port"):
        setattr(again, name, getattr(node, name, 0))
    try:
        again.wait_healthy(timeout, give_up=lambda: again.proc.poll() is not None)
    except AssertionError as exc:
        again.reap()
        raise RuntimeError(f"{exc}; its log ends: {node.stderr.read_text(errors='replace')[-2000:]}") from None
    return again


def wait_back(swarm: Swarm, devices: int, since_ns: int, timeout: float) -> dict[str, int]:
    """The swarm's counts once every device saw its connection closed and is connected again (or timeout)."""
    deadline = time.monotonic() + timeout
    next_report = 0.0
    while True:
        counts = swarm.counts()
        now = time.monotonic()
        if (counts["dropped"] >= devices and counts["open"] == devices) or now >= deadline:
            print(file=sys.stderr)
            return counts
        if now >= next_report:
            next_report = now + 0.5
            print(f"\rstorm: {counts['open']:,} of {devices:,} back, {counts['retries']:,} retries, "
                  f"{(time.monotonic_ns() - since_ns) / 1e9:.1f} s after the restart", end="", file=sys.stderr,
                  flush=True)
        time.sleep(0.1)


def run_broker(name: str, steps: list[int], work: Path, args: argparse.Namespace) -> dict:
    nodes = args.nodes if name == "smartgo" else 1
    actors = args.mqtt_actors or math.ceil(math.ceil(max(steps) / nodes) / PER_ACTOR)
    try:
        fleet = start_fleet(name, work, actors, nodes)
    except Exception as exc:                    # the other broker still runs; the table says why
        return {"available": False, "reason": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
    out: dict = {"available": True, "steps": [], "stopped": None}
    if name == "smartgo":
        out["mqtt_actors"] = actors
        out["nodes"] = nodes
    cfg = SwarmConfig(LOOPBACK, fleet.port, per_worker=PER_ACTOR, per_source=args.per_source,
                      ports=fleet.ports if nodes > 1 else ())
    try:
        if nodes > 1:
            out["across_seconds"] = wait_across(fleet)
        with Swarm(cfg) as swarm:
            time.sleep(args.settle)
            memory = fleet.memory()
            base: dict = {"totals": _totals(memory), "processes": memory, "tcp_kib": tcp_mem_kib(),
                          "slab_kib": socket_slab_kib() or 0}
            base["last"] = (base["totals"]["Pss"], 0)
            out["baseline"] = {"pss_mib": round(base["totals"]["Pss"] / 1024, 1), "processes": memory}
            out["baseline"]["cpu_rest_pct"], out["baseline"]["cpu_rest_busiest"] = fleet.cpu_at_rest(args.rest)
            base["quiet_pct"] = out["baseline"]["cpu_rest_pct"] * 1.5 + 10
            quiet = base["quiet_pct"] / nodes
            for step in steps:
                if fleet.limit is not None and step > fleet.limit:
                    out["stopped"] = (f"{step:,} connections need {step:,} descriptors; one {name} process may have "
                                      f"{fleet.limit + 10:,} (Max open files in /proc/PID/limits)")
                    break
                grown = swarm.grow(step - swarm.devices, _progress_line(name, step))
                print(file=sys.stderr)
                figures = measure_step(fleet, swarm, step, grown, base, args)
                out["steps"].append(figures)
                print(f"{name} {step:,}: {_summary(figures)}", file=sys.stderr, flush=True)
                if grown.failed:
                    out["stopped"] = f"{grown.failed:,} connections failed at {step:,}: {grown.failures}"
                    break
            out["failures"] = swarm.failures()
        if name == "smartgo" and args.storm:
            first_source = cfg.first_source + math.ceil(max(steps) / cfg.per_source) + 1
            out["storm"] = storm(fleet, args.storm_devices or max(steps) // nodes, first_source,
                                 quiet, args)
            print(f"storm: {_storm_summary(out['storm'])}", file=sys.stderr, flush=True)
        if out["failures"] and fleet.node is not None:    # the node log says why; it goes with the store
            out["node_warnings"] = [line for t in fleet.targets if t.node
                                   for line in warnings_in(t.node.store, 20)]
    finally:
        fleet.stop()
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
            f"({f['command']['arrived']}/{f['command']['sent']}), CPU at rest {f['cpu_rest_pct']} %"
            + (f", held {f['held_total']:,} by {len(f['nodes'])} nodes" if "nodes" in f else ""))


def _storm_summary(s: dict) -> str:
    if "back" not in s:
        return f"{s['devices']:,} devices could not be set up: {s['failures']}"
    return (f"{s['back']:,} of {s['devices']:,} back {s['back_seconds']} s after the restart "
            f"({s['reconnect_rate']:,.0f}/s; node healthy after {s['healthy_seconds']} s), session present "
            f"{s['resumed']:,} of {s['reconnected']:,} CONNACKs, {s['retries']:,} retries, PSS {s['pss_mib_before']} "
            f"-> peak {s['pss_mib_peak']} MiB, actors restarted {s['actor_restarts'] or 'none'}, commands "
            f"{s['command']['arrived']}/{s['command']['sent']} (p99 {s['command']['p99_ms']} ms)")


Key = str | tuple[str, ...]
ROWS: tuple[tuple[str, Key], ...] = (
        ("connect rate /s", "connect_rate"), ("accepts /s", "accept_rate"), ("settled after, s", "settle_seconds"),
        ("PSS MiB", "pss_mib"),
        ("PSS KiB/conn", "pss_kib_per_conn"), ("  since the step before", "pss_kib_per_conn_marginal"),
        ("  anonymous", "pss_anon_kib_per_conn"),
        ("  file-mapped", "pss_file_kib_per_conn"), ("  shared memory", "pss_shmem_kib_per_conn"),
        ("kernel TCP buffers KiB/conn", "tcp_mem_kib_per_conn"), ("kernel socket slabs KiB/conn", "slab_kib_per_conn"),
        ("ping p99 ms", ("ping", "p99_ms")), ("command p99 ms", ("command", "p99_ms")),
        ("RocketMQ command p99 ms", ("rocketmq_command", "p99_ms")), ("CPU at rest %", "cpu_rest_pct"),
        ("load generator KiB/conn", "swarm_kib_per_conn"))
NODE_ROWS: tuple[tuple[str, Key], ...] = (
    ("held, sum over nodes", "held_total"), ("command p99 ms, to other nodes", ("command", "other_nodes", "p99_ms")),
    ("RocketMQ command p99 ms, other nodes", ("rocketmq_command", "other_nodes", "p99_ms")))


def _value(step: dict | None, key: Key) -> object:
    for name in (key,) if isinstance(key, str) else key:
        step = (step or {}).get(name)
    return step


def table(results: dict, steps: list[int], brokers: list[str]) -> str:
    lines = []
    for step in steps:
        cells = [(f"{step:,} connections", *brokers)]
        found = {b: next((s for s in results[b].get("steps", []) if s["step"] == step), None) for b in brokers}
        for label, key in ROWS + (NODE_ROWS if any(_value(f, "nodes") for f in found.values()) else ()):
            cells.append((label, *(_cell(_value(found[b], key)) for b in brokers)))
        widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
        lines += ["  ".join(c[i].rjust(w) if i else c[i].ljust(w) for i, w in enumerate(widths)) for c in cells]
        lines.append("")
    for b in brokers:
        if results[b].get("stopped"):
            lines.append(f"{b}: stopped: {results[b]['stopped']}")
        if not results[b].get("available", True):
            lines.append(f"{b}: not available: {results[b]['reason']}")
        if results[b].get("storm"):
            lines.append(f"{b} storm: {_storm_summary(results[b]['storm'])}")
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
    ap.add_argument("--nodes", type=int, default=1,
                    help="SmartGo nodes (separate broker groups behind one registry); device i on node i mod K")
    ap.add_argument("--storm", action="store_true",
                    help="after the last step: persistent-session devices, a node restart, the reconnect storm")
    ap.add_argument("--storm-devices", type=int, default=0, help="devices of the storm (default: the largest "
                                                                   "step / --nodes)")
    ap.add_argument("--storm-window", type=int, default=1000,
                    help="reconnects a load generator process sets up at once in the storm")
    ap.add_argument("--storm-timeout", type=float, default=300.0, help="seconds for every device to be back")
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
    if args.nodes < 1:
        ap.error("--nodes must be 1 or more")
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
