"""Master/slave replication: real nodes (a master and a `--role slave` replicating its CommitLog
over RocketMQ's HA protocol) and bench_broker's load generator processes.

Scenarios (each run on a fresh master + slave pair, 1 net actor, async flush, 128-byte bodies unless noted):
  catch_up       the master gets a backlog first (--catch-up-mb, batched sends of 32 1-KiB messages), then
                 the slave starts: its catch-up rate in MB/s from its connection (the master's ha.slaves
                 turns 1; the slave reports its position at once) until its commitlog.written equals the
                 master's, the CPU ms per MB of the master's and of the slave's ha actor over that time
                 (psutil on the actor pids), and both ha actors' RSS at the end (mapped CommitLog pages they
                 touched count; they drop them every 64 MiB)
  async_batched  bench_broker's batch load (32 messages a request, one connection, 32 requests in flight)
                 with a slave attached: msgs/s; the replication lag (commitlog.written - commitlog.slave_acked
                 on the master, read from its board every 10 ms while the producer runs): p50/p99/max KiB;
                 and the ms from the producer's last reply to the master's slave_acked reaching the end
                 (sampled every ms then; 0 when the slave had it all before that reply)
  sync_master    bench_broker's 16 concurrent sync producers against a master with replication=async and
                 against one with replication=sync (SYNC_MASTER: a send is answered once a slave has
                 acknowledged it), each with a slave attached: msgs/s, p50/p99 send latency, their ratios
                 sync/async, and every non-SUCCESS answer counted as an error by its code
                 (FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE, ...)

MB is 2**20 bytes. Every figure is the median of --runs runs, each on fresh nodes, except `errors`: the
total over the runs. The machine is shared (2 vCPU): the load average is reported, and host_probe_ms
(the CPU time of a fixed Python loop sampled before each run, median; higher is a slower host, see
host_probe.py) per scenario and over all. --json: the last line is one JSON object with every figure.
--quick: one short run of each (the smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_broker import (NODE, SyncLoad, broker_node, fill, median_of, percentile, run_workers,  # noqa: E402
                          sync_figures, sync_jobs, wait_dispatched)
from host_probe import HostProbe  # noqa: E402
from smartgo.actors.board import Board, BoardError  # noqa: E402
from tests.support.nodes import Node  # noqa: E402
from tests.support.broker import start_slave  # noqa: E402
from tests.support.waits import wait_until  # noqa: E402

MB = 1 << 20
KIB = 1 << 10
BACKLOG_BODY = b"c" * 1024
# --quick's backlog: psutil reads CPU times in the kernel's 10 ms ticks, and the master's ha actor
# spends ~0.5 ms a MB (less on a faster host), so 20 MB could read as no CPU at all; 64 MB is a few ticks.
QUICK_CATCH_UP_MB = 64
PAIR = {**NODE, "net_actors": 1}      # the slave takes the same settings: its CommitLog files must match


# ---- nodes ---------------------------------------------------------------------------------------------------

def slave_store(master: Node) -> Path:
    """Where slave_of keeps the slave: next to the master in broker_node's temporary folder, removed with it."""
    return master.store.parent / "slave"


@contextmanager
def slave_of(master: Node) -> Iterator[Node]:
    """A slave of `master` (in slave_store), reaped before the master goes."""
    slave = start_slave(slave_store(master), master, PAIR)
    try:
        yield slave
        slave.stop()
    finally:
        slave.reap()


@contextmanager
def pair(workdir: Path, settings: dict | None = None) -> Iterator[tuple[Node, str, Fields]]:
    """A fresh master (its address and board fields) with a slave connected to it."""
    with broker_node(workdir, {**PAIR, **(settings or {})}) as (master, addr), slave_of(master):
        fields = Fields(master.store)
        try:
            wait_until(lambda: fields["ha.slaves"] >= 1, timeout=30, message="the slave to connect")
            yield master, addr, fields
        finally:
            fields.close()


class Fields:
    """A node's board fields read in place: a read is a memory load, where node.health() builds the
    whole report and walks the node's processes (too heavy to sample every few ms)."""

    def __init__(self, store: Path) -> None:
        self.board = Board.open(store / "run" / "board", writable=False)

    def __getitem__(self, name: str) -> int:
        return self.board.get(name)

    def pid(self, actor: str) -> int:
        return self.board.read_slot(self.board.slot_of(actor)).pid

    def close(self) -> None:
        self.board.close()


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def ha_process(store: Path) -> psutil.Process | None:
    """The ha actor of the node at store, once its board names one (None before)."""
    try:
        fields = Fields(store)
    except (OSError, ValueError, BoardError):
        return None
    try:
        pid = fields.pid("ha")
        return psutil.Process(pid) if pid else None
    except (BoardError, psutil.Error):
        return None
    finally:
        fields.close()


def in_thread(fn: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


# ---- catch_up ------------------------------------------------------------------------------------------------

def scenario_catch_up(workdir: Path, backlog: int) -> dict:
    with broker_node(workdir, PAIR) as (master, addr):
        fill(addr, backlog // len(BACKLOG_BODY), body=BACKLOG_BODY)
        wait_dispatched(master)                     # an idle master: only replication (and the slave) runs then
        m = Fields(master.store)
        end = m["commitlog.written"]
        master_ha = psutil.Process(master.actor("ha")["pid"])
        connected: dict = {}
        gone = threading.Event()

        def watch() -> None:
            """When the slave connects, and its ha actor's CPU time just before (the slave reports
            its position right after connecting, and the transfer starts). The CPU time is sampled
            every 2 ms from the ha actor's start until the master counts the slave: read only after
            the connection is seen, a short catch-up could be over already and count as no CPU."""
            ha, before = None, None
            while m["ha.slaves"] < 1:
                if ha is None:
                    ha = ha_process(slave_store(master))
                else:
                    before = cpu_s(ha)
                if gone.wait(0.002):
                    return
            connected["at"] = time.monotonic()
            connected["ha"] = ha or ha_process(slave_store(master))
            connected["ha_cpu"] = cpu_s(connected["ha"]) if before is None else before

        master_cpu = cpu_s(master_ha)               # idle until the slave connects
        watcher = in_thread(watch)
        try:
            with slave_of(master) as slave:
                s = Fields(slave.store)
                try:
                    wait_until(lambda: s["commitlog.written"] >= end, timeout=600, interval=0.005,
                               message="the slave to catch up")
                    done = time.monotonic()
                    master_cpu = cpu_s(master_ha) - master_cpu
                    watcher.join(5)
                    slave_cpu = cpu_s(connected["ha"]) - connected["ha_cpu"]
                    behind = end - s["commitlog.written"]
                    rss = {"master_ha_rss_mb": master_ha.memory_info().rss / MB,
                           "slave_ha_rss_mb": connected["ha"].memory_info().rss / MB}
                finally:
                    s.close()
        finally:
            gone.set()
            watcher.join(5)
            m.close()
    seconds = done - connected["at"]
    mb = end / MB
    return {"mb_s": mb / seconds, "backlog_mb": mb, "seconds": seconds, "behind_bytes": behind,
            "master_ha_cpu_ms_per_mb": master_cpu * 1000 / mb, "slave_ha_cpu_ms_per_mb": slave_cpu * 1000 / mb,
            **rss}


# ---- async_batched -------------------------------------------------------------------------------------------

class LagSampler:
    """The master's commitlog.slave_acked and commitlog.written, read from its board in a thread of
    this (otherwise waiting) process: every `every` s from the first write on, and every ms from
    `seconds` after it (the end of the producer's run) until finish(), to time the slave's tail."""

    def __init__(self, fields: Fields, seconds: float, every: float = 0.01) -> None:
        self.fields = fields
        self.seconds = seconds
        self.every = every
        self.trace: list[tuple[float, int, int]] = []      # (time.monotonic(), slave_acked, written)
        self._finish = threading.Event()
        self._thread = in_thread(self._run)

    def _run(self) -> None:
        f = self.fields
        start = f["commitlog.written"]
        fine_from = 0.0
        while True:
            acked = f["commitlog.slave_acked"]          # first: acked <= written, so a lag is never negative
            written = f["commitlog.written"]
            now = time.monotonic()
            if not fine_from and written > start:
                fine_from = now + self.seconds - 0.05
            if fine_from:
                self.trace.append((now, acked, written))
            if self._finish.is_set() and acked >= written:
                return
            time.sleep(0.001 if fine_from and now >= fine_from else self.every)

    def finish(self, timeout: float) -> None:
        """Stop once the slave has acknowledged everything written."""
        self._finish.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the slave did not catch up within {timeout:g}s of the run's end")

    def lags(self, until: float) -> list[int]:
        """written - slave_acked up to `until`, one sample per `every` s, sorted."""
        out, due = [], 0.0
        for t, acked, written in self.trace:
            if t > until:
                break
            if t >= due:
                out.append(written - acked)
                due = t + self.every
        return sorted(out)

    def caught_up_at(self) -> float:
        """When slave_acked reached the final written position."""
        end = self.trace[-1][2]
        return next(t for t, acked, _ in self.trace if acked >= end)


def scenario_async_batched(workdir: Path, seconds: float) -> dict:
    with pair(workdir) as (master, addr, m):
        sampler = LagSampler(m, seconds)
        results, cpu = run_workers([("batch", {"addr": addr, "seconds": seconds, "depth": 32, "batch": 32})], master)
        sampler.finish(60)
        behind = m["commitlog.written"] - m["commitlog.slave_acked"]
    r = results[0]
    lags = sampler.lags(until=r["last_reply"])
    return {"msgs_s": r["msgs"] / r["seconds"], "errors": r["errors"],
            "lag_p50_kib": percentile(lags, 50) / KIB, "lag_p99_kib": percentile(lags, 99) / KIB,
            "lag_max_kib": max(lags, default=0) / KIB, "lag_samples": len(lags),
            "caught_up_ms": max(0.0, sampler.caught_up_at() - r["last_reply"]) * 1000, "behind_bytes": behind,
            "master_ha_cpu_us_per_msg": cpu["ha"] / max(r["msgs"], 1) * 1e6}


# ---- sync_master ---------------------------------------------------------------------------------------------

def scenario_sync_master(workdir: Path, seconds: float, replication: str) -> dict:
    with pair(workdir, {"replication": replication}) as (master, addr, _fields):
        results, cpu = run_workers(sync_jobs(addr, seconds, {}, SyncLoad()), master)
    return {**sync_figures(results, cpu), "error_codes": merged_codes(results)}


# ---- runs ----------------------------------------------------------------------------------------------------

def summary(runs: list[dict]) -> dict:
    """median_of the runs, but errors (and which) summed: one bad run is not hidden by two good ones."""
    out = median_of(runs)
    if "errors" in out:
        out["errors"] = sum(r["errors"] for r in runs)
    if "error_codes" in out:
        out["error_codes"] = merged_codes(runs)
    return out


def merged_codes(results: list[dict]) -> dict[str, int]:
    """The error codes of several workers or runs, counted together."""
    return dict(sum((Counter(r["error_codes"]) for r in results), Counter()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one short run of each scenario (the smoke test)")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    ap.add_argument("--runs", type=int, default=3, help="runs per scenario (median reported), each on fresh nodes")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per async_batched/sync_master run")
    ap.add_argument("--catch-up-mb", type=int, default=300, help="the master's backlog before the slave starts")
    ap.add_argument("--only", default="", help="comma-separated scenarios (catch_up,async_batched,sync_master)")
    args = ap.parse_args()
    quick = args.quick
    runs, seconds = (1, 1.5) if quick else (args.runs, args.seconds)
    backlog = (QUICK_CATCH_UP_MB if quick else args.catch_up_mb) * MB
    only = set(filter(None, args.only.split(","))) or {"catch_up", "async_batched", "sync_master"}
    results: dict = {"quick": quick, "runs": runs, "seconds": seconds, "catch_up_mb": backlog // MB}
    load_before = [round(x, 2) for x in os.getloadavg()]
    host = HostProbe()

    def repeat(name: str, *fns: Callable[[], dict]) -> list[list[dict]]:
        """Each fn runs once per run (on fresh nodes, in turn); their figures per fn."""
        probe = HostProbe()
        figures = [[] for _ in fns]
        for _ in probe.before_each(runs):
            for out, fn in zip(figures, fns):
                out.append(fn())
        host.samples += probe.samples
        results[name] = {"host_probe_ms": probe.ms}
        return figures

    with tempfile.TemporaryDirectory(prefix="bench_replication_") as tmp:
        work = Path(tmp)
        if "catch_up" in only:
            [catch_up] = repeat("catch_up", lambda: scenario_catch_up(work, backlog))
            results["catch_up"].update(summary(catch_up))
        if "async_batched" in only:
            [batched] = repeat("async_batched", lambda: scenario_async_batched(work, seconds))
            results["async_batched"].update(summary(batched))
        if "sync_master" in only:
            a, s = repeat("sync_master", lambda: scenario_sync_master(work, seconds, "async"),
                          lambda: scenario_sync_master(work, seconds, "sync"))
            async_, sync = summary(a), summary(s)
            results["sync_master"].update({
                "async": async_, "sync": sync, "msgs_s_ratio": round(sync["msgs_s"] / async_["msgs_s"], 3),
                "p50_ratio": round(sync["p50_ms"] / async_["p50_ms"], 3),
                "p99_ratio": round(sync["p99_ms"] / async_["p99_ms"], 3),
                "errors": async_["errors"] + sync["errors"]})
        for name in ("catch_up", "async_batched", "sync_master"):
            if name in results:
                print(f"{name}: {results[name]}", file=sys.stderr)
    results["load_avg"] = {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]}
    results["host_probe_ms"] = host.ms
    print(json.dumps(results) if args.json else json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
