"""Remoting benchmark: header codecs, and request/response rates against a server in another process.

Figures (medians of --runs runs):
  header_<type>_us       encode + decode of a typical SEND_MESSAGE_V2 request header (the Python codec)
  frame_<type>_us        encode_command + FrameDecoder.feed of that request with its body: the codec in use
                         (`codec`: c, smartgo.net._codec, unless SMARTGO_PURE_PYTHON=1)
  sync_<type>_per_s      sequential round trips on one connection (await each response)
  sync_pinned_json_per_s the same with client and server pinned to one CPU (no cross-CPU wake-up)
  sync_busy_poll_json_per_s  the same unpinned, both sides busy-polling (--busy-poll-us, smartgo.net.busy_poll)
  sync_json_cpu_us, sync_busy_poll_json_cpu_us  client + server CPU per round trip (the price of polling)
  pipelined_<type>_per_s requests/s on one connection with `--window` requests in flight
  conn16_<type>_per_s    16 connections, each doing sequential round trips concurrently
  pipelined_<type>_{client,server}_cpu_us  CPU time per pipelined request on each side
                         (robust to a busy machine: 1e6 / the larger is the rate with a core each)
  host_probe_ms          the CPU time of a fixed Python loop before each run: higher is a slower host
                         (host_probe.py; this VM's CPU speed varies up to 2x second to second)
<type> is json (what foreign clients use) or msgpack (SmartGo peers after negotiation).

    .venv/bin/python benchmarks/bench_remoting.py [--runs 5] [--json] [--quick] [--loop uvloop|asyncio] [--busy-poll-us 100]
                                                  [--tls | --permissive-plain]

--tls measures every figure over TLS (TLS clients, echo servers in permissive mode with a
self-signed certificate): compare it with a run without. --permissive-plain keeps the servers
permissive but the clients plain: what a permissive port costs the clients that do not use TLS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from host_probe import HostProbe  # noqa: E402
from smartgo.net.client import RemotingClient  # noqa: E402
from smartgo.net.codes import RequestCode, SerializeType  # noqa: E402
from smartgo.net.command import RemotingCommand  # noqa: E402
from smartgo.net.frame import FrameDecoder, codec_in_use, encode_command  # noqa: E402
from smartgo.net.headers import decode_header, encode_header  # noqa: E402
from smartgo.net.loop import run  # noqa: E402
from smartgo.net.tls import client_context  # noqa: E402
from tests.support.waits import free_port, self_signed_cert, wait_for_port  # noqa: E402

SEND_HEADER = {
    "a": "PID_benchmark_producer", "b": "BenchmarkTopic", "c": "TBW102", "d": "4", "e": "3",
    "f": "0", "g": "1700000000123", "h": "0",
    "i": "UNIQ_KEY\x01C0A8010A1B2C18B4AAC2A1B2C30000\x02WAIT\x01true\x02TAGS\x01TagA",
    "j": "0", "k": "false", "m": "false",
}
BODY = b"m" * 128
TYPES = {"json": SerializeType.JSON, "msgpack": SerializeType.MSGPACK}


def send_request() -> RemotingCommand:
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=dict(SEND_HEADER), body=BODY)


# -- measurements ----------------------------------------------------------------------------------

def header_us(stype: int, n: int) -> float:
    cmd = send_request()
    cmd.serialize_type = stype
    encode, decode = encode_header, decode_header
    start = time.perf_counter()
    for _ in range(n):
        decode(stype, encode(cmd))
    return (time.perf_counter() - start) / n * 1e6


def frame_us(stype: int, n: int) -> float:
    cmd = send_request()
    cmd.serialize_type = stype
    decoder = FrameDecoder()
    join = b"".join
    start = time.perf_counter()
    for _ in range(n):
        decoder.feed(join(encode_command(cmd)))
    return (time.perf_counter() - start) / n * 1e6


#: --tls: every client speaks TLS to a permissive server (set by main).
TLS: dict = {"client": None, "server_args": []}


async def _client(addr: str, stype: int, busy_poll_us: int = 0) -> RemotingClient:
    client = RemotingClient(serialize_type=stype, announce=stype != SerializeType.JSON, busy_poll_us=busy_poll_us,
                            ssl_context=TLS["client"])
    await client.invoke(addr, send_request())   # dial + negotiate
    await client.invoke(addr, send_request())
    return client


async def sync_rate(addr: str, stype: int, n: int, busy_poll_us: int = 0) -> float:
    client = await _client(addr, stype, busy_poll_us)
    conn = await client.connection(addr)
    start = time.perf_counter()
    for _ in range(n):
        await conn.invoke(send_request(), 5.0)
    elapsed = time.perf_counter() - start
    await client.close()
    return n / elapsed


async def pipelined_rate(addr: str, stype: int, n: int, window: int) -> float:
    client = await _client(addr, stype)
    conn = await client.connection(addr)
    done = asyncio.get_running_loop().create_future()
    sent = received = 0
    errors: list[BaseException] = []

    def on_response(response, error) -> None:
        nonlocal sent, received
        received += 1
        if error is not None:
            errors.append(error)
        if sent < n:
            sent += 1
            conn.invoke_async(send_request(), 10.0, on_response)
        elif received == n and not done.done():
            done.set_result(None)

    start = time.perf_counter()
    for _ in range(min(window, n)):
        sent += 1
        conn.invoke_async(send_request(), 10.0, on_response)
    await done
    elapsed = time.perf_counter() - start
    await client.close()
    if errors:
        raise RuntimeError(f"{len(errors)} pipelined requests failed: {errors[0]}")
    return n / elapsed


async def multi_conn_rate(addr: str, stype: int, n_per_conn: int, conns: int) -> float:
    clients = [await _client(addr, stype) for _ in range(conns)]
    links = [await c.connection(addr) for c in clients]

    async def loop_on(conn) -> None:
        for _ in range(n_per_conn):
            await conn.invoke(send_request(), 10.0)

    start = time.perf_counter()
    await asyncio.gather(*(loop_on(c) for c in links))
    elapsed = time.perf_counter() - start
    for c in clients:
        await c.close()
    return n_per_conn * conns / elapsed


def start_server(port: int, loop_name: str, cpu: int | None, busy_poll_us: int = 0) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "smartgo.net.echo", "--port", str(port), "--loop", loop_name,
           "--busy-poll-us", str(busy_poll_us), *TLS["server_args"]]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def sync_with_cpu(addr: str, server: subprocess.Popen, n: int, busy_poll_us: int,
                  prefer_uvloop: bool) -> tuple[float, float]:
    """Sync JSON round trips/s and client + server CPU µs per round trip."""
    proc = psutil.Process(server.pid)
    before = time.process_time() + sum(proc.cpu_times()[:2])
    rate = run(sync_rate(addr, SerializeType.JSON, n, busy_poll_us), prefer_uvloop=prefer_uvloop)
    return rate, (time.process_time() + sum(proc.cpu_times()[:2]) - before) / n * 1e6


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON on the last line")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--window", type=int, default=256, help="requests in flight when pipelining")
    parser.add_argument("--busy-poll-us", type=int, default=100,
                        help="busy-poll window of both sides for sync_busy_poll_* (default 100)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--tls", action="store_true",
                      help="every figure over TLS: TLS clients, servers in permissive mode (self-signed certificate)")
    mode.add_argument("--permissive-plain", action="store_true",
                      help="servers in permissive mode, clients plain")
    args = parser.parse_args()
    prefer_uvloop = args.loop == "uvloop"
    certs = tempfile.TemporaryDirectory(prefix="bench-tls-")
    if args.tls or args.permissive_plain:
        cert, key = self_signed_cert(Path(certs.name), "echo")
        TLS.update(client=client_context() if args.tls else None,
                   server_args=["--tls-mode", "permissive", "--tls-cert-file", cert, "--tls-key-file", key])

    runs = 1 if args.quick else args.runs
    scale = 0.05 if args.quick else 1.0
    n_sync, n_pipe, n_conn = int(20000 * scale), int(200000 * scale), int(3000 * scale)
    samples: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    all_cpus = os.sched_getaffinity(0)
    for _ in range(runs):
        record("host_probe_ms", HostProbe.now())      # this VM's CPU speed varies: see host_probe.py
        for tname, stype in TYPES.items():
            record(f"header_{tname}_us", header_us(stype, int(50000 * scale)))
            record(f"frame_{tname}_us", frame_us(stype, int(50000 * scale)))
        record("header_rocketmq_us", header_us(SerializeType.ROCKETMQ, int(50000 * scale)))
        port = free_port()
        server = start_server(port, args.loop, None)
        addr = f"127.0.0.1:{port}"
        try:
            for tname, stype in TYPES.items():
                record(f"sync_{tname}_per_s", run(sync_rate(addr, stype, n_sync), prefer_uvloop=prefer_uvloop))
                server_cpu = psutil.Process(server.pid)
                cpu_before = time.process_time(), sum(server_cpu.cpu_times()[:2])
                record(f"pipelined_{tname}_per_s",
                       run(pipelined_rate(addr, stype, n_pipe, args.window), prefer_uvloop=prefer_uvloop))
                # CPU per request on each side: what the rate would be with a whole core each
                record(f"pipelined_{tname}_client_cpu_us", (time.process_time() - cpu_before[0]) / n_pipe * 1e6)
                record(f"pipelined_{tname}_server_cpu_us",
                       (sum(server_cpu.cpu_times()[:2]) - cpu_before[1]) / n_pipe * 1e6)
                record(f"conn16_{tname}_per_s",
                       run(multi_conn_rate(addr, stype, n_conn, 16), prefer_uvloop=prefer_uvloop))
        finally:
            stop_server(server)
        for name, poll_us in (("sync_json", 0), ("sync_busy_poll_json", args.busy_poll_us)):
            port = free_port()
            server = start_server(port, args.loop, None, poll_us)
            try:
                rate, cpu_us = sync_with_cpu(f"127.0.0.1:{port}", server, n_sync, poll_us, prefer_uvloop)
                if poll_us:
                    record(f"{name}_per_s", rate)
                record(f"{name}_cpu_us", cpu_us)
            finally:
                stop_server(server)
        cpu = min(all_cpus)
        port = free_port()
        server = start_server(port, args.loop, cpu)
        os.sched_setaffinity(0, {cpu})
        try:
            record("sync_pinned_json_per_s",
                   run(sync_rate(f"127.0.0.1:{port}", SerializeType.JSON, n_sync), prefer_uvloop=prefer_uvloop))
        finally:
            os.sched_setaffinity(0, all_cpus)
            stop_server(server)

    figures: dict[str, object] = {name: round(statistics.median(v), 2) for name, v in samples.items()}
    figures.update(runs=runs, codec=codec_in_use(), loop=args.loop, window=args.window, busy_poll_us=args.busy_poll_us, quick=args.quick,
                   tls=args.tls, permissive_plain=args.permissive_plain)
    certs.cleanup()
    for name, value in figures.items():
        print(f"{name:28s} {value}")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
