"""Pull lag: how long a net actor's loop goes without a turn while consumers drain many queues.

A consumer of 1,024 queues keeps one pull in flight per queue (RocketMQ's push consumer: suspend
flag, commit offset, 32 messages); --groups new groups drain a --backlog per queue at once over
--connections connections (JSON headers, as the Java client), then wait parked until one more
message reaches every queue (the hold actor wakes every pull at once). A thread samples the
board every 10 ms: each actor's loop lag (how late its heartbeat timer fired: the longest its loop
went without a turn) and heartbeat age. Reported: the net actor's largest lag during the drain
and the wake, the largest of the other actors (what the host's scheduling alone costs: they are
mostly idle meanwhile), drain msgs/s, the wake's seconds, and any watchdog kill or busy warning.
Medians of --runs runs. --json: the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from host_probe import HostProbe  # noqa: E402
from smartgo.actors.board import Board, monotonic_ns  # noqa: E402
from tests.support.nodes import Node  # noqa: E402
from tests.support.broker import batch_command, pull_command, send_command, start_broker  # noqa: E402
from smartgo.net.client import RemotingClient  # noqa: E402
from smartgo.net.codes import ResponseCode, SerializeType  # noqa: E402
from smartgo.net.errors import RemotingError  # noqa: E402

TOPIC = "BenchmarkTest"
MB = 1 << 20


class LagWatch:
    """Samples every actor slot every 10 ms between start() and stop(): the largest loop lag and
    heartbeat age per actor."""

    def __init__(self, node: Node) -> None:
        self.board = Board.open(node.store / "run" / "board", writable=False)
        self.lag: dict[str, float] = {}
        self.age: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            now = monotonic_ns()
            for v in self.board.slots():
                if v.current:
                    self.lag[v.name] = max(self.lag.get(v.name, 0.0), v.loop_lag_ns / 1e6)
                    self.age[v.name] = max(self.age.get(v.name, 0.0), (now - v.heartbeat_ns) / 1e6)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.board.close()


async def fill(addr: str, client: RemotingClient, queues: int, count: int) -> None:
    async def one(q: int) -> None:
        cmd = send_command(TOPIC, b"w" * 128, queue_id=q) if count == 1 else \
            batch_command(TOPIC, [(b"b" * 128, "")] * count, queue_id=q)
        r = await client.invoke(addr, cmd, 60.0)
        assert r.code == ResponseCode.SUCCESS, r.remark
    for first in range(0, queues, 128):
        await asyncio.gather(*(one(q) for q in range(first, min(queues, first + 128))))


async def consume(addr: str, args: argparse.Namespace, watch: LagWatch) -> dict:
    """Fill, then drain and wake (watched): seconds of each, messages received."""
    conns = [RemotingClient(announce=False, serialize_type=SerializeType.JSON) for _ in range(args.connections)]
    sender = RemotingClient()
    received = 0
    drained = asyncio.Event()
    left = args.queues * args.groups            # queue-group pairs still draining the backlog

    async def queue(q: int, g: int) -> None:
        nonlocal received, left
        client = conns[(q * args.groups + g) % len(conns)]
        offset = 0
        while offset <= args.backlog:
            try:
                r = await client.invoke(addr, pull_command(TOPIC, q, offset, suspend_ms=30_000, group=f"lag_g{g}",
                                                           commit_offset=offset), 60.0)
            except RemotingError:               # the net actor was killed (the old watchdog): pull again
                await asyncio.sleep(0.1)
                continue
            if r.code == ResponseCode.SUCCESS:
                received += r.ext_int("nextBeginOffset") - offset
                offset = r.ext_int("nextBeginOffset")
                if offset == args.backlog:
                    left -= 1
                    if not left:
                        drained.set()

    try:
        await fill(addr, sender, args.queues, args.backlog)
        watch.start()
        start = time.perf_counter()
        pulls = asyncio.gather(*(queue(q, g) for q in range(args.queues) for g in range(args.groups)))
        await drained.wait()
        drain_s = time.perf_counter() - start
        await asyncio.sleep(1.0)                # the last pulls of each queue park
        start = time.perf_counter()
        await fill(addr, sender, args.queues, 1)
        await pulls
        watch.stop()
        return {"drain_s": drain_s, "wake_s": time.perf_counter() - start, "received": received}
    finally:
        for c in [*conns, sender]:
            await c.close()


def one_run(args: argparse.Namespace, workdir: Path) -> dict:
    node = start_broker(workdir / "node", {"topics": f"{TOPIC}:{args.queues}", "net_actors": 1,
                                           "commitlog_file_size": 256 * MB, "log_level": "WARNING"})
    watch = LagWatch(node)
    try:
        r = asyncio.run(consume(f"127.0.0.1:{node.port}", args, watch))
        log = node.log_text().splitlines()
        nets = [n for n in watch.lag if n.startswith("net-")]
        others = [n for n in watch.lag if n not in nets]
        health = node.health()
        return {"drain_msgs_s": round(args.queues * args.groups * args.backlog / r["drain_s"]),
                "wake_s": round(r["wake_s"], 3),
                "missing": args.queues * args.groups * (args.backlog + 1) - r["received"],
                "net_lag_max_ms": round(max(watch.lag[n] for n in nets), 1),
                "net_heartbeat_age_max_ms": round(max(watch.age[n] for n in nets), 1),
                "other_actors_lag_max_ms": round(max(watch.lag[n] for n in others), 1),
                "watchdog_kills": sum("killing it" in line for line in log),
                "busy_warnings": sum("but busy" in line for line in log),
                "restarts": sum(a["restarts"] for a in health["actors"]),
                "lag_max_ms_by_actor": {n: round(v, 1) for n, v in sorted(watch.lag.items())}}
    finally:
        watch.stop()
        node.reap()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=1024)
    ap.add_argument("--groups", type=int, default=12, help="new consumer groups draining at once")
    ap.add_argument("--connections", type=int, default=24)
    ap.add_argument("--backlog", type=int, default=128, help="messages per queue")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="256 queues, 2 groups, one run: a smoke run")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    args = ap.parse_args()
    if args.quick:
        args.queues, args.groups, args.connections, args.backlog, args.runs = 256, 2, 4, 64, 1
    probe = HostProbe()
    runs = []
    for i in probe.before_each(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench_pull_lag_") as tmp:
            runs.append(one_run(args, Path(tmp)))
        r = runs[-1]
        print(f"run {i + 1}/{args.runs}: drain {r['drain_msgs_s']:,} msgs/s, wake {r['wake_s']} s, net loop lag "
              f"max {r['net_lag_max_ms']} ms (other actors {r['other_actors_lag_max_ms']} ms), watchdog kills "
              f"{r['watchdog_kills']}, busy warnings {r['busy_warnings']}", flush=True)
    figures = {k: statistics.median(r[k] for r in runs) for k, v in runs[0].items() if not isinstance(v, dict)}
    figures["lag_max_ms_by_actor"] = sorted(runs, key=lambda r: r["net_lag_max_ms"])[len(runs) // 2][
        "lag_max_ms_by_actor"]                  # the run with the median net lag
    for k in ("missing", "watchdog_kills", "busy_warnings", "restarts"):
        figures[k] = sum(r[k] for r in runs)
    result = {"queues": args.queues, "groups": args.groups, "connections": args.connections,
              "backlog": args.backlog, "runs": args.runs, "quick": args.quick, **figures,
              "net_lag_max_ms_runs": [r["net_lag_max_ms"] for r in runs], "host_probe_ms": probe.ms,
              "loadavg": [round(x, 2) for x in os.getloadavg()]}
    print(f"median of {args.runs}: net loop lag max {figures['net_lag_max_ms']} ms, other actors "
          f"{figures['other_actors_lag_max_ms']} ms; drain {figures['drain_msgs_s']:,.0f} msgs/s; wake "
          f"{figures['wake_s']} s; kills {figures['watchdog_kills']}, missing {figures['missing']}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
