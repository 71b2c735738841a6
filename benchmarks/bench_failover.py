"""Time to fail over: kill -9 of a master under a producer's steady sends, until that same
producer's sends are acknowledged again by the slave promoted in its place; or, with
--switchover, an operator's switchover (Admin.elect_master) instead of the kill.

    python benchmarks/bench_failover.py [--runs 3] [--delay 10] [--switchover] [--quick] [--json]

Per run, on free loopback ports: a registry with failover_enable (failover_delay --delay), a
master (replication=sync, failover_enable) and its slave (failover_enable). One SDK producer
(AsyncProducer, one send at a time, 128-byte bodies) sends for 2 s; then every process of the
master's node is killed at once (kill -9), and the producer goes on until it has 200 SEND_OKs
from the new master. With --switchover the master replicates asynchronously (a kill would lose
its unreplicated tail; a switchover must not) and elect_master replaces the kill. Per run:

  promoted_s    kill -> the registry routes the slave as brokerId 0 (polled every 20 ms)
  resumed_s     kill (or the switchover's answer) -> the producer's first SEND_OK after it
  switch_s      --switchover: how long elect_master took (fence, catch-up, promotion)
  failed_sends  sends that raised in between (each after the SDK's own two retries)
  lost          acknowledged messages (SEND_OK) the new master cannot serve: must be 0

promoted_s is at least --delay (the registry waits that long for the master to come back: an
actor restart must not fail a node over) plus the slave's node restart in its new role;
resumed_s adds the producer's route refresh (the SDK refreshes early after a refused
connection). Medians over --runs; host_probe_ms: the CPU time of a fixed Python loop before each
run (host_probe.py; higher is a slower host). --json: the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support: the test helpers

from host_probe import HostProbe  # noqa: E402
from tests.support.nodes import launch_node  # noqa: E402
from tests.support.broker import pull_command, start_broker, start_slave  # noqa: E402
from smartgo.client import Admin, AsyncAdmin, AsyncProducer, Message, SendStatus  # noqa: E402
from smartgo.net.client import BlockingRemotingClient  # noqa: E402
from smartgo.net.codes import ResponseCode  # noqa: E402
from smartgo.store.record import decode_records  # noqa: E402
from tests.support.waits import wait_until  # noqa: E402

TOPIC = "Failover"
QUEUES = 4
FAILOVER = {"failover_enable": "true", "log_level": "WARNING"}
AFTER = 200                     # SEND_OKs from the new master that end a run


def routed_master(registry: str) -> str | None:
    with Admin(registry) as admin:
        broker = admin.cluster_info().brokers.get("broker-a")
    return broker.master_addr if broker is not None else None


def served_bodies(client: BlockingRemotingClient, addr: str) -> set[bytes]:
    """Every message body the broker at addr serves on TOPIC's queues."""
    bodies: set[bytes] = set()
    for q in range(QUEUES):
        offset = 0
        while True:
            r = client.invoke(addr, pull_command(TOPIC, q, offset, max_nums=32))
            if r.code != ResponseCode.SUCCESS:
                break
            bodies.update(m.body for m in decode_records(r.body_bytes()))
            offset = int(r.ext_fields["nextBeginOffset"])
    return bodies


async def produce(registry: str, killed: asyncio.Event, report: dict) -> None:
    """Send until AFTER acknowledgements came after the kill (or switchover); note the
    acknowledged bodies."""
    acked: list[bytes] = report["acked"]
    async with AsyncProducer("FailoverBench", registry, send_timeout=2.0) as p:
        i = after = 0
        while after < AFTER:
            body = b"%08d" % i + b"m" * 120
            i += 1
            late = killed.is_set()              # sent after the kill: only the new master can answer it
            try:
                result = await p.send(Message(TOPIC, body))
            except Exception:
                report["failed_sends"] += late
                await asyncio.sleep(0.01)
                continue
            if result.status is SendStatus.SEND_OK:
                acked.append(body)
                if late:
                    after += 1
                    report.setdefault("resumed_at", time.perf_counter())


async def one_run(base: Path, delay: float, switchover: bool) -> dict:
    registry = launch_node(base / "registry", {**FAILOVER, "failover_delay": delay}, role="registry")
    nodes = [registry]
    client = BlockingRemotingClient()
    try:
        reg = f"127.0.0.1:{registry.port}"
        master = start_broker(base / "master", {"topics": f"{TOPIC}:{QUEUES}", "registry": reg,
                                                "replication": "async" if switchover else "sync", **FAILOVER})
        nodes.append(master)
        slave = start_slave(base / "slave", master, {"registry": reg, **FAILOVER})
        nodes.append(slave)
        slave_addr = f"127.0.0.1:{slave.port}"
        wait_until(lambda: routed_master(reg) == f"127.0.0.1:{master.port}"
                   and master.health()["fields"]["flag.read_only"] == 0, timeout=20, message="a confirmed master")
        killed = asyncio.Event()
        report: dict = {"acked": [], "failed_sends": 0}
        sender = asyncio.get_running_loop().create_task(produce(reg, killed, report))
        await asyncio.sleep(2.0)
        t0 = time.perf_counter()
        figures = {}
        if switchover:
            async with AsyncAdmin(reg) as admin:
                await admin.elect_master("broker-a", broker_addr=slave_addr)
            figures["switch_s"] = round(time.perf_counter() - t0, 3)
        else:
            master.kill()
        killed.set()
        await asyncio.to_thread(wait_until, lambda: routed_master(reg) == slave_addr,
                                timeout=delay + 60, interval=0.02, message="the slave promoted")
        promoted_s = time.perf_counter() - t0
        await asyncio.wait_for(sender, delay + 90)
        lost = set(report["acked"]) - served_bodies(client, slave_addr)
        return {"promoted_s": round(promoted_s, 3), "resumed_s": round(report["resumed_at"] - t0, 3), **figures,
                "failed_sends": report["failed_sends"], "acked": len(report["acked"]), "lost": len(lost)}
    finally:
        client.close()
        for node in reversed(nodes):
            node.reap()


def median(results: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in results), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--delay", type=float, default=10.0, help="the registry's failover_delay (default: its default)")
    ap.add_argument("--switchover", action="store_true", help="an operator's switchover instead of kill -9")
    ap.add_argument("--quick", action="store_true", help="smoke run: one run, failover_delay 1 s")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    a = ap.parse_args()
    runs, delay = (1, 1.0) if a.quick else (a.runs, a.delay)
    probe = HostProbe()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_failover_") as tmp:
        for i in probe.before_each(runs):
            r = asyncio.run(one_run(Path(tmp) / f"run{i}", delay, a.switchover))
            results.append(r)
            print(f"run {i + 1}: {'switchover answered after %s s, ' % r['switch_s'] if a.switchover else ''}"
                  f"promoted after {r['promoted_s']} s, sends acknowledged again after "
                  f"{r['resumed_s']} s, {r['failed_sends']} failed sends, {r['lost']} of {r['acked']} "
                  f"acknowledged lost", flush=True)
    summary = {"quick": a.quick, "runs": runs, "switchover": a.switchover, "failover_delay_s": delay,
               "host_probe_ms": probe.ms, "loadavg": os.getloadavg(), "promoted_s": median(results, "promoted_s"),
               "resumed_s": median(results, "resumed_s"), "failed_sends": median(results, "failed_sends"),
               "acked": sum(r["acked"] for r in results), "lost": sum(r["lost"] for r in results)}
    if a.switchover:
        summary["switch_s"] = median(results, "switch_s")
    summary["pass"] = summary["lost"] == 0
    print(json.dumps(summary) if a.json else json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
