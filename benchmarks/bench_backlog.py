"""A backlog of --messages messages on one node (issue 47): writes as it fills, then memory, restarts,
kill -9, a cold catch-up, queries and cleanup on the full store.

    python benchmarks/bench_backlog.py [--messages N] [--store DIR] [--clean] [--only S,...] [--quick]
        [--slave-read-enable] [--json]

One node (supervisor.py --role master, async flush) on a kept store: 128-byte bodies, each with its own
UNIQ_KEY (indexed, as a Java producer's are), batches of 32 from FILL_WORKERS load generator processes
(FILL_DEPTH batches in flight each), 8 batches in 9 to 16 topics x 8 queues in turn and 1 in 9 to the
next of the --wide-queues queues of one topic (10,000; a store filled when a topic had at most 1,024 queues
keeps its topics of 1,000: fill.json says which).
CommitLog files of 256 MiB (--quick: 8 MiB and a small index), the other files at the node's defaults.

THE STORE IS KEPT between runs in --store (default <tmp>/smartgo-bench-backlog, with --quick
<tmp>/smartgo-bench-backlog-quick): a second run reuses it and only tops it up to --messages held;
--clean removes it after the run. Beside the node's store, fill.json keeps the fill's write figures
(per 1 % of the fill: msgs/s and a histogram of the batched sends' latencies, also of those that
completed within 1 s after a new CommitLog file appeared) and ~200 marker messages (key, time,
offset), so a resumed run still reports them. A fill that would take the disk above 70 % (df's
Use%) is refused.

Scenarios after the fill, in this order (--only picks some; the fill always runs first):
  write     (from fill.json) batched-send msgs/s over the last 10 % of the fill within 15 % of the
            first 10 %'s; send p99 of every tenth and during roll-overs <= 2 x the first 1 %'s
  rss       total RSS of all actors, sampled every second of the whole run: max and per phase, and
            each actor's anonymous / file-backed split at the max; this scenario runs a producer
            (50,000 msgs/s) and a consumer from the oldest message for 10 s     target <= 600 MB
  restart   clean stop, start: seconds until a send is served                      target <= 5 s
  kill      kill -9 of the whole node under load (async flush): seconds until served   <= 30 s
  syncflush the node on sync flush, SYNC_MESSAGES single sends acknowledged from 4 threads, kill -9
            while they go on, restart: every acknowledged message must be there        0 lost
  catchup   page cache dropped (echo 3 > /proc/sys/vm/drop_caches, as root; cache_dropped says
            whether it worked), one consumer group pulls the 16 x 8 queues from their oldest
            message, 2 processes, while a producer sends at 50,000 msgs/s for 30 s: consumer
            msgs/s >= 300,000; producer p99 <= 2 x its p99 at that rate on an empty node (a fresh
            node with the same settings, measured for 10 s just before, after 5 s unmeasured: a new
            node's first second creates its files)
            With --slave-read-enable, then the master/slave variant (catchup_slave): the node restarts
            with slave_read_enable, a slave (supervisor --role slave, its own kept store in <store>/slave,
            registered with the node's embedded registry) replicates the whole CommitLog and dispatches
            it (replicated_s), the page cache is dropped, and the same producer (on the master) and
            group run, each queue's next pull going to the broker the last answer suggested
            (suggestWhichBrokerId, as the client does; consumer.at_slave: what the slave served). A
            pull reading past the in-memory window is sent to the slave: that window is the default
            40 % of RAM on a store over twice its size, else the percent of RAM that leaves half the
            CommitLog outside it (access_message_in_memory_max_ratio in the figures; 0 on --quick).
            The same targets. Refused (catchup_slave.refused) when the slave's copy would take the
            disk above 70 %, as with a 100,000,000-message store on a 100 GB disk.
  query     page cache dropped, ~20 markers spread over the store: QUERY_MESSAGE by key
            (UNIQ_KEY) and SEARCH_OFFSET_BY_TIMESTAMP at the marker's time: p50/p99/max <= 100 ms
  cleanup   the disk watermarks, simulated: the node reads its disk usage from a file
            (disk_usage_file, 0.1 otherwise), deletes at most one CommitLog file a pass
            (cleanup_max_files 1, cleanup_interval 1 s) and counts every file as expired
            (file_reserved_hours ~0; delete_when never). The file is set to 0.76 (expired files
            go), then 0.86 (the oldest go), each until a CommitLog file is deleted; then 0.91
            (sends refused) and, at the first refusal, 0.80: the refusal must lift by itself.
            A producer sends one message at a time throughout: the longest stretch without an
            acknowledged send while files are deleted must be <= 100 ms. This deletes the 3-4
            oldest CommitLog files (~1 GB): a later run tops the fill up again.
  coldrestart  restart with the page cache dropped between stop and start (as after a reboot)

The producers of rss and catchup write into the fill's queues: the store grows by ~2,000,000
messages a run. unclean_stops counts clean stops that left the abort file (an actor killed at
shutdown_timeout: the next start is an abnormal recovery). --json: the last line is one JSON
object with every figure and "pass": {target: true/false}; after each scenario the figures so far
are in <store>/last_run.json too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_broker import BODY, _wait, actor_processes, broker_node, percentile, run_workers  # noqa: E402
from bench_restart import Sender  # noqa: E402
from tests.support.broker import offset_command, pull_command, send_command  # noqa: E402
from tests.support.nodes import NO_MQTT, SUPERVISOR, Node, toml_dumps  # noqa: E402
from tests.support.waits import free_ports, wait_until  # noqa: E402
from smartgo.net.client import BlockingRemotingClient, RemotingClient  # noqa: E402
from smartgo.net.codes import RequestCode, ResponseCode  # noqa: E402
from smartgo.net.command import RemotingCommand  # noqa: E402
from smartgo.store.mapped_file import segment_starts  # noqa: E402
from smartgo.store.reads import physical_memory  # noqa: E402
from smartgo.store.record import decode_records, encode_batch_body, encode_properties, parse_offset_msg_id  # noqa: E402

TOPICS = tuple(f"Backlog{i:02d}" for i in range(16))
QUEUES = 8
WIDE = "BacklogWide"                    # one topic of --wide-queues queues
OLD_WIDE_PER_TOPIC = 1000               # a store filled while a topic had at most 1,024 queues: BacklogWide0, 1, ...
SYNC_TOPIC, SYNC_QUEUES = "BacklogSync", 4
PROBE_TOPIC = "Restart"                 # bench_restart.Sender's topic
BATCH = 32
FILL_WORKERS = 2
FILL_DEPTH = 8                          # batches in flight per load generator
CATCHUP_RATE = 50_000
SYNC_MESSAGES = 4000
MARKERS = 200
DISK_LIMIT = 0.70
EST_BYTES_PER_MSG = 340                 # CommitLog record + ConsumeQueue entry + index entry, before a fill
TARGETS = {"write_rate_ratio": 0.85, "write_p99_ratio": 2.0, "rss_mb": 600, "restart_s": 5.0, "kill_s": 30.0,
           "sync_lost": 0, "catchup_msgs_s": 300_000, "catchup_producer_msgs_s": CATCHUP_RATE,
           "catchup_p99_ratio": 2.0, "query_ms": 100.0, "cleanup_stall_ms": 100.0}
SCENARIOS = ("write", "rss", "restart", "kill", "syncflush", "catchup", "query", "cleanup", "coldrestart")
GB = 1 << 30


def node_settings(quick: bool, wide: tuple[int, int]) -> dict:
    """The kept node's settings (fill.json keeps them: a resumed run starts the node as it was)."""
    queues = {}
    for t, q in wide_lanes(wide):
        queues[t] = q + 1
    topics = ";".join([f"{t}:{QUEUES}" for t in TOPICS] + [f"{t}:{n}" for t, n in queues.items()] +
                      [f"{SYNC_TOPIC}:{SYNC_QUEUES}", f"{PROBE_TOPIC}:4"])
    small = {"index_slot_count": 500_000, "index_entry_count": 2_000_000} if quick else {}
    return {**NO_MQTT, "vip_port": 0, "topics": topics, "commitlog_file_size": (8 if quick else 256) << 20,
            "heartbeat_interval": 0.2, "log_level": "WARNING", "cleanup_interval": 1.0, "cleanup_max_files": 1,
            "file_reserved_hours": 0.0001, "delete_when": "", **small}


def lane(k: int, wide: tuple[int, int]) -> tuple[str, int]:
    """Where the k-th batch goes: 8 in 9 to the 16 x 8 queues in turn, 1 in 9 to the wide topic's next queue."""
    if k % 9 == 8:
        return wide_lane((k // 9) % wide[0], wide[1])
    m = k // 9 * 8 + k % 9
    return TOPICS[m // QUEUES % len(TOPICS)], m % QUEUES


def wide_lane(j: int, per_topic: int) -> tuple[str, int]:
    """The j-th wide queue: of the one topic (per_topic 0) or of topics of per_topic queues."""
    return (f"{WIDE}{j // per_topic}", j % per_topic) if per_topic else (WIDE, j)


def wide_lanes(wide: tuple[int, int]) -> list[tuple[str, int]]:
    """wide: (queues, queues a topic: 0 for one topic), as fill.json keeps them."""
    return [wide_lane(j, wide[1]) for j in range(wide[0])]


# ---- latency histograms (mergeable across runs: fill.json keeps them) ----------------------------------------

_LOG_STEP = math.log(1.05)


def hist_add(hist: dict, ms: float) -> None:
    b = str(max(0, int(math.log(max(ms, 0.01) / 0.01) / _LOG_STEP)))
    hist[b] = hist.get(b, 0) + 1


def hist_merge(into: dict, other: dict) -> None:
    for b, n in other.items():
        into[b] = into.get(b, 0) + n


def hist_quantile(hist: dict, q: float) -> float | None:
    """The q-quantile in ms (the upper edge of its 5 % wide bin), None when empty."""
    total = sum(hist.values())
    if not total:
        return None
    seen = 0
    for b in sorted(hist, key=int):
        seen += hist[b]
        if seen >= q * total:
            return round(0.01 * 1.05 ** (int(b) + 1), 3)
    return None


# ---- the kept store -------------------------------------------------------------------------------------------

@dataclass
class Backlog:
    """The kept store: the node's store dir, its config, its disk-usage file, and fill.json."""
    root: Path
    record: dict = field(default_factory=dict)

    node_dir = property(lambda self: self.root / "node")
    config = property(lambda self: self.root / "node.toml")
    usage_file = property(lambda self: self.root / "node.disk_usage")
    record_file = property(lambda self: self.root / "fill.json")

    def load(self, settings: dict, bucket: int, **extra: object) -> bool:
        """Read fill.json (or start one); True when a store was there to reuse."""
        if self.record_file.exists():
            self.record = json.loads(self.record_file.read_text())
            return True
        self.root.mkdir(parents=True, exist_ok=True)
        self.record = {"settings": settings, "bucket": bucket, "buckets": [], "markers": [], "fills": [], **extra}
        return False

    def save(self) -> None:
        tmp = self.record_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record))
        os.replace(tmp, self.record_file)

    def set_usage(self, ratio: float) -> None:
        self.usage_file.write_text(f"{ratio}\n")


class Runner:
    """The node on the kept store: started on the same ports within a run, with its actors' RSS
    sampled every second whatever it does. A slave (role "slave") registers with the master's
    embedded registry, at registry_port, which tells it where to replicate from."""

    def __init__(self, backlog: Backlog, role: str = "master", registry_port: int = 0) -> None:
        self.backlog = backlog
        self.role = role
        self.port, self.registry_port, self.ha_port = free_ports(3)
        self.registry_port = registry_port or self.registry_port
        # the nodes' TMPDIR: short, as the fork server's socket path in it must fit AF_UNIX's 108 bytes
        # (a folder beside a store under pytest's basetemp did not, nor does a test's TMPDIR there)
        self.tmp = Path(tempfile.mkdtemp(prefix="sgbl-", dir="/tmp" if os.path.isdir("/tmp") else None))
        self.node: Node | None = None
        self.phase = "start"
        self.rss: dict[str, float] = {}
        self.per_actor: dict[str, dict[str, float]] = {}
        self.unclean_stops = 0
        self._sampling = True
        self._sampler = threading.Thread(target=self._sample, name="rss", daemon=True)
        self._sampler.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def launch(self, **overrides: object) -> float:
        """Start the node; seconds from its launch until a send is served."""
        b = self.backlog
        registry = {"embedded_registry_port": self.registry_port} if self.role == "master" else {
            "registry": f"127.0.0.1:{self.registry_port}"}
        b.config.write_text(toml_dumps({**b.record["settings"], **overrides, "disk_usage_file": str(b.usage_file),
                                        "ha_port": self.ha_port, **registry}))
        cmd = [sys.executable, str(SUPERVISOR), "--role", self.role, "--store-dir", str(b.node_dir), "--config",
               str(b.config), "--listen-host", "127.0.0.1", "--listen-port", str(self.port)]
        tmp = self.tmp                  # what a killed node leaves there (multiprocessing's pymp-*) goes at close
        t0 = time.perf_counter()
        with open(b.root / "node.stderr", "ab") as f:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, cwd=ROOT,
                                    env={**os.environ, "TMPDIR": str(tmp)})
        self.node = Node(proc, b.node_dir, self.port, b.root / "node.stderr")
        if self.role != "master":                  # a slave takes no sends
            self.node.wait_healthy(timeout=300)
            return time.perf_counter() - t0
        client = BlockingRemotingClient()
        try:
            def served() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"the node exited ({proc.returncode}); see {b.root / 'node.stderr'}")
                try:
                    return client.invoke(self.addr, send_command(PROBE_TOPIC, BODY), 2.0).code == ResponseCode.SUCCESS
                except Exception:
                    time.sleep(0.01)
                    return False
            wait_until(served, timeout=900, interval=0.005, message="the node to serve a send")
        finally:
            client.close()
        served_s = time.perf_counter() - t0
        self.node.wait_healthy(timeout=300)
        return served_s

    def stop(self) -> float:
        """Clean stop (SIGTERM); its seconds. A stop that leaves the abort file (an actor killed at
        shutdown_timeout) is counted in unclean_stops: the next start is an abnormal recovery."""
        t0 = time.perf_counter()
        code = self.node.stop(timeout=600)
        self.node.reap()
        if code != 0:
            raise RuntimeError(f"the node stopped with exit code {code}")
        self.unclean_stops += (self.backlog.node_dir / "abort").exists()
        return time.perf_counter() - t0

    def kill(self) -> None:
        self.node.kill()
        self.node.reap()

    def _sample(self) -> None:
        while self._sampling:
            node = self.node
            try:
                per = {name: rss_split(p.pid) for name, p in actor_processes(node).items()} if node else {}
            except Exception:           # the node is restarting
                per = {}
            if per:
                total = sum(v["rss"] for v in per.values())
                if total > self.rss.get(self.phase, 0):
                    self.rss[self.phase] = total
                    if total >= max(self.rss.values()):
                        self.per_actor = per
            time.sleep(1.0)

    def close(self) -> None:
        self._sampling = False
        if self.node is not None:
            self.node.reap()
        shutil.rmtree(self.tmp, ignore_errors=True)


def rss_split(pid: int) -> dict[str, float]:
    """A process's RSS in MB, and its anonymous and file-backed (mapped store files) parts."""
    with open(f"/proc/{pid}/status") as f:
        kb = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f) if k in ("VmRSS", "RssAnon",
                                                                                            "RssFile")}
    return {"rss": round(kb["VmRSS"] / 1024, 1), "anon": round(kb["RssAnon"] / 1024, 1),
            "file": round(kb["RssFile"] / 1024, 1)}


def board_written(node: Node) -> int:
    """Messages stored in the fill's topics (every queue's max offset, summed)."""
    from smartgo.actors.board import Board
    board = Board.open(node.store / "run" / "board", writable=False)
    try:
        return sum(v["max_offset"] for topic, _, v in board.queues.items() if topic in TOPICS or topic.startswith(WIDE))
    finally:
        board.close()


def wait_dispatched(node: Node) -> None:
    wait_until(lambda: (f := node.health()["fields"])["commitlog.dispatched"] == f["commitlog.written"],
               timeout=900, interval=0.2, message="dispatch to catch up")


def min_offsets(addr: str, queues: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    client = BlockingRemotingClient()
    try:
        out = {}
        for t, q in queues:
            lo = client.invoke(addr, offset_command(RequestCode.GET_MIN_OFFSET, t, q), 10.0).ext_fields["offset"]
            hi = client.invoke(addr, offset_command(RequestCode.GET_MAX_OFFSET, t, q), 10.0).ext_fields["offset"]
            out[(t, q)] = (int(lo), int(hi))
        return out
    finally:
        client.close()


def disk_share(extra_bytes: int = 0) -> float:
    """df's Use% (used / (used + available)) of the temp dir's file system after extra_bytes more."""
    st = os.statvfs(tempfile.gettempdir())
    used = (st.f_blocks - st.f_bfree) * st.f_frsize + extra_bytes
    return used / (used + st.f_bavail * st.f_frsize - extra_bytes)


def store_bytes(path: Path) -> int:
    """Bytes the store's files take on disk (sparse files count what they hold)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def drop_page_cache() -> dict:
    """sync, echo 3 > /proc/sys/vm/drop_caches; the page cache before and after (MB)."""
    def cached() -> int:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Cached:")) // 1024
    before = cached()
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        error = None
    except OSError as exc:
        error = str(exc)
    after = cached()
    return {"cache_dropped": error is None and after < before, "cached_mb_before": before, "cached_mb_after": after,
            **({"drop_error": error} if error else {})}


# ---- the fill -------------------------------------------------------------------------------------------------

def run_async(main):
    """asyncio.run(main) on uvloop when there is one (a load generator process's loop)."""
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(main)


def _run_fill(args: dict, shared: tuple, reports) -> None:
    run_async(fill_worker(args, *shared, reports))


async def fill_worker(a: dict, counter, issued, ready, go, reports) -> None:
    """Send batches, a["depth"] in flight, while the shared count of batches issued is below
    a["requests"] (the k-th to lane(a["first_batch"] + k)); every second put the latencies binned
    per fill bucket (by the shared count of messages stored, `counter`) on `reports`."""
    template = bytearray(encode_batch_body([(BODY, 0, encode_properties({"UNIQ_KEY": "0" * 32}))] * BATCH))
    prefix = os.urandom(8).hex().upper().encode()
    places = [i + 16 for i in range(len(template)) if template.startswith(b"0" * 32, i)
              and template[i - 1:i] == b"\x01"]
    assert len(places) == BATCH
    for p in places:
        template[p - 16:p] = prefix
    ext = {}
    serial = [0]                        # UNIQ_KEY: this process's random prefix + a serial number
    bucket, wide = a["bucket"], tuple(a["wide"])
    delta: dict = {}
    state = {"acked": 0, "inflight": 0, "errors": 0, "rolling_until": 0.0, "rollovers": 0, "markers": [],
             "next_marker": 0}
    retry: list[tuple[str, int]] = []
    client = RemotingClient()
    conn = await client.connection(a["addr"])
    done = asyncio.get_running_loop().create_future()
    await _wait(ready, go)

    def send_next() -> None:
        if retry:
            topic, q = retry.pop()
        else:
            with issued.get_lock():
                k = issued.value
                if k < a["requests"]:
                    issued.value += 1
            if k >= a["requests"]:
                if state["inflight"] == 0 and not done.done():
                    done.set_result(None)
                return
            topic, q = lane(a["first_batch"] + k, wide)
        if (topic, q) not in ext:
            ext[(topic, q)] = batch_ext(topic, q)
        n = serial[0]
        serial[0] += BATCH
        for i, p in enumerate(places):
            template[p:p + 16] = b"%016X" % (n + i)
        state["inflight"] += 1
        t0 = time.perf_counter()
        conn.invoke_async(RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, ext_fields=ext[(topic, q)],
                                          body=bytes(template)), 60.0,
                          lambda r, err: on_reply(r, err, t0, (topic, q, n)))

    def on_reply(r, err, t0: float, mark: tuple) -> None:
        now = time.perf_counter()
        state["inflight"] -= 1
        if err is None and r.code == ResponseCode.SUCCESS:
            state["acked"] += 1
            with counter.get_lock():
                counter.value += BATCH
                pos = counter.value
            ms = (now - t0) * 1000
            b = delta.setdefault((pos - 1) // bucket, {"msgs": 0, "first": now, "last": now, "hist": {}, "roll": {},
                                                       "max_ms": 0.0})
            b["msgs"] += BATCH
            b["last"] = now
            b["max_ms"] = max(b["max_ms"], ms)
            hist_add(b["hist"], ms)
            if now < state["rolling_until"]:
                hist_add(b["roll"], ms)
            if pos >= state["next_marker"]:
                topic, q, n = mark
                state["markers"].append({"topic": topic, "queue": q, "key": (prefix + b"%016X" % n).decode(),
                                         "time_ms": int(time.time() * 1000), "pos": pos,
                                         "phys": parse_offset_msg_id(r.ext_fields["msgId"].split(",")[0])[2]})
                state["next_marker"] = pos + a["marker_every"]
        else:
            state["errors"] += 1
            retry.append(mark[:2])          # the same lane again
        send_next()

    async def watch_rollover() -> None:
        seen = len(segment_starts(a["commitlog_dir"]))
        while True:
            await asyncio.sleep(0.1)
            now = len(segment_starts(a["commitlog_dir"]))
            if now > seen:
                state["rolling_until"] = time.perf_counter() + 1.0
                if a["counts_rollovers"]:         # one of the load generators counts them
                    state["rollovers"] += now - seen
            seen = now

    def report() -> None:
        reports.put({"buckets": dict(delta), "markers": state["markers"], "errors": state["errors"],
                     "rollovers": state["rollovers"]})
        delta.clear()
        state.update(markers=[], errors=0, rollovers=0)

    async def reporter() -> None:
        while True:
            await asyncio.sleep(1.0)
            report()

    tasks = [asyncio.ensure_future(watch_rollover()), asyncio.ensure_future(reporter())]
    for _ in range(a["depth"]):
        send_next()
    await done
    for t in tasks:
        t.cancel()
    report()
    reports.put(None)
    await client.close()


def batch_ext(topic: str, queue_id: int) -> dict[str, str]:
    """SEND_BATCH_MESSAGE's header (tests.support.broker.batch_command's)."""
    return dict(zip("abcdefghijm", ["backlog_producer", topic, "TBW102", "4", str(queue_id), "0",
                                    str(int(time.time() * 1000)), "0", "", "0", "true"]))


def fill(runner: Runner, target: int, wide: tuple[int, int]) -> dict:
    """Top the store up to `target` messages; what it did."""
    b, node = runner.backlog, runner.node
    runner.phase = "fill"
    wait_dispatched(node)
    written = board_written(node)
    held = written - sum(lo for lo, _ in min_offsets(runner.addr, fill_queues(wide)).values())
    missing = target - held
    if missing <= 0:
        return {"refilled": False, "messages_before": held, "added": 0}
    per_msg = store_bytes(b.node_dir) / written if written > 100_000 else EST_BYTES_PER_MSG
    if (share := disk_share(int(missing * per_msg))) > DISK_LIMIT:
        raise SystemExit(f"refusing to fill: {missing:,} more messages (~{missing * per_msg / GB:.1f} GB) would take "
                         f"the disk to {share:.0%} (limit {DISK_LIMIT:.0%})")
    requests = -(-missing // BATCH)
    ctx = multiprocessing.get_context("spawn")
    counter, issued, go = ctx.Value("q", written), ctx.Value("q", 0), ctx.Event()
    readies = [ctx.Event() for _ in range(FILL_WORKERS)]
    reports = ctx.Queue()
    batches = b.record.setdefault("batches", 0)
    procs = [ctx.Process(target=_run_fill, daemon=True, args=({
        "addr": runner.addr, "requests": requests, "first_batch": batches, "bucket": b.record["bucket"],
        "wide": wide, "marker_every": marker_every(b.record),
        "commitlog_dir": str(b.node_dir / "commitlog"), "depth": FILL_DEPTH, "counts_rollovers": i == 0},
        (counter, issued, readies[i], go), reports)) for i in range(FILL_WORKERS)]
    for p in procs:
        p.start()
    for r in readies:
        if not r.wait(60):
            raise RuntimeError("a load generator did not get ready")
    go.set()
    t0 = time.perf_counter()
    spans: dict[int, list[float]] = {}
    base = {i: bk["seconds"] for i, bk in enumerate(b.record["buckets"])}
    finished, errors, last_print, last_save = 0, 0, 0.0, time.perf_counter()
    while finished < FILL_WORKERS:
        try:
            msg = reports.get(timeout=1.0)
        except queue.Empty:
            msg = ...
            if not any(p.is_alive() for p in procs):
                raise RuntimeError("the fill's load generators died") from None
        if msg is None:
            finished += 1
        elif msg is not ...:
            errors += msg["errors"]
            merge_report(b.record, msg, spans, base)
        now = time.perf_counter()
        if now - last_print >= 2.0:
            last_print = now
            progress(counter.value - written, missing, now - t0, node)
        if now - last_save >= 5.0:
            last_save = now
            b.save()
    for p in procs:
        p.join(10)
    b.record["batches"] = batches + requests
    progress(counter.value - written, missing, time.perf_counter() - t0, node)
    wait_dispatched(node)
    b.record["fills"].append({"added": counter.value - written, "seconds": round(time.perf_counter() - t0, 1),
                              "errors": errors, "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())})
    b.save()
    return {"refilled": True, "messages_before": held, "added": counter.value - written,
            "seconds": round(time.perf_counter() - t0, 1), "errors": errors}


def fill_queues(wide: tuple[int, int]) -> list[tuple[str, int]]:
    return [(t, q) for t in TOPICS for q in range(QUEUES)] + wide_lanes(wide)


def merge_report(record: dict, msg: dict, spans: dict[int, list[float]], base: dict[int, float]) -> None:
    """A load generator's last second into fill.json's buckets (seconds: each run's span of the bucket)."""
    buckets = record["buckets"]
    for i, d in msg["buckets"].items():
        while len(buckets) <= i:
            buckets.append({"msgs": 0, "seconds": 0.0, "hist": {}, "roll": {}, "max_ms": 0.0, "rollovers": 0})
        bk = buckets[i]
        bk["msgs"] += d["msgs"]
        bk["max_ms"] = round(max(bk["max_ms"], d["max_ms"]), 2)
        hist_merge(bk["hist"], d["hist"])
        hist_merge(bk["roll"], d["roll"])
        span = spans.setdefault(i, [d["first"], d["last"]])
        span[0], span[1] = min(span[0], d["first"]), max(span[1], d["last"])
        bk["seconds"] = base.get(i, 0.0) + span[1] - span[0]
    if msg["rollovers"] and buckets:
        buckets[-1]["rollovers"] += msg["rollovers"]
    for m in msg["markers"]:
        if not record["markers"] or m["pos"] >= record["markers"][-1]["pos"] + marker_every(record) // 2:
            record["markers"].append(m)


def marker_every(record: dict) -> int:
    """Messages between two markers."""
    return max(1, record["bucket"] * 100 // MARKERS)


def progress(done: int, total: int, seconds: float, node: Node) -> None:
    rate = done / max(seconds, 1e-9)
    eta = (total - done) / rate if rate else 0
    gb = node.health()["fields"]["commitlog.written"] / GB
    print(f"fill {done:,}/{total:,} msgs  {rate:,.0f} msgs/s  CommitLog {gb:.2f} GB  ETA {eta / 60:.1f} min",
          file=sys.stderr, flush=True)


def write_figures(record: dict, target: int) -> dict:
    """Rate and p99 of the batched sends over the first and last 10 % of the fill (and every 10 %)."""
    size, buckets = record["bucket"], record["buckets"]

    def window(lo: float, hi: float) -> dict:
        picked = [bk for i, bk in enumerate(buckets) if lo <= i * size < hi]
        hist: dict = {}
        roll: dict = {}
        for bk in picked:
            hist_merge(hist, bk["hist"])
            hist_merge(roll, bk["roll"])
        seconds = sum(bk["seconds"] for bk in picked)
        return {"msgs": sum(bk["msgs"] for bk in picked),
                "msgs_s": round(sum(bk["msgs"] for bk in picked) / seconds) if seconds else None,
                "p50_ms": hist_quantile(hist, 0.5), "p99_ms": hist_quantile(hist, 0.99),
                "max_ms": max((bk["max_ms"] for bk in picked), default=None),
                "rollovers": sum(bk["rollovers"] for bk in picked), "rollover_p99_ms": hist_quantile(roll, 0.99)}
    first, last = window(0, 0.1 * target), window(0.9 * target, target)
    empty = window(0, 0.01 * target)
    tenths = [window(i * target / 10, (i + 1) * target / 10) for i in range(10)]
    worst = max([w["p99_ms"] or 0 for w in (last, *tenths)] + [w["rollover_p99_ms"] or 0 for w in tenths])
    out = {"first_10pct": first, "last_10pct": last, "empty_p99_ms": empty["p99_ms"], "worst_p99_ms": worst,
           "tenths": [{k: w[k] for k in ("msgs_s", "p99_ms", "rollovers", "rollover_p99_ms")} for w in tenths]}
    if first["msgs_s"] and last["msgs_s"]:
        out["rate_ratio"] = round(last["msgs_s"] / first["msgs_s"], 3)
    if empty["p99_ms"]:
        out["p99_ratio"] = round(worst / empty["p99_ms"], 2)
    return out


# ---- load generators of the scenarios (bench_broker.run_workers runs them) -----------------------------------

def _run_job(kind: str, args: dict, ready, go, out) -> None:
    out.put({**run_async(JOBS[kind](args, ready, go)), "kind": kind})


async def paced_producer(a: dict, ready, go) -> dict:
    """Batches of 32 to the 16 x 8 queues at a["rate"] msgs/s for a["seconds"]: achieved msgs/s and the
    latencies after the first a["warmup"] seconds."""
    client = RemotingClient()
    conn = await client.connection(a["addr"])
    items = [(BODY, encode_properties({"UNIQ_KEY": os.urandom(16).hex().upper()}).decode()) for _ in range(BATCH)]
    body = encode_batch_body([(b, 0, p.encode()) for b, p in items])
    exts = [batch_ext(t, q) for t in TOPICS for q in range(QUEUES)]
    stats = {"msgs": 0, "errors": 0, "late": 0}
    latencies: list[float] = []
    inflight = [0]

    def on_reply(r, err, t0: float) -> None:
        inflight[0] -= 1
        if err is None and r.code == ResponseCode.SUCCESS:
            stats["msgs"] += BATCH
            if t0 >= measured:
                latencies.append(time.perf_counter() - t0)
        else:
            stats["errors"] += 1

    await _wait(ready, go)
    start = time.perf_counter()
    measured = start + a["warmup"]
    i = 0
    while (now := time.perf_counter()) - start < a["seconds"]:
        due = start + i * BATCH / a["rate"]
        if due > now:
            await asyncio.sleep(due - now)
        elif inflight[0] >= 256:
            stats["late"] += 1
            await asyncio.sleep(0.001)
            continue
        inflight[0] += 1
        sent = time.perf_counter()
        conn.invoke_async(RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, ext_fields=exts[i % len(exts)], body=body),
                          30.0, lambda r, err, t0=sent: on_reply(r, err, t0))
        i += 1
    seconds = time.perf_counter() - start
    deadline = time.perf_counter() + 30
    while inflight[0] and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    await client.close()
    latencies.sort()
    return {**stats, "seconds": seconds, "latencies": latencies}


async def drain_queues(a: dict, ready, go) -> dict:
    """Pull a["queues"] ([topic, queue, from, upto]) as one consumer group, 32 a request, one request in
    flight per queue, for a["seconds"] at most: msgs (offsets passed), seconds. a["addrs"] are the
    brokers by brokerId (the master first): each queue's next pull goes where the last answer's
    suggestWhichBrokerId says, as the client does; msgs and requests per brokerId in "by_broker"."""
    client = RemotingClient()
    conns = [await client.connection(addr) for addr in a["addrs"]]
    stats = {"msgs": 0, "errors": 0, "requests": 0}
    by_broker = [{"msgs": 0, "requests": 0} for _ in conns]
    await _wait(ready, go)
    start = time.perf_counter()

    async def drain(topic: str, q: int, offset: int, upto: int) -> None:
        at = 0
        while offset < upto and time.perf_counter() - start < a["seconds"]:
            r = await conns[at].invoke(pull_command(topic, q, offset, max_nums=32, group="BacklogCatchup"), 30.0)
            stats["requests"] += 1
            if r.code not in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_NOT_FOUND):
                stats["errors"] += 1
                break
            nxt = int(r.ext_fields["nextBeginOffset"])
            stats["msgs"] += nxt - offset
            by_broker[at]["msgs"] += nxt - offset
            by_broker[at]["requests"] += 1
            offset = nxt
            suggested = int(r.ext_fields.get("suggestWhichBrokerId", 0))
            at = suggested if suggested < len(conns) else 0

    await asyncio.gather(*(drain(*q) for q in a["queues"]))
    stats["seconds"] = time.perf_counter() - start
    await client.close()
    return {**stats, "by_broker": by_broker}


JOBS = {"paced": paced_producer, "drain": drain_queues}


def producer_figures(results: list[dict]) -> dict:
    r = next(r for r in results if r["kind"] == "paced")
    lat = r["latencies"]
    return {"msgs_s": round(r["msgs"] / r["seconds"]), "p50_ms": round(percentile(lat, 50) * 1000, 2),
            "p99_ms": round(percentile(lat, 99) * 1000, 2), "max_ms": round(lat[-1] * 1000, 2) if lat else None,
            "errors": r["errors"]}


def paced(addr: str, seconds: float, warmup: float) -> tuple[str, dict]:
    """A producer job at CATCHUP_RATE (paced_producer)."""
    return "paced", {"addr": addr, "rate": CATCHUP_RATE, "seconds": seconds, "warmup": warmup}


def consumer_jobs(runner: Runner, seconds: float, slave: Runner | None = None) -> list[tuple[str, dict]]:
    """Two pull processes over the 16 x 8 queues, each from its oldest message to its end now (following
    the suggestions to the slave when there is one)."""
    spans = min_offsets(runner.addr, [(t, q) for t in TOPICS for q in range(QUEUES)])
    queues = [[t, q, lo, hi] for (t, q), (lo, hi) in spans.items()]
    addrs = [runner.addr] + ([slave.addr] if slave else [])
    return [("drain", {"addrs": addrs, "seconds": seconds, "queues": queues[i::2]}) for i in range(2)]


def consumer_figures(results: list[dict]) -> dict:
    results = [r for r in results if r["kind"] == "drain"]
    msgs = sum(r["msgs"] for r in results)
    by_broker = [{k: sum(r["by_broker"][i][k] for r in results) for k in ("msgs", "requests")}
                 for i in range(len(results[0]["by_broker"]))]
    return {"msgs_s": round(msgs / max(r["seconds"] for r in results)), "msgs": msgs,
            "requests": sum(r["requests"] for r in results), "errors": sum(r["errors"] for r in results),
            **({"at_slave": by_broker[1]} if len(by_broker) > 1 else {})}


# ---- scenarios ------------------------------------------------------------------------------------------------

def scenario_rss(runner: Runner, seconds: float) -> dict:
    """A producer at CATCHUP_RATE and a consumer from the oldest message for `seconds`, RSS sampled."""
    runner.phase = "rss"
    results, _ = run_workers([paced(runner.addr, seconds, 0.0), *consumer_jobs(runner, seconds)], runner.node,
                             target=_run_job)
    return {"load_consumer_msgs_s": consumer_figures(results)["msgs_s"],
            "load_producer_msgs_s": producer_figures(results)["msgs_s"]}


def scenario_restart(runner: Runner, cold: bool = False) -> dict:
    """Clean stop and start; cold: with the page cache dropped in between (as after a reboot)."""
    runner.phase = "coldrestart" if cold else "restart"
    stop_s = runner.stop()
    dropped = drop_page_cache() if cold else {}
    return {"stop_s": round(stop_s, 2), "served_s": round(runner.launch(), 2), **dropped}


def scenario_kill(runner: Runner) -> dict:
    runner.phase = "kill"
    sender = Sender(runner.addr)
    try:
        wait_until(lambda: len(sender.acks) > 50, timeout=60, message="sends before the kill")
        runner.kill()
        served = runner.launch()
    finally:
        sender.stop()
    return {"served_s": round(served, 2), "acks_before": len(sender.acks)}


def scenario_syncflush(runner: Runner, messages: int) -> dict:
    """Sync flush: `messages` acknowledged sends from 4 threads, kill -9 while they go on, restart
    (async flush again), then every acknowledged message must be in its queue."""
    runner.phase = "syncflush"
    runner.stop()
    runner.launch(flush="sync")
    starts = {q: hi for (_, q), (_, hi) in min_offsets(runner.addr, [(SYNC_TOPIC, q) for q in range(SYNC_QUEUES)])
              .items()}
    acked: list[set[bytes]] = [set() for _ in range(SYNC_QUEUES)]
    stop = threading.Event()
    tag = os.urandom(4).hex().encode()

    def produce(q: int) -> None:
        client = BlockingRemotingClient()
        i = 0
        try:
            while not stop.is_set():
                body = b"%s-%d-%d-" % (tag, q, i)
                body += b"s" * (128 - len(body))
                try:
                    if client.invoke(runner.addr, send_command(SYNC_TOPIC, body, queue_id=q), 5.0).code == 0:
                        acked[q].add(body)
                except Exception:
                    return
                i += 1
        finally:
            client.close()
    threads = [threading.Thread(target=produce, args=(q,), daemon=True) for q in range(SYNC_QUEUES)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    wait_until(lambda: sum(map(len, acked)) >= messages, timeout=300, message="sync-flush sends acknowledged")
    send_s = time.perf_counter() - t0
    runner.kill()
    stop.set()
    for t in threads:
        t.join(30)
    served = runner.launch()
    found = [set() for _ in range(SYNC_QUEUES)]
    client = BlockingRemotingClient()
    try:
        for q in range(SYNC_QUEUES):
            offset = starts[q]
            while True:
                r = client.invoke(runner.addr, pull_command(SYNC_TOPIC, q, offset, group="BacklogSyncCheck"), 30.0)
                if r.code != ResponseCode.SUCCESS:
                    break
                found[q].update(m.body for m in decode_records(r.body_bytes()))
                offset = int(r.ext_fields["nextBeginOffset"])
    finally:
        client.close()
    n_acked = sum(map(len, acked))
    return {"acked": n_acked, "lost": sum(len(a - f) for a, f in zip(acked, found)),
            "acked_msgs_s": round(n_acked / send_s), "served_s": round(served, 2)}


def empty_baseline(runner: Runner, seconds: float, warmup: float) -> dict:
    """The producer's figures at CATCHUP_RATE on a fresh node with the kept node's settings."""
    with tempfile.TemporaryDirectory(dir=runner.backlog.root, prefix="empty-") as tmp, \
            broker_node(Path(tmp), runner.backlog.record["settings"]) as (_, addr):
        run_workers([paced(addr, seconds / 2, 0.0)], target=_run_job)      # a new node's first files: not measured
        empty, _ = run_workers([paced(addr, seconds, warmup)], target=_run_job)
    return producer_figures(empty)


def catch_up(runner: Runner, seconds: float, warmup: float, base: dict, slave: Runner | None = None) -> dict:
    """Page cache dropped, the producer and the group from the oldest message (see the module doc)."""
    dropped = drop_page_cache()
    results, _ = run_workers([paced(runner.addr, seconds, warmup), *consumer_jobs(runner, seconds, slave)],
                             runner.node, target=_run_job)
    producer = producer_figures(results)
    return {**dropped, "consumer": consumer_figures(results), "producer": producer, "producer_empty_store": base,
            "p99_ratio": round(producer["p99_ms"] / base["p99_ms"], 2) if base["p99_ms"] else None}


def scenario_catchup(runner: Runner, seconds: float, baseline_s: float, warmup: float) -> dict:
    runner.phase = "catchup"
    return catch_up(runner, seconds, warmup, empty_baseline(runner, baseline_s, warmup))


def slave_read_ratio(commitlog_bytes: int) -> int:
    """access_message_in_memory_max_ratio for the master/slave variant: the default 40 on a store of more
    than twice that window; on a smaller one the percent of RAM that leaves half the CommitLog outside
    the window (0 on a tiny one: all of it), so there is cold data for the slave to serve."""
    return min(40, int(100 * commitlog_bytes / 2 / physical_memory()))


def scenario_catchup_slave(runner: Runner, seconds: float, baseline_s: float, warmup: float,
                           base: dict | None) -> dict:
    """The catch-up with slave_read_enable and a slave (see the module doc); base: the empty node's
    producer figures when catchup measured them in this run."""
    runner.phase = "slaveread"
    b = runner.backlog
    slave_store = Backlog(b.root / "slave")
    slave_store.load(b.record["settings"], 0)
    slave_store.set_usage(0.1)
    need = store_bytes(b.node_dir) - (store_bytes(slave_store.node_dir) if slave_store.node_dir.exists() else 0)
    if (share := disk_share(need)) > DISK_LIMIT:
        reason = (f"the slave's copy of the store (~{need / GB:.1f} GB more) would take the disk to {share:.0%} "
                  f"(limit {DISK_LIMIT:.0%}): run the variant on a smaller --store")
        print(f"slave read variant refused: {reason}", file=sys.stderr)
        return {"refused": reason}
    fields = runner.node.health()["fields"]
    settings = {"slave_read_enable": True,
                "access_message_in_memory_max_ratio": slave_read_ratio(fields["commitlog.written"] -
                                                                       fields["commitlog.min"])}
    base = base or empty_baseline(runner, baseline_s, warmup)
    runner.stop()
    runner.launch(**settings)
    slave = Runner(slave_store, role="slave", registry_port=runner.registry_port)
    slave.phase = "slaveread"
    try:
        t0 = time.perf_counter()
        slave.launch(**settings)
        copied = replicate(runner.node, slave.node)
        replicated_s = time.perf_counter() - t0
        out = catch_up(runner, seconds, warmup, base, slave)
        slave.stop()
    finally:
        slave.close()
    runner.stop()
    runner.launch()
    return {**out, **settings, "replicated_gb": round(copied / GB, 2), "replicated_s": round(replicated_s, 1),
            "slave_max_rss_mb": round(max(slave.rss.values(), default=0), 1)}


def replicate(master: Node, slave: Node) -> int:
    """Wait until the slave has replicated and dispatched the master's CommitLog (progress on stderr):
    the bytes it copied."""
    target = master.health()["fields"]["commitlog.written"]
    first = slave.health()["fields"]["commitlog.written"]
    t0 = last = time.perf_counter()

    def done() -> bool:
        nonlocal last
        f = slave.health()["fields"]
        if time.perf_counter() - last >= 2.0:
            last = time.perf_counter()
            rate = (f["commitlog.written"] - first) / (last - t0)
            print(f"slave replicating {f['commitlog.written'] / GB:.2f}/{target / GB:.2f} GB  {rate / (1 << 20):.0f} "
                  f"MB/s  dispatched {f['commitlog.dispatched'] / GB:.2f} GB", file=sys.stderr, flush=True)
        return f["commitlog.dispatched"] >= target
    wait_until(done, timeout=max(900.0, target / (20 << 20)), interval=0.2, message="the slave to replicate")
    return target - first


def scenario_query(runner: Runner, count: int) -> dict:
    """Queries by key and by time at markers spread over the store (page cache dropped first)."""
    runner.phase = "query"
    markers = runner.backlog.record["markers"]
    lows = min_offsets(runner.addr, [(m["topic"], m["queue"]) for m in markers])
    cl_min = runner.node.health()["fields"]["commitlog.min"]
    live = [m for m in markers if m["phys"] >= cl_min]              # cleanup deletes the oldest
    picked = [live[round(i * (len(live) - 1) / max(count - 1, 1))] for i in range(min(count, len(live)))]
    dropped = drop_page_cache()
    by_key, by_time, found, sane = [], [], 0, 0
    client = BlockingRemotingClient()
    try:
        for m in picked:
            t0 = time.perf_counter()
            r = client.invoke(runner.addr, RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields={
                "topic": m["topic"], "key": m["key"], "maxNum": "32", "beginTimestamp": "0",
                "endTimestamp": str(1 << 62), "_UNIQUE_KEY_QUERY": "true"}), 30.0)
            by_key.append(time.perf_counter() - t0)
            found += r.code == ResponseCode.SUCCESS and any(
                x.properties.get("UNIQ_KEY") == m["key"] for x in decode_records(r.body_bytes()))
            t0 = time.perf_counter()
            r = client.invoke(runner.addr, offset_command(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, m["topic"],
                                                          m["queue"], timestamp=m["time_ms"]), 30.0)
            by_time.append(time.perf_counter() - t0)
            lo, hi = lows[(m["topic"], m["queue"])]
            sane += r.code == ResponseCode.SUCCESS and lo <= int(r.ext_fields["offset"]) <= hi
    finally:
        client.close()
    by_key.sort()
    by_time.sort()

    def figures(lat: list[float]) -> dict:
        return {"p50_ms": round(percentile(lat, 50) * 1000, 2), "p99_ms": round(percentile(lat, 99) * 1000, 2),
                "max_ms": round(lat[-1] * 1000, 2) if lat else None}
    return {**dropped, "queries": len(picked), "by_key": {**figures(by_key), "found": found},
            "by_time": {**figures(by_time), "in_range": sane}}


def scenario_cleanup(runner: Runner) -> dict:
    """The watermarks through the disk-usage file (see the module doc), a producer sending throughout."""
    runner.phase = "cleanup"
    b = runner.backlog
    sender = Sender(runner.addr)
    out: dict = {}

    def minimum() -> int:
        return runner.node.health()["fields"]["commitlog.min"]
    try:
        wait_until(lambda: len(sender.acks) > 50, timeout=60, message="sends before cleanup")
        for name, ratio in (("at_75pct", 0.76), ("at_85pct", 0.86)):
            before, t0 = minimum(), time.perf_counter()
            b.set_usage(ratio)
            wait_until(lambda then=before: minimum() != then, timeout=120, interval=0.01, message=f"a deletion {name}")
            b.set_usage(0.1)
            time.sleep(0.3)
            end = time.perf_counter()
            out[name] = {"deleted_after_s": round(end - 0.3 - t0, 2), "max_send_gap_ms": round(
                sender.gap(t0, end) * 1000, 1), "deleted_mb": (minimum() - before) >> 20}
        failed, t0 = sender.failed, time.perf_counter()
        b.set_usage(0.91)
        wait_until(lambda: sender.failed > failed, timeout=120, interval=0.01, message="sends refused at 90 %")
        refused = time.perf_counter() - t0
        b.set_usage(0.80)
        t1 = time.perf_counter()
        wait_until(lambda: sender.acks and sender.acks[-1] > t1, timeout=120, interval=0.01,
                   message="the refusal to lift at 80 %")
        out["at_90pct"] = {"refused_after_s": round(refused, 2),
                           "accepted_again_s": round(sender.acks[-1] - t1, 2), "refused_sends": sender.failed - failed}
    finally:
        b.set_usage(0.1)
        sender.stop()
    out["max_send_gap_ms"] = max(out[k]["max_send_gap_ms"] for k in ("at_75pct", "at_85pct"))
    return out


# ---- main -----------------------------------------------------------------------------------------------------

def default_store(quick: bool) -> Path:
    return Path(tempfile.gettempdir()) / ("smartgo-bench-backlog-quick" if quick else "smartgo-bench-backlog")


def producer_passes(catchup: dict) -> bool:
    return (catchup["producer"]["msgs_s"] >= 0.98 * TARGETS["catchup_producer_msgs_s"]
            and catchup["p99_ratio"] <= TARGETS["catchup_p99_ratio"])


def passes(r: dict) -> dict:
    t = TARGETS
    checks = {
        "write_rate": lambda: r["write"]["rate_ratio"] >= t["write_rate_ratio"],
        "write_p99": lambda: r["write"]["p99_ratio"] <= t["write_p99_ratio"],
        "rss": lambda: r["rss"]["max_mb"] <= t["rss_mb"],
        "restart": lambda: r["restart"]["served_s"] <= t["restart_s"],
        "kill": lambda: r["kill"]["served_s"] <= t["kill_s"],
        "syncflush": lambda: r["syncflush"]["lost"] == t["sync_lost"] and r["syncflush"]["served_s"] <= t["kill_s"],
        "catchup_consumer": lambda: r["catchup"]["consumer"]["msgs_s"] >= t["catchup_msgs_s"],
        "catchup_producer": lambda: producer_passes(r["catchup"]),
        "catchup_slave_consumer": lambda: (r["catchup_slave"]["consumer"]["msgs_s"] >= t["catchup_msgs_s"]
                                           and r["catchup_slave"]["consumer"]["at_slave"]["msgs"] > 0),
        "catchup_slave_producer": lambda: producer_passes(r["catchup_slave"]),
        "query": lambda: max(r["query"]["by_key"]["max_ms"], r["query"]["by_time"]["max_ms"]) <= t["query_ms"]
        and r["query"]["by_key"]["found"] == r["query"]["queries"],
        "cleanup": lambda: r["cleanup"]["max_send_gap_ms"] <= t["cleanup_stall_ms"],
    }
    out = {}
    for name, check in checks.items():
        try:
            out[name] = bool(check())
        except (KeyError, TypeError):       # the scenario did not run (--only) or had no figure
            pass
    return out


#: The summary's lines: a label and where its figure is in the results (the pass map's key first).
SUMMARY = (("write_rate", "last/first 10 % msgs/s", ("write", "rate_ratio")),
           ("write_p99", "worst p99 / first 1 %'s", ("write", "p99_ratio")),
           ("rss", "max total RSS, MB", ("rss", "max_mb")),
           ("restart", "restart: served after, s", ("restart", "served_s")),
           ("", "cold restart: served after, s", ("coldrestart", "served_s")),
           ("kill", "kill -9: served after, s", ("kill", "served_s")),
           ("syncflush", "sync flush: acked lost", ("syncflush", "lost")),
           ("catchup_consumer", "cold catch-up msgs/s", ("catchup", "consumer", "msgs_s")),
           ("catchup_producer", "producer p99 / empty's", ("catchup", "p99_ratio")),
           ("catchup_slave_consumer", "slave read: catch-up msgs/s", ("catchup_slave", "consumer", "msgs_s")),
           ("catchup_slave_producer", "slave read: p99 / empty's", ("catchup_slave", "p99_ratio")),
           ("query", "query by key max ms", ("query", "by_key", "max_ms")),
           ("query", "query by time max ms", ("query", "by_time", "max_ms")),
           ("cleanup", "longest send gap, ms", ("cleanup", "max_send_gap_ms")))


def summary(results: dict) -> str:
    lines = [f"{results['messages']:,} messages, store {results.get('store_gb', 0):.1f} GB"]
    for key, label, path in SUMMARY:
        value = results
        for step in path:
            value = value.get(step) if isinstance(value, dict) else None
        if value is not None:
            verdict = {True: "pass", False: "FAIL"}.get(results["pass"].get(key), "")
            lines.append(f"  {label:28} {value:>12,.2f}  {verdict}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=0, help="messages the store holds (default 100,000,000; "
                                                            "--quick 200,000)")
    ap.add_argument("--store", type=Path, help="the kept store's directory (default: see above)")
    ap.add_argument("--clean", action="store_true", help="remove the store at the end instead of keeping it")
    ap.add_argument("--only", default="", help=f"comma-separated scenarios ({','.join(SCENARIOS)})")
    ap.add_argument("--wide-queues", type=int, default=10_000, help="queues of the wide topic (for a new store)")
    ap.add_argument("--quick", action="store_true", help="a small fill (200,000 messages), every scenario short")
    ap.add_argument("--slave-read-enable", action="store_true", help="catchup also in the master/slave variant "
                                                                       "(see above)")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    args = ap.parse_args()
    scenarios = tuple(args.only.split(",")) if args.only else SCENARIOS
    if unknown := set(scenarios) - set(SCENARIOS):
        ap.error(f"unknown scenarios {sorted(unknown)}")
    target = args.messages or (200_000 if args.quick else 100_000_000)
    store = args.store or default_store(args.quick)
    backlog = Backlog(store)
    reused = backlog.load(node_settings(args.quick, (args.wide_queues, 0)), max(BATCH, -(-target // 100)),
                          wide_queues=args.wide_queues, wide_per_topic=0)
    wide = backlog.record["wide_queues"], backlog.record.get("wide_per_topic", OLD_WIDE_PER_TOPIC)
    if not reused:
        backlog.set_usage(0.1)
    print(f"store {store} ({'reused' if reused else 'new'}), target {target:,} messages", file=sys.stderr)
    runner = Runner(backlog)
    results: dict = {"store": str(store), "reused_store": reused, "messages": target, "quick": args.quick,
                     "wide": {"queues": wide[0], "topics": len({t for t, _ in wide_lanes(wide)})},
                     "machine": {"cpus": os.cpu_count(), "mem_gb": round(psutil.virtual_memory().total / GB, 1)}}
    try:
        results["first_start_s"] = round(runner.launch(), 2)
        results["fill"] = fill(runner, target, wide)
        results["store_gb"] = round(store_bytes(backlog.node_dir) / GB, 2)
        results["commitlog_files"] = len(segment_starts(backlog.node_dir / "commitlog"))
        quick = args.quick
        for name in scenarios:
            print(f"scenario {name}", file=sys.stderr, flush=True)
            if name == "write":
                results["write"] = write_figures(backlog.record, target)
            elif name == "rss":
                results["rss"] = scenario_rss(runner, 3 if quick else 10)
            elif name in ("restart", "coldrestart"):
                results[name] = scenario_restart(runner, cold=name == "coldrestart")
            elif name == "kill":
                results["kill"] = scenario_kill(runner)
            elif name == "syncflush":
                results["syncflush"] = scenario_syncflush(runner, 500 if quick else SYNC_MESSAGES)
            elif name == "catchup":
                results["catchup"] = scenario_catchup(runner, 4 if quick else 30, 3 if quick else 10, 1.0)
                if args.slave_read_enable:
                    print("scenario catchup, master/slave (--slave-read-enable)", file=sys.stderr, flush=True)
                    results["catchup_slave"] = scenario_catchup_slave(runner, 4 if quick else 30, 3 if quick else 10,
                                                                      1.0, results["catchup"]["producer_empty_store"])
            elif name == "query":
                results["query"] = scenario_query(runner, 10 if quick else 20)
            elif name == "cleanup":
                results["cleanup"] = scenario_cleanup(runner)
            (store / "last_run.json").write_text(json.dumps(results))       # what an interrupted run got
        runner.phase = "stop"
        results["stop_s"] = round(runner.stop(), 2)
    finally:
        runner.close()
        if args.clean:
            shutil.rmtree(store, ignore_errors=True)
    results["rss"] = {**results.get("rss", {}), "max_mb": round(max(runner.rss.values(), default=0), 1),
                      "by_phase_mb": {k: round(v, 1) for k, v in runner.rss.items()}, "per_actor_mb": runner.per_actor}
    results["kept_store"] = None if args.clean else str(store)
    results["unclean_stops"] = runner.unclean_stops
    results["pass"] = passes(results)
    print(summary(results), file=sys.stderr)
    print(f"store kept in {store} (--clean removes it)" if not args.clean else f"store {store} removed",
          file=sys.stderr)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
