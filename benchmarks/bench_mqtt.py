"""MQTT benchmark: SmartGo's MQTT front door side by side with Mosquitto 2 (Debian's package, in
memory) and amqtt (the pure-Python broker from PyPI), same machine, same load generator
(smartgo/mqtt/loadgen.py: raw sockets, worker processes), same 128-byte payload, in one run.

Scenarios (every one run on every broker in turn, the brokers' order rotating from run to run):
  qos0_publish  16 QoS 0 publishers flat out: msgs/s the broker took in (a publish counts when the
                broker answered the PINGREQ sent after its chunk of 64; 4 chunks in flight a connection)
  qos1_publish  16 QoS 1 publishers, 256 publishes in flight in all: PUBACKs/s
                target: SmartGo >= 0.5 x Mosquitto (SmartGo acknowledges once the store has the message)
  fanout        one QoS 0 publisher, 1,000 subscribers of its topic: deliveries/s (the publisher has 4
                publishes unconfirmed at most, a PINGREQ after each, and pauses while more than 64 a
                subscriber are on their way)
  latency       one QoS 1 publisher at 2,000 msgs/s, one QoS 1 subscriber: publish -> delivery p50/p99
With each: the broker's CPU microseconds per message (user + system of the broker's processes over
the scenario, from /proc via psutil; SmartGo: the supervisor and every actor; per delivery for
fanout and latency). Target: SmartGo >= 10 x amqtt on every row ("x better": the throughput ratio,
and for latency and CPU the inverse ratio).

The brokers run side by side for the whole run, each idle while another is measured. SmartGo is a
real node (supervisor.py --role master, --mqtt-port); when it cannot start (no MQTT listener in
this build, say) its column says why and the other two still run. amqtt is installed into its own
venv, AMQTT_VENV (default ~/.cache/smartgo-bench/amqtt-venv), at the first run: it pins
dependencies ours do not want. Every figure is the median of --runs runs; host_probe_ms (the CPU
time of a fixed Python workload while it ran, host_probe.py) says how fast the shared host was.
--json: the last line is one JSON object. The stores and configs are in a temporary directory,
removed at the end.

    .venv/bin/python benchmarks/bench_mqtt.py [--runs 3] [--seconds 8] [--brokers smartgo,mosquitto,amqtt]
                                              [--only qos0_publish,qos1_publish,fanout,latency] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_broker import median_of  # noqa: E402
from host_probe import HostProbe  # noqa: E402
from smartgo.mqtt import loadgen  # noqa: E402
from tests.support.broker import start_broker  # noqa: E402
from tests.support.waits import LOOPBACK, end_process, free_port, wait_for_port  # noqa: E402

BROKERS = ("smartgo", "mosquitto", "amqtt")
SCENARIOS = ("qos0_publish", "qos1_publish", "fanout", "latency")
AMQTT = "amqtt==0.12.1"
AMQTT_VENV = Path(os.environ.get("AMQTT_VENV", Path.home() / ".cache" / "smartgo-bench" / "amqtt-venv"))
MOSQUITTO = "/usr/sbin/mosquitto"
#: The node's settings: CommitLog files big enough for a run's messages, quiet logs.
NODE = {"commitlog_file_size": 256 << 20, "consume_queue_file_size": 300_000 * 20, "index_slot_count": 500_000,
        "index_entry_count": 2_000_000, "log_level": "WARNING"}
MOSQUITTO_CONF = """\
listener {port} {host}
allow_anonymous true
persistence false
max_inflight_messages 0
max_queued_messages 0
max_queued_bytes 0
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
"""
AMQTT_CONF = """\
listeners:
  default:
    type: tcp
    bind: {host}:{port}
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: true
"""
#: (row, scenario, figure, higher is better)
ROWS = (("qos0 publish msgs/s", "qos0_publish", "msgs_s", True),
        ("qos0 publish CPU us/msg", "qos0_publish", "cpu_us_per_msg", False),
        ("qos1 publish msgs/s", "qos1_publish", "msgs_s", True),
        ("qos1 publish CPU us/msg", "qos1_publish", "cpu_us_per_msg", False),
        ("fanout deliveries/s", "fanout", "deliveries_s", True),
        ("fanout CPU us/delivery", "fanout", "cpu_us_per_msg", False),
        ("latency p50 ms", "latency", "p50_ms", False),
        ("latency p99 ms", "latency", "p99_ms", False),
        ("latency CPU us/delivery", "latency", "cpu_us_per_msg", False))
TARGETS = {"vs_amqtt": 10.0, "qos1_vs_mosquitto": 0.5}


@dataclass
class Broker:
    name: str
    port: int
    root_pid: int
    stop: Callable[[], None]

    def cpu_s(self) -> float:
        """User + system CPU seconds of the broker's processes (the root and all its descendants)."""
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        return total


def start_smartgo(work: Path) -> Broker:
    port = free_port()
    node = start_broker(work / "smartgo", {**NODE, "mqtt_port": port, "mqtt_ws_port": 0})
    try:
        wait_for_port(port, timeout=30)
    except BaseException:
        node.reap()
        raise
    def stop() -> None:
        try:
            node.stop()         # SIGTERM: the supervisor stops its actors and removes its own temp files
        finally:
            node.reap()
    return Broker("smartgo", port, node.proc.pid, stop)


def _spawn(name: str, cmd: list[str], port: int, log: Path) -> Broker:
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop() -> None:
        end_process(proc)
    try:
        wait_for_port(port, timeout=60)
    except AssertionError:
        stop()
        raise RuntimeError(f"{name} did not listen on {port}: {log.read_text(errors='replace')[-1000:]}") from None
    return Broker(name, port, proc.pid, stop)


def start_mosquitto(work: Path) -> Broker:
    if not Path(MOSQUITTO).exists():
        raise RuntimeError(f"no {MOSQUITTO}: apt-get install mosquitto")
    port = free_port()
    conf = work / "mosquitto.conf"
    conf.write_text(MOSQUITTO_CONF.format(port=port, host=LOOPBACK))
    return _spawn("mosquitto", [MOSQUITTO, "-c", str(conf)], port, work / "mosquitto.log")


def amqtt_command() -> Path:
    """The amqtt script of AMQTT_VENV, which is made (python -m venv, pip install AMQTT) when missing."""
    script = AMQTT_VENV / "bin" / "amqtt"
    if not script.exists():
        print(f"installing {AMQTT} into {AMQTT_VENV}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(AMQTT_VENV)], check=True, timeout=300)
        subprocess.run([str(AMQTT_VENV / "bin" / "pip"), "install", "-q", AMQTT], check=True, timeout=900)
    return script


def start_amqtt(work: Path) -> Broker:
    script = amqtt_command()
    port = free_port()
    conf = work / "amqtt.yaml"
    conf.write_text(AMQTT_CONF.format(port=port, host=LOOPBACK))
    return _spawn("amqtt", [str(script), "-c", str(conf)], port, work / "amqtt.log")


STARTERS: dict[str, Callable[[Path], Broker]] = {"smartgo": start_smartgo, "mosquitto": start_mosquitto,
                                                 "amqtt": start_amqtt}


def measure(broker: Broker, scenario: str, seconds: float, subscribers: int, processes: int) -> dict:
    """One scenario against one broker: the load generator's figures, the broker's CPU per message
    and the host speed."""
    kw: dict = {"seconds": seconds, "processes": processes}
    if scenario == "fanout":
        kw["subscribers"] = subscribers
    with HostProbe() as probe:
        before = broker.cpu_s()
        result = loadgen.SCENARIOS[scenario](LOOPBACK, broker.port, **kw)
        cpu = broker.cpu_s() - before
    if result.errors:           # a connection lost, an answer to no request: the run proves nothing
        raise loadgen.LoadError(f"{result.errors} errors: {'; '.join(result.error_lines[:3])}")
    figures = result.as_dict()
    figures.pop("error_lines")
    messages = result.delivered_total if result.subscribers else result.accepted_total
    figures["cpu_us_per_msg"] = round(cpu / max(messages, 1) * 1e6, 2)
    figures["broker_cpu_s"] = round(cpu, 2)
    figures["host_probe_ms"] = probe.ms
    return figures


def ratio(ours: float | None, theirs: float | None, higher_better: bool) -> float | None:
    """How many times better SmartGo's figure is than theirs (None when either is missing)."""
    if ours is None or theirs is None or not ours or not theirs or math.isnan(ours) or math.isnan(theirs):
        return None
    return round(ours / theirs if higher_better else theirs / ours, 2)


def table(results: dict) -> tuple[list[dict], str]:
    """Rows of the comparison (figure per broker, SmartGo vs amqtt and vs Mosquitto) and their text."""
    rows = []
    for label, scenario, figure, higher in ROWS:
        values = {b: results.get(b, {}).get(scenario, {}).get(figure) for b in BROKERS}
        rows.append({"row": label, **values, "smartgo_vs_amqtt": ratio(values["smartgo"], values["amqtt"], higher),
                     "smartgo_vs_mosquitto": ratio(values["smartgo"], values["mosquitto"], higher)})
    header = ("", "SmartGo", "Mosquitto", "amqtt", "SmartGo vs amqtt", "SmartGo vs Mosquitto")
    cells = [header] + [(r["row"], *(_cell(r[k]) for k in ("smartgo", "mosquitto", "amqtt")),
                         *(_cell(r[k], "x") for k in ("smartgo_vs_amqtt", "smartgo_vs_mosquitto"))) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    text = "\n".join("  ".join(c[i].rjust(w) if i else c[i].ljust(w) for i, w in enumerate(widths)) for c in cells)
    return rows, text


def _cell(value: float | None, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.0f}{suffix}" if abs(value) >= 100 else f"{value:.2f}{suffix}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short smoke run: 1 run of 1.5 s, 100 fan-out subscribers")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--runs", type=int, default=3, help="runs per scenario and broker (median reported)")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per scenario")
    ap.add_argument("--brokers", default=",".join(BROKERS), help=f"comma-separated ({','.join(BROKERS)})")
    ap.add_argument("--only", default="", help=f"comma-separated scenarios ({','.join(SCENARIOS)})")
    ap.add_argument("--subscribers", type=int, default=1000, help="fan-out subscribers (default 1000)")
    ap.add_argument("--processes", type=int, default=2, help="load generator processes (default 2)")
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    seconds = 1.5 if args.quick else args.seconds
    subscribers = 100 if args.quick else args.subscribers
    brokers = [b for b in args.brokers.split(",") if b]
    scenarios = [s for s in (args.only.split(",") if args.only else SCENARIOS) if s]
    unknown = set(brokers) - set(BROKERS) | set(scenarios) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown broker or scenario: {', '.join(sorted(unknown))}")
    results: dict = {"quick": args.quick, "seconds": seconds, "fanout_subscribers": subscribers,
                     "loadgen_processes": args.processes, "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    unavailable: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench_mqtt_") as tmp:
        running: dict[str, Broker] = {}
        try:
            for name in brokers:
                try:
                    running[name] = STARTERS[name](Path(tmp))
                    print(f"{name}: listening on {running[name].port}", file=sys.stderr, flush=True)
                except Exception as exc:        # the others still run; the table says why this one did not
                    unavailable[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
                    print(f"{name}: not available: {unavailable[name]}", file=sys.stderr, flush=True)
            per_run: dict[str, dict[str, list[dict]]] = {b: {s: [] for s in scenarios} for b in running}
            order = list(running)
            for run in range(runs * bool(order)):
                for scenario in scenarios:
                    for name in order[run % len(order):] + order[:run % len(order)]:
                        try:
                            figures = measure(running[name], scenario, seconds, subscribers, args.processes)
                        except loadgen.LoadError as exc:
                            figures = {"error": str(exc)[:300]}
                        per_run[name][scenario].append(figures)
                        print(f"run {run + 1}/{runs} {scenario} {name}: {_progress(figures)}", file=sys.stderr,
                              flush=True)
        finally:
            for b in running.values():
                b.stop()
    for name in brokers:
        if name in unavailable:
            results[name] = {"available": False, "reason": unavailable[name]}
            continue
        results[name] = {"available": True, **{s: _median(per_run[name][s]) for s in scenarios}}
    rows, text = table(results)
    results["table"] = rows
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    results["targets"] = TARGETS
    results["pass"] = _passes(rows) if "smartgo" not in unavailable and "smartgo" in brokers else {}
    print(text, file=sys.stderr if args.json else sys.stdout)
    for name, reason in unavailable.items():
        print(f"{name}: not available ({reason})", file=sys.stderr if args.json else sys.stdout)
    print(json.dumps(results) if args.json else json.dumps(results, indent=1))


def _progress(figures: dict) -> str:
    if "error" in figures:
        return f"error: {figures['error']}"
    f = figures
    return (f"{f['msgs_s']:,.0f} msgs/s, {f['deliveries_s']:,.0f} deliveries/s, p50 {f['p50_ms']} ms, "
            f"p99 {f['p99_ms']} ms, CPU {f['cpu_us_per_msg']} us/msg, errors {f['errors']}, "
            f"load generator CPU {f['loadgen_cpu_s']} s")


def _median(runs: list[dict]) -> dict:
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[-1] if runs else {}
    out = median_of(good)
    out["failed_runs"] = len(runs) - len(good)
    return out


def _passes(rows: list[dict]) -> dict[str, bool]:
    out = {}
    for r in rows:
        if r["smartgo_vs_amqtt"] is not None:
            out[f"{r['row']} vs amqtt"] = r["smartgo_vs_amqtt"] >= TARGETS["vs_amqtt"]
        if r["row"] == "qos1 publish msgs/s" and r["smartgo_vs_mosquitto"] is not None:
            out["qos1 publish msgs/s vs mosquitto"] = r["smartgo_vs_mosquitto"] >= TARGETS["qos1_vs_mosquitto"]
    return out


if __name__ == "__main__":
    main()
