"""Many queues: one node serving tens of thousands of queues at once (topics of 1,000 queues).

Each run starts a fresh node (supervisor.py --role master), sends one 128-byte message to every
queue, --rounds times over (--depth requests in flight on one connection), waits for dispatch, then
pulls each queue back from offset 0 (32 a request). It reports msgs/s of both phases, messages
refused or missing, for every actor its RSS, PSS (its share of pages other processes map too) and
open descriptors with the totals, and the seconds from a clean stop, then from a kill -9 of the
whole node, to the last queue served again. Every ConsumeQueue file an actor maps costs a descriptor and
the page-cache folio it touched in RSS, so the actors map at most --mapped-queue-files at once
(MappingLimit); one set of runs per value given. The figures are medians of --runs runs.
--json: the last line is one JSON object.
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

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from host_probe import HostProbe  # noqa: E402
from tests.support.nodes import Node  # noqa: E402
from tests.support.broker import pull_command, restart_broker, send_command, start_broker  # noqa: E402
from smartgo.net.client import RemotingClient  # noqa: E402
from smartgo.net.codes import ResponseCode  # noqa: E402
from tests.support.waits import wait_until  # noqa: E402

BODY = b"m" * 128
PER_TOPIC = 1000
MB = 1 << 20


def queues_of(count: int) -> list[tuple[str, int]]:
    return [(f"Many{i // PER_TOPIC:03d}", i % PER_TOPIC) for i in range(count)]


def topics_setting(queues: list[tuple[str, int]]) -> str:
    sizes: dict[str, int] = {}
    for topic, q in queues:
        sizes[topic] = q + 1
    return ",".join(f"{t}:{n}" for t, n in sizes.items())


async def pipelined(addr: str, commands: list, depth: int) -> tuple[list, float]:
    """Every command's answer (None: none came) and the seconds they took, `depth` in flight."""
    answers: list = [None] * len(commands)
    todo = iter(range(len(commands)))
    async with RemotingClient() as client:
        await client.connection(addr)

        async def worker() -> None:
            for i in todo:
                try:
                    answers[i] = await client.invoke(addr, commands[i], 30.0)
                except (OSError, asyncio.TimeoutError):
                    pass

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(depth)))
        return answers, time.perf_counter() - start


def actor_memory(node: Node) -> dict[str, dict]:
    out = {}
    for name, pid in [("supervisor", node.proc.pid)] + [(a["name"], a["pid"]) for a in node.health()["actors"]]:
        try:
            p = psutil.Process(pid)
            full = p.memory_full_info()
            out[name] = {"rss_mb": round(full.rss / MB, 1), "pss_mb": round(full.pss / MB, 1),
                                  "fds": p.num_fds()}
        except (psutil.Error, TypeError):
            continue
    return out


def one_run(queues: list[tuple[str, int]], rounds: int, depth: int, mapped: int | None, workdir: Path) -> dict:
    settings = {"topics": topics_setting(queues), "commitlog_file_size": 256 << 20, "log_level": "WARNING"}
    if mapped is not None:
        settings["mapped_queue_files"] = mapped
    node = start_broker(workdir / "node", settings)
    addr = f"127.0.0.1:{node.port}"
    nodes = [node]
    try:
        sends = [send_command(t, BODY, queue_id=q) for _ in range(rounds) for t, q in queues]
        answers, send_s = asyncio.run(pipelined(addr, sends, depth))
        refused = sum(a is None or a.code != ResponseCode.SUCCESS for a in answers)

        def caught_up() -> bool:
            fields = node.health()["fields"]
            return fields["commitlog.dispatched"] >= fields["commitlog.written"]
        wait_until(caught_up, timeout=120, message="dispatch to catch up")
        after_send = actor_memory(node)
        answers, pull_s = asyncio.run(pipelined(addr, [pull_command(t, q, 0) for t, q in queues], depth))
        pulled = sum(a.ext_int("nextBeginOffset") for a in answers
                     if a is not None and a.code == ResponseCode.SUCCESS)
        memory = actor_memory(node)
        restarts = {}
        for how in ("stop", "kill"):            # a clean stop's start, then a kill -9's recovery
            node.stop(timeout=120) if how == "stop" else node.kill()
            start = time.perf_counter()
            node = restart_broker(node)
            nodes.append(node)
            last = pull_command(*queues[-1], rounds - 1)
            wait_until(lambda: asyncio.run(pipelined(addr, [last], 1))[0][0].code == ResponseCode.SUCCESS,
                       timeout=300, message="the last queue after the restart")
            restarts[f"restart_after_{how}_s"] = round(time.perf_counter() - start, 2)
        return {"send_msgs_s": round(len(sends) / send_s), "pull_msgs_s": round(pulled / pull_s), **restarts,
                "refused": refused, "missing": len(sends) - refused - pulled,
                "dispatch_rss_mb_after_send": after_send.get("dispatch", {}).get("rss_mb"),
                "total_rss_mb": round(sum(m["rss_mb"] for m in memory.values()), 1),
                "total_pss_mb": round(sum(m["pss_mb"] for m in memory.values()), 1),
                "max_fds": max(m["fds"] for m in memory.values()), "actors": memory}
    finally:
        for n in nodes:
            n.reap()


def median_of(runs: list[dict]) -> dict:
    """Each number's median across runs; per-actor figures from the run with the median total RSS."""
    mid = sorted(runs, key=lambda r: r["total_rss_mb"])[len(runs) // 2]
    out = {k: statistics.median(r[k] for r in runs) for k, v in runs[0].items()
           if isinstance(v, (int, float)) and all(r[k] is not None for r in runs)}
    out["refused"] = sum(r["refused"] for r in runs)
    out["missing"] = sum(r["missing"] for r in runs)
    out["actors"] = mid["actors"]
    out["send_msgs_s_runs"] = [r["send_msgs_s"] for r in runs]
    out["pull_msgs_s_runs"] = [r["pull_msgs_s"] for r in runs]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=20_000, help="queues in all (topics of 1,000)")
    ap.add_argument("--rounds", type=int, default=2, help="messages sent to each queue")
    ap.add_argument("--depth", type=int, default=64, help="requests in flight")
    ap.add_argument("--mapped-queue-files", default="", help="comma-separated values to compare (default: the "
                                                              "node's default)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2,000 queues, one run: a smoke run")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    args = ap.parse_args()
    if args.quick:
        args.queues, args.runs = min(args.queues, 2000), 1
    values = [int(v) for v in args.mapped_queue_files.split(",") if v.strip()] or [None]
    queues = queues_of(args.queues)
    results: dict = {"queues": args.queues, "rounds": args.rounds, "runs": args.runs, "quick": args.quick,
                     "loadavg_before": [round(x, 2) for x in os.getloadavg()], "by_mapped_queue_files": {}}
    probe = HostProbe()
    for mapped in values:
        runs = []
        for _ in probe.before_each(args.runs):
            with tempfile.TemporaryDirectory(prefix="bench_many_queues_") as tmp:
                runs.append(one_run(queues, args.rounds, args.depth, mapped, Path(tmp)))
        figures = results["by_mapped_queue_files"][str(mapped or "default")] = median_of(runs)
        print(f"mapped_queue_files {mapped or 'default'}: send {figures['send_msgs_s']:,.0f} msgs/s, pull "
              f"{figures['pull_msgs_s']:,.0f} msgs/s, refused {figures['refused']}, missing {figures['missing']}, "
              f"RSS {figures['total_rss_mb']} MB (PSS {figures['total_pss_mb']} MB), most descriptors "
              f"{figures['max_fds']}; served again {figures['restart_after_stop_s']} s after a restart, "
              f"{figures['restart_after_kill_s']} s after kill -9", flush=True)
        for name, m in figures["actors"].items():
            print(f"  {name:<12} RSS {m['rss_mb']:>8} MB  PSS {m['pss_mb']:>8} MB  fds {m['fds']}")
    results["host_probe_ms"] = probe.ms
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
