"""Store engine benchmark: encode, append, dispatch, read, recovery, RSS while growing.

    .venv/bin/python benchmarks/bench_store.py [--quick] [--json] [--dir /tmp] [--repeat 3]

One process. Every figure is the median of --repeat runs (RSS: one run of --rss-gb).
Records carry TAGS and UNIQ_KEY like a Java producer's (dispatch_keys also has KEYS).
host_probe_ms: the CPU time of a fixed Python loop before each run, median: higher is a slower host
(host_probe.py; this VM's CPU speed varies up to 2x second to second).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from host_probe import HostProbe  # noqa: E402
from smartgo.store import (  # noqa: E402
    Block, Checkpoint, CommitLogReader, CommitLogWriter, ConsumeQueueSet, Dispatcher, IndexService, StoreConfig,
    StoreReader, recover,
)
from smartgo.store.damage import SCRUB_STEP, ScrubCursor, scrub  # noqa: E402
from smartgo.store.lazy_numpy import load as load_numpy  # noqa: E402
from smartgo.store.record import encode_properties, encode_record, pack_host  # noqa: E402
from smartgo.store.store_files import mark_clean_shutdown, mark_running  # noqa: E402

TOPIC = "BenchTopic"
QUEUES = 8
HOST = pack_host("10.0.0.1", 40000)
STORE_HOST = pack_host("10.0.0.2", 10911)
TARGETS = {"append_batch32_128B_msgs_per_s": 400_000, "read_msgs_per_s": 500_000, "dispatch_msgs_per_s": 300_000,
           "recovery_normal_s": 3.0, "recovery_abnormal_s": 6.0}


def records(n: int, body_len: int, keys: bool = False, start: int = 0, queues: int = QUEUES) -> list[list[bytes]]:
    """n encoded records, grouped per queue in runs of 32 (so batches of 32 share a queue)."""
    body = b"b" * body_len
    out = []
    for i in range(start, start + n):
        props = {"TAGS": "TagA", "UNIQ_KEY": f"0A0000019C40{os.getpid() & 0xFFFF:04X}{i:016X}", "WAIT": "true"}
        if keys:
            props["KEYS"] = f"order-{i}"
        out.append(encode_record(TOPIC, (i // 32) % queues, body, encode_properties(props), born_timestamp=1,
                                 born_host=HOST, store_host=STORE_HOST))
    return out


def queue_of(i: int, queues: int = QUEUES) -> tuple[str, int]:
    return (TOPIC, (i // 32) % queues)


def config_for(path: Path, quick: bool) -> StoreConfig:
    if quick:
        return StoreConfig(store_path=str(path), commitlog_file_size=64 << 20, index_slot_count=100_000,
                           index_entry_count=400_000)
    return StoreConfig(store_path=str(path))


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_encode(n: int, body_len: int) -> float:
    props = encode_properties({"TAGS": "TagA", "UNIQ_KEY": "0A0000019C4000000000000000000001", "WAIT": "true"})
    body = b"b" * body_len

    def run():
        for i in range(n):
            encode_record(TOPIC, i & 7, body, props, born_timestamp=1, born_host=HOST, store_host=STORE_HOST)
    return timed(run) / n * 1e6


def bench_append(base: Path, quick: bool, recs: list[bytes], mode: str) -> float:
    """Seconds to append recs: 'single' (one call per record), 'batch32' (SEND_BATCH blocks
    of 32) or 'blocks32' (32 one-record blocks per call, a commit actor's drained ring)."""
    cfg = config_for(base / f"append-{mode}", quick)
    w = CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, 0, {}, release_interval=cfg.release_interval_bytes)
    n = len(recs)
    if mode == "single":
        calls = [[Block(r, queue_of(i), 1)] for i, r in enumerate(recs)]
    elif mode == "batch32":
        calls = [[Block(b"".join(recs[i:i + 32]), queue_of(i), len(recs[i:i + 32]))] for i in range(0, n, 32)]
    else:
        calls = [[Block(r, queue_of(i + j), 1) for j, r in enumerate(recs[i:i + 32])] for i in range(0, n, 32)]
    append = w.append

    def run():
        for c in calls:
            append(c)
    dt = timed(run)
    w.close()
    shutil.rmtree(cfg.store_path)
    return dt


def build_log(cfg: StoreConfig, n: int, body_len: int, keys: bool, queues: int = QUEUES) -> int:
    w = CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, 0, {}, release_interval=cfg.release_interval_bytes)
    for start in range(0, n, 32_768):
        recs = records(min(32_768, n - start), body_len, keys, start, queues)
        w.append([Block(b"".join(recs[i:i + 32]), queue_of(start + i, queues), len(recs[i:i + 32]))
                  for i in range(0, len(recs), 32)])
    written = w.wrote_position
    w.close()
    return written


def dispatch_all(cfg: StoreConfig, written: int, round_records: int = 1024) -> int:
    queues = ConsumeQueueSet(cfg.consume_queue_dir, cfg.consume_queue_file_size)
    index = IndexService(cfg.index_dir, cfg.index_slot_count, cfg.index_entry_count,
                         release_interval=cfg.release_interval_bytes)
    d = Dispatcher(CommitLogReader(cfg.commitlog_dir, cfg.commitlog_file_size), queues, index, (),
                   cfg.release_interval_bytes)
    pos = count = 0
    while pos < written:
        rnd = d.dispatch(pos, written, round_records)
        pos, count = rnd.position, count + rnd.records
    index.close()
    queues.close()
    d.commitlog.close()
    return count


def bench_dispatch_and_read(base: Path, quick: bool, n: int, keys: bool) -> tuple[float, float, float]:
    """(dispatch wall s, read wall s, dispatch CPU s): on a shared machine the CPU time shows
    what the code costs when other processes take the cores."""
    cfg = config_for(base / f"dispatch-{keys}", quick)
    written = build_log(cfg, n, 128, keys)
    cpu = time.process_time()
    dt_dispatch = timed(lambda: dispatch_all(cfg, written))
    cpu = time.process_time() - cpu
    reader = StoreReader(cfg)
    per_queue = {q: sum(1 for i in range(n) if (i // 32) % QUEUES == q) for q in range(QUEUES)}
    got = 0

    def read():
        nonlocal got
        for q, max_offset in per_queue.items():
            offset = 0
            while offset < max_offset:
                r = reader.get_messages(TOPIC, q, offset, 32, max_offset, written)
                got += len(r.buffers)
                offset = r.next_begin_offset
    dt_read = timed(read)
    assert got == n, (got, n)
    reader.close()
    shutil.rmtree(cfg.store_path)
    return dt_dispatch, dt_read, cpu


def bench_dispatch_wide(base: Path, quick: bool, queues: int, per_queue: int) -> float:
    """Seconds to dispatch per_queue messages (runs of 32) into each of `queues` new queues:
    every queue's ConsumeQueue file is created, then written a few pages at a time in turn
    (a 1,024-queue topic's traffic; its first messages once stalled dispatch for seconds)."""
    cfg = config_for(base / "dispatch-wide", quick)
    n = per_queue * queues
    written = build_log(cfg, n, 128, False, queues)
    dt = timed(lambda: dispatch_all(cfg, written))
    shutil.rmtree(cfg.store_path)
    return dt


def bench_recovery(base: Path, quick: bool, n: int, repeat: int, probe: HostProbe) -> dict[str, list[float]]:
    cfg = config_for(base / "recovery", quick)
    written = build_log(cfg, n, 128, False)
    dispatch_all(cfg, written, 65536)
    cp = Checkpoint(cfg.checkpoint_path)
    cp.physic_timestamp = cp.logics_timestamp = int(time.time() * 1000)
    cp.physic_offset = written
    cp.flush()
    cp.close()
    out: dict[str, list[float]] = {"normal": [], "abnormal": [], "rebuild": [], "scrub": [], "background": []}
    for _ in probe.before_each(repeat):
        mark_clean_shutdown(cfg.store_path)
        state = recover(cfg)
        assert state.written == written and sum(state.queue_offsets.values()) == n and not state.abnormal
        out["normal"].append(state.seconds)
        for kind in ("abnormal", "rebuild"):
            # worst case for the checkpoint: it predates every record, so all n are walked and
            # dispatched again ('rebuild' also lost every ConsumeQueue and index file)
            cp = Checkpoint(cfg.checkpoint_path)
            cp.physic_timestamp = cp.logics_timestamp = 0
            cp.close()
            if kind == "rebuild":
                shutil.rmtree(cfg.consume_queue_dir)
                shutil.rmtree(cfg.index_dir)
            mark_running(cfg.store_path)
            state = recover(cfg)
            assert state.abnormal and state.redispatched == n and sum(state.queue_offsets.values()) == n
            out[kind].append(state.seconds)
        began = time.perf_counter()                  # `smartgo scrub`: every record, every file
        report = scrub(cfg)
        out["scrub"].append(time.perf_counter() - began)
        assert report.records == n and not report.damaged
        cursor = ScrubCursor(cfg.root, CommitLogReader(cfg.commitlog_dir, cfg.commitlog_file_size))
        cursor.start_pass(0)
        began = time.process_time()                  # the cleanup actor's background scrub, unpaced (CPU)
        while cursor.step(0, written, SCRUB_STEP):
            pass
        out["background"].append(written / (time.process_time() - began) / 2 ** 20)    # MiB/s of CPU
        assert cursor.records == n and not cursor.damaged
    shutil.rmtree(cfg.store_path)
    return out


def bench_rss(base: Path, quick: bool, gigabytes: float) -> dict[str, float]:
    """Append (and dispatch) gigabytes of 4 KiB messages, sampling RSS as the store grows."""
    cfg = config_for(base / "rss", quick)
    proc = psutil.Process()
    recs = records(32 * 64, 4096)
    blocks = [Block(b"".join(recs[i:i + 32]), queue_of(i), 32) for i in range(0, len(recs), 32)]
    w = CommitLogWriter(cfg.commitlog_dir, cfg.commitlog_file_size, 0, {}, release_interval=cfg.release_interval_bytes)
    queues = ConsumeQueueSet(cfg.consume_queue_dir, cfg.consume_queue_file_size)
    index = IndexService(cfg.index_dir, cfg.index_slot_count, cfg.index_entry_count,
                         release_interval=cfg.release_interval_bytes)
    d = Dispatcher(CommitLogReader(cfg.commitlog_dir, cfg.commitlog_file_size), queues, index, (),
                   cfg.release_interval_bytes)
    target = int(gigabytes * (1 << 30))
    start_rss = proc.memory_info().rss
    samples = [start_rss]
    dispatched = 0
    next_sample = 0
    t = time.perf_counter()
    while w.wrote_position < target:
        w.append(blocks)  # the same pre-encoded bytes again: the store keeps no reference to them
        dispatched = d.dispatch(dispatched, w.wrote_position).position
        if w.wrote_position >= next_sample:
            samples.append(proc.memory_info().rss)
            next_sample += 128 << 20
    dt = time.perf_counter() - t
    samples.append(proc.memory_info().rss)
    written = w.wrote_position
    for x in (w, index, queues, d.commitlog):
        x.close()
    shutil.rmtree(cfg.store_path)
    mb = 1 << 20
    return {"rss_start_mb": start_rss / mb, "rss_peak_mb": max(samples) / mb, "rss_end_mb": samples[-1] / mb,
            "rss_grown_gb": written / (1 << 30), "rss_append_dispatch_mb_per_s": written / mb / dt}


def main() -> int:
    load_numpy()        # steady-state figures: a node's dispatch actor imports numpy at its start
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print all figures as one JSON object on the last line")
    ap.add_argument("--quick", action="store_true", help="a few-second smoke run")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary stores go")
    ap.add_argument("--repeat", type=int, default=None, help="runs per figure (median); default 3, quick 1")
    ap.add_argument("--messages", type=int, default=None, help="messages per append/dispatch/read run")
    ap.add_argument("--recovery-messages", type=int, default=None)
    ap.add_argument("--rss-gb", type=float, default=None)
    args = ap.parse_args()
    quick = args.quick
    repeat = args.repeat or (1 if quick else 3)
    n = args.messages or (3_000 if quick else 320_000)
    n_rec = args.recovery_messages or (10_000 if quick else 1_000_000)
    rss_gb = args.rss_gb if args.rss_gb is not None else (0.05 if quick else 5.0)
    base = Path(tempfile.mkdtemp(prefix="smartgo-bench-store-", dir=args.dir))
    probe = HostProbe()
    res: dict[str, float | bool | str | int] = {"quick": quick, "repeat": repeat, "messages": n,
                                                "recovery_messages": n_rec, "cpus": os.cpu_count() or 0}
    try:
        for body_len, tag in ((128, "128B"), (4096, "4KiB")):
            res[f"encode_us_per_record_{tag}"] = statistics.median(
                bench_encode(n, body_len) for _ in probe.before_each(repeat))
            count = n if body_len == 128 else max(n // 8, 32)
            recs = records(count, body_len)
            size = sum(map(len, recs))
            for mode in ("single", "batch32", "blocks32"):
                dt = statistics.median(bench_append(base, quick, recs, mode) for _ in probe.before_each(repeat))
                res[f"append_{mode}_{tag}_msgs_per_s"] = count / dt
                res[f"append_{mode}_{tag}_mb_per_s"] = size / dt / (1 << 20)
        for keys in (False, True):
            runs = [bench_dispatch_and_read(base, quick, n, keys) for _ in probe.before_each(repeat)]
            suffix = "_keys" if keys else ""
            res[f"dispatch{suffix}_msgs_per_s"] = n / statistics.median(r[0] for r in runs)
            res[f"dispatch{suffix}_cpu_msgs_per_s"] = n / statistics.median(r[2] for r in runs)
            if not keys:
                res["read_msgs_per_s"] = n / statistics.median(r[1] for r in runs)
        wide, per_queue = (64, 64) if quick else (1024, 512)
        res["dispatch_wide_queues"] = wide
        res["dispatch_wide_msgs_per_queue"] = per_queue
        res["dispatch_wide_msgs_per_s"] = per_queue * wide / statistics.median(
            bench_dispatch_wide(base, quick, wide, per_queue) for _ in probe.before_each(repeat))
        rec = bench_recovery(base, quick, n_rec, repeat, probe)
        res["recovery_normal_s"] = statistics.median(rec["normal"])
        res["recovery_abnormal_s"] = statistics.median(rec["abnormal"])
        res["recovery_rebuild_s"] = statistics.median(rec["rebuild"])
        res["scrub_records_per_s"] = n_rec / statistics.median(rec["scrub"])
        res["background_scrub_cpu_mb_per_s"] = statistics.median(rec["background"])
        probe.sample()
        res.update(bench_rss(base, quick, rss_gb))
        res["host_probe_ms"] = probe.ms
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for key, target in TARGETS.items():
        ok = res[key] <= target if key.startswith("recovery_") else res[key] >= target
        res[f"{key}_target"] = target
        res[f"{key}_pass"] = bool(ok)
    res["rss_flat_pass"] = bool(res["rss_peak_mb"] - res["rss_start_mb"] < 256)
    if not args.json or not quick:
        width = max(map(len, res))
        for key, value in res.items():
            shown = f"{value:,.2f}" if isinstance(value, float) else value
            print(f"{key:<{width}}  {shown}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(res, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
