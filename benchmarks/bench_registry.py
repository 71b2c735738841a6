"""Registry benchmark: GET_ROUTEINFO_BY_TOPIC answered per second, registry in its own process.

A setup connection registers --brokers master/slave pairs that each serve --topics topics (and
stays open: closing it would drop them). Then 8 clients (8 connections), each asking for routes
of random topics back to back, run for --seconds. Figures (medians of --runs runs):
  route_json_per_s     clients speak JSON, as Java/Go/Node clients do
  route_msgpack_per_s  SmartGo clients after negotiation
  route_body_bytes     size of one route answer
  route_<type>_server_cpu_us  registry CPU per answer, setup included (robust to a busy machine)
  host_probe_ms        the CPU time of a fixed Python loop before each run: higher is a slower host
                       (host_probe.py; this VM's CPU speed varies up to 2x second to second)

    .venv/bin/python benchmarks/bench_registry.py [--runs 5] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
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
from smartgo.net.codes import RequestCode, ResponseCode, SerializeType  # noqa: E402
from smartgo.net.command import RemotingCommand  # noqa: E402
from smartgo.net.loop import run  # noqa: E402
from tests.support.waits import free_port, wait_for_port  # noqa: E402

CLIENTS = 8


def register_request(name: str, addr: str, broker_id: int, topics: list[str]) -> RemotingCommand:
    table = {t: {"order": False, "perm": 6, "readQueueNums": 8, "topicFilterType": "SINGLE_TAG",
                 "topicName": t, "topicSysFlag": 0, "writeQueueNums": 8} for t in topics}
    body = json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1, "timestamp": 1_700_000_000_000}, "topicConfigTable": table}}).encode()
    host = addr.rsplit(":", 1)[0]
    return RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields={
        "brokerName": name, "brokerAddr": addr, "clusterName": "BenchCluster", "haServerAddr": f"{host}:10912",
        "brokerId": str(broker_id), "compressed": "false", "bodyCrc32": "0"}, body=body)


async def measure(addr: str, stype: int, brokers: int, topics: list[str], seconds: float) -> tuple[float, int, int]:
    async with RemotingClient(announce=False) as setup:
        for b in range(brokers):
            for broker_id in (0, 1):
                reply = await setup.invoke(addr, register_request(f"broker-{b}", f"10.0.{b}.{broker_id + 1}:10911",
                                                                  broker_id, topics))
                assert reply.code == ResponseCode.SUCCESS, reply
        clients = [RemotingClient(serialize_type=stype, announce=stype != SerializeType.JSON) for _ in range(CLIENTS)]
        conns = []
        for client in clients:
            for _ in range(2):   # dial and negotiate
                sample = await client.invoke(addr, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                                   ext_fields={"topic": topics[0]}))
            assert sample.code == ResponseCode.SUCCESS, sample
            conns.append(await client.connection(addr))
        body_size = len(sample.body or b"")
        counts = [0] * CLIENTS
        deadline = time.perf_counter() + seconds

        async def ask(i: int) -> None:
            rng = random.Random(i)
            conn = conns[i]
            while time.perf_counter() < deadline:
                for _ in range(50):
                    cmd = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": rng.choice(topics)})
                    reply = await conn.invoke(cmd, 5.0)
                    if reply.code != ResponseCode.SUCCESS:
                        raise RuntimeError(f"route query failed: {reply}")
                counts[i] += 50

        start = time.perf_counter()
        await asyncio.gather(*(ask(i) for i in range(CLIENTS)))
        elapsed = time.perf_counter() - start
        for client in clients:
            await client.close()
    return sum(counts) / elapsed, body_size, sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per figure and run")
    parser.add_argument("--brokers", type=int, default=2, help="master/slave pairs")
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON on the last line")
    args = parser.parse_args()
    runs, seconds = (1, 0.3) if args.quick else (args.runs, args.seconds)
    topics = [f"BenchTopic{i}" for i in range(args.topics)]
    samples: dict[str, list[float]] = {}
    body_size = 0
    probe = HostProbe()
    with tempfile.TemporaryDirectory() as store:
        for _ in probe.before_each(runs):
            port = free_port()
            proc = subprocess.Popen([sys.executable, "-m", "smartgo.registry", "--listen-port", str(port),
                                     "--store-dir", store, "--log-level", "WARNING"], cwd=ROOT)
            try:
                wait_for_port(port)
                registry = psutil.Process(proc.pid)
                for name, stype in (("json", SerializeType.JSON), ("msgpack", SerializeType.MSGPACK)):
                    cpu_before = sum(registry.cpu_times()[:2])
                    rate, body_size, answered = run(measure(f"127.0.0.1:{port}", stype, args.brokers, topics, seconds))
                    samples.setdefault(f"route_{name}_per_s", []).append(rate)
                    samples.setdefault(f"route_{name}_server_cpu_us", []).append(
                        (sum(registry.cpu_times()[:2]) - cpu_before) / answered * 1e6)
            finally:
                proc.terminate()
                proc.wait(10)
    figures: dict[str, object] = {name: round(statistics.median(v), 1) for name, v in samples.items()}
    figures.update(host_probe_ms=probe.ms, route_body_bytes=body_size, clients=CLIENTS, runs=runs,
                   quick=args.quick)
    for name, value in figures.items():
        print(f"{name:22s} {value}")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
