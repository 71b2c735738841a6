"""Client SDK benchmark: client-side CPU per message (time.process_time of the client process, in
µs) for sync sends, async sends, batched sends (32 a request) and push consumption (a listener
call a message, and a batch listener getting 32), plus the blocking facade's sync send, and sync
sends and consumption with message trace on (the trace records' batching and sending included),
and lite pull consumption (poll, 32 a pull), asyncio and blocking.

By default the broker is a stub in its own process (this script with --serve-stub: it answers
sends like a broker and serves pulls from one pre-built 32-record body, registered with a real
registry process), so the figure is the client's own cost. --registry ADDR measures against a
real cluster instead (topic BenchmarkTest must accept sends). host_probe_ms: the CPU time of a fixed
Python loop before each run, median: higher is a slower host (host_probe.py; this VM's CPU speed
varies up to 2x second to second).

    .venv/bin/python benchmarks/bench_client.py [--runs 3] [--json] [--quick] [--registry HOST:PORT]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from host_probe import HostProbe  # noqa: E402
from smartgo.client import (AsyncLitePullConsumer, AsyncProducer, AsyncPushConsumer, ConsumeResult,  # noqa: E402
                            LitePullConsumer, Message, Producer)
from smartgo.net.client import RemotingClient  # noqa: E402
from smartgo.net.codes import RequestCode, ResponseCode  # noqa: E402
from smartgo.net.command import RemotingCommand  # noqa: E402
from smartgo.net.connection import eager  # noqa: E402
from smartgo.net.loop import run  # noqa: E402
from smartgo.net.server import RemotingServer  # noqa: E402
from smartgo.store.record import encode_properties, encode_record, pack_host  # noqa: E402
from tests.support.waits import free_ports, wait_for_port  # noqa: E402

TOPIC = "BenchmarkTest"
GROUP = "bench_client_consumer"


# -- the stub broker (a separate process) ----------------------------------------------------------

async def serve_stub(port: int, registry: str, backlog: int) -> None:
    host = pack_host("127.0.0.1", port)
    body = b"".join(encode_record(TOPIC, 0, b"x" * 128, encode_properties({"TAGS": "TagA", "UNIQ_KEY": "0" * 32}),
                                  queue_offset=i, physical_offset=i * 300, born_host=host, store_host=host,
                                  born_timestamp=int(time.time() * 1000)) for i in range(32))
    offsets = [0]

    def ok(cmd: RemotingCommand, ext: dict | None = None, payload: bytes | None = None) -> RemotingCommand:
        return cmd.make_response(ResponseCode.SUCCESS, None, ext if ext is not None else {}, payload)

    @eager
    async def send(conn, cmd):
        offsets[0] += 1
        return ok(cmd, {"msgId": "7F00000100002A9F0000000000001234", "queueId": cmd.ext_fields.get("e", "0"),
                        "queueOffset": str(offsets[0]), "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"})

    @eager
    async def pull(conn, cmd):
        start = int(cmd.ext_fields["queueOffset"])
        if cmd.ext_fields["topic"] != TOPIC or start >= backlog:
            await asyncio.sleep(0.2)
            return cmd.make_response(ResponseCode.PULL_NOT_FOUND, None, {
                "suggestWhichBrokerId": "0", "nextBeginOffset": str(start), "minOffset": "0", "maxOffset": str(backlog)})
        return cmd.make_response(ResponseCode.SUCCESS, None, {"suggestWhichBrokerId": "0", "nextBeginOffset":
                                 str(start + 32), "minOffset": "0", "maxOffset": str(backlog)}, body)
    consumers: list[str] = []

    @eager
    async def heartbeat(conn, cmd):
        cid = json.loads(cmd.body)["clientID"]
        if json.loads(cmd.body)["consumerDataSet"] and cid not in consumers:
            consumers.append(cid)
        return ok(cmd)

    handlers = {
        RequestCode.SEND_MESSAGE_V2: send, RequestCode.SEND_BATCH_MESSAGE: send, RequestCode.PULL_MESSAGE: pull,
        RequestCode.HEART_BEAT: heartbeat,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: eager(lambda c, cmd: _done(ok(cmd, payload=json.dumps(
            {"consumerIdList": consumers}).encode()))),
        RequestCode.QUERY_CONSUMER_OFFSET: eager(lambda c, cmd: _done(ok(cmd, {"offset": "0"}))),
        RequestCode.UNREGISTER_CLIENT: eager(lambda c, cmd: _done(
            consumers.remove(cmd.ext_fields["clientID"]) if cmd.ext_fields["clientID"] in consumers else None,
            ok(cmd))),
    }
    server = RemotingServer("127.0.0.1", [port], handlers, eager(lambda c, cmd: _done(ok(cmd))))
    await server.start()
    table = {t: {"order": False, "perm": 7 if t == "TBW102" else 6, "readQueueNums": 1, "topicFilterType": "SINGLE_TAG",
                 "topicName": t, "topicSysFlag": 0, "writeQueueNums": 1} for t in (TOPIC, "TBW102")}
    reg = json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1, "timestamp": 1}, "topicConfigTable": table}}).encode()
    async with RemotingClient() as client:
        resp = await client.invoke(registry, RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields={
            "brokerName": "stub", "brokerAddr": f"127.0.0.1:{port}", "clusterName": "Bench", "haServerAddr": "",
            "brokerId": "0", "compressed": "false", "bodyCrc32": str(zlib.crc32(reg) & 0x7FFFFFFF)}, body=reg))
        assert resp.code == 0, resp.remark
        print("stub ready", flush=True)
        await asyncio.Event().wait()


async def _done(*values):
    return values[-1]


# -- measurements (the client process) -------------------------------------------------------------

def _cpu(fn) -> tuple[float, float]:
    """(cpu seconds, wall seconds) of fn()."""
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


async def _sync(producer: AsyncProducer, n: int) -> None:
    msg = Message(TOPIC, b"x" * 128, tags="TagA")
    for _ in range(n):
        await producer.send(msg)


async def _async(producer: AsyncProducer, n: int, window: int = 512) -> None:
    msg = Message(TOPIC, b"x" * 128, tags="TagA")
    pending: set = set()
    for _ in range(n):
        if len(pending) >= window:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        pending.add(producer.send_async(msg))
    await asyncio.gather(*pending)


async def _batch(producer: AsyncProducer, n: int) -> None:
    msgs = [Message(TOPIC, b"x" * 128, tags="TagA") for _ in range(32)]
    for _ in range(n // 32):
        await producer.send_batch(msgs)


#: Message trace on (trace records go to the benchmark topic, which the stub accepts).
TRACED = {"enable_msg_trace": True, "trace_topic": TOPIC}


def measure_sends(registry: str, n: int) -> dict[str, float]:
    out = {}
    for name, fn, count, options in (("sync", _sync, n, {}), ("async", _async, n * 4, {}),
                                     ("batch", _batch, n * 16, {}), ("sync_traced", _sync, n, TRACED)):
        async def main(fn=fn, count=count, options=options):
            async with AsyncProducer("bench_client_producer", registry, **options) as p:
                await fn(p, 200)  # warm up: route, connection, caches
                c0, w0 = time.process_time(), time.perf_counter()
                await fn(p, count)
                return time.process_time() - c0, time.perf_counter() - w0
        cpu, wall = run(main())
        out[f"{name}_cpu_us_per_msg"] = cpu / count * 1e6
        out[f"{name}_msgs_per_s"] = count / wall
    with Producer("bench_client_producer", registry) as p:
        msg = Message(TOPIC, b"x" * 128)
        for _ in range(100):
            p.send(msg)
        cpu, wall = _cpu(lambda: [p.send(msg) for _ in range(n)])
    out["blocking_sync_cpu_us_per_msg"] = cpu / n * 1e6
    out["blocking_sync_msgs_per_s"] = n / wall
    return out


def measure_consume(registry: str, n: int, name: str = "consume", **options: object) -> dict[str, float]:
    """Push consumption of n messages with 4 listener threads; with consume_batch_max_size in
    options the listener gets batches."""
    async def main():
        counter = itertools.count(1)  # next() is atomic under the GIL; += from 4 threads is not
        lock, total = threading.Lock(), [0]
        done = asyncio.Event()
        loop = asyncio.get_running_loop()

        def listener(msg):
            if next(counter) == n:
                loop.call_soon_threadsafe(done.set)
            return ConsumeResult.SUCCESS

        def batch_listener(msgs):
            with lock:
                total[0] += len(msgs)
                if total[0] == n:
                    loop.call_soon_threadsafe(done.set)
            return ConsumeResult.SUCCESS
        batched = "consume_batch_max_size" in options
        c = AsyncPushConsumer(GROUP, registry, listener=batch_listener if batched else listener, consume_threads=4,
                              **options)
        c.subscribe(TOPIC)
        c0, w0 = time.process_time(), time.perf_counter()
        async with c:
            await asyncio.wait_for(done.wait(), 120)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        return cpu, wall
    cpu, wall = run(main())
    return {f"{name}_cpu_us_per_msg": cpu / n * 1e6, f"{name}_msgs_per_s": n / wall}


def measure_lite(registry: str, n: int) -> dict[str, float]:
    """Polling n messages with the asyncio lite pull consumer, then with the blocking one (a
    loop-thread hop per poll); both pull 32 at a time."""
    options = {"pull_batch_size": 32, "auto_commit_interval": 1.0}

    async def polled():
        c = AsyncLitePullConsumer(GROUP + "_lite", registry, **options)
        c.subscribe(TOPIC)
        async with c:
            got, c0, w0 = 0, time.process_time(), time.perf_counter()
            while got < n:
                got += len(await c.poll(10.0))
            return time.process_time() - c0, time.perf_counter() - w0
    cpu, wall = run(polled())
    out = {"lite_cpu_us_per_msg": cpu / n * 1e6, "lite_msgs_per_s": n / wall}
    blocking = LitePullConsumer(GROUP + "_lite_blocking", registry, **options)
    blocking.subscribe(TOPIC)
    with blocking:
        got, c0, w0 = 0, time.process_time(), time.perf_counter()
        while got < n:
            got += len(blocking.poll(10.0))
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    out.update(lite_blocking_cpu_us_per_msg=cpu / n * 1e6, lite_blocking_msgs_per_s=n / wall)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="a tiny run (a few seconds)")
    ap.add_argument("--registry", help="measure against this cluster instead of the stub broker")
    ap.add_argument("--serve-stub", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--stub-registry", help=argparse.SUPPRESS)
    ap.add_argument("--backlog", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = 500 if args.quick else 5000
    consume_n = 3200 if args.quick else 64000
    if args.serve_stub:
        run(serve_stub(args.serve_stub, args.stub_registry, args.backlog))
        return
    procs = []
    tmp = None
    try:
        registry = args.registry
        if registry is None:
            reg_port, stub_port = free_ports(2)
            tmp = tempfile.mkdtemp(prefix="bench-client-")
            procs.append(subprocess.Popen([sys.executable, "-m", "smartgo.registry", "--listen-port", str(reg_port),
                                           "--store-dir", tmp], cwd=ROOT))
            wait_for_port(reg_port)
            registry = f"127.0.0.1:{reg_port}"
            procs.append(subprocess.Popen([sys.executable, __file__, "--serve-stub", str(stub_port), "--stub-registry",
                                           registry, "--backlog", str(consume_n)], cwd=ROOT, stdout=subprocess.PIPE))
            assert procs[-1].stdout.readline().startswith(b"stub ready")
        runs = []
        probe = HostProbe()
        for _ in probe.before_each(1 if args.quick else args.runs):
            figures = measure_sends(registry, n)
            if args.registry is None:
                figures.update(measure_consume(registry, consume_n))
                figures.update(measure_consume(registry, consume_n, "consume_traced", **TRACED))
                figures.update(measure_consume(registry, consume_n, "consume_batch", consume_batch_max_size=32))
                figures.update(measure_lite(registry, consume_n))
            runs.append(figures)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    result = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
    result.update({"host_probe_ms": probe.ms, "runs": len(runs), "messages_per_mode": n, "consume_messages": consume_n,
                   "broker": "stub" if args.registry is None else args.registry})
    if not args.json:
        for k, v in result.items():
            print(f"{k:34} {v}")
    print(json.dumps(result) if args.json else "")


if __name__ == "__main__":
    main()
