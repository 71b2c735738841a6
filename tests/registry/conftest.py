"""Registry test helpers: request builders shaped like a Java broker's, a fake clock, strict JSON."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smartgo.net.codes import RequestCode
from smartgo.net.command import RemotingCommand
from tests.support.waits import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "DefaultCluster"


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def topic_table(topics: dict[str, tuple[int, int, int]]) -> dict[str, dict[str, Any]]:
    """{name: (read, write, perm)} as a Java TopicConfigSerializeWrapper.topicConfigTable."""
    return {name: {"order": False, "perm": perm, "readQueueNums": read, "topicFilterType": "SINGLE_TAG",
                   "topicName": name, "topicSysFlag": 0, "writeQueueNums": write}
            for name, (read, write, perm) in topics.items()}


def register_body(topics: dict[str, tuple[int, int, int]], counter: int = 1, timestamp: int = 1_700_000_000_000) -> bytes:
    return json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": counter, "timestamp": timestamp},
        "topicConfigTable": topic_table(topics)}}, separators=(",", ":")).encode()


def compressed_register_body(topics: dict[str, tuple[int, int, int]], counter: int = 1,
                             timestamp: int = 1_700_000_000_000) -> bytes:
    """RegisterBrokerBody.encode(true) as the Java broker writes it (Deflater BEST_COMPRESSION)."""
    def part(data: bytes) -> bytes:
        return struct.pack(">i", len(data)) + data
    out = part(json.dumps({"counter": counter, "timestamp": timestamp}).encode())
    out += struct.pack(">i", len(topics))
    for name, (read, write, perm) in topics.items():
        out += part(f"{name} {read} {write} {perm} SINGLE_TAG".encode())
    out += part(b"[]")
    return zlib.compress(out, 9)


def register_request(broker_name: str, broker_addr: str, broker_id: int, body: bytes | None, *,
                     cluster: str = CLUSTER, ha_addr: str | None = None, compressed: bool = False,
                     crc: bool = True, version: int = 409) -> RemotingCommand:
    ext = {"brokerName": broker_name, "brokerAddr": broker_addr, "clusterName": cluster,
           "haServerAddr": ha_addr or broker_addr.rsplit(":", 1)[0] + ":10912", "brokerId": str(broker_id),
           "compressed": "true" if compressed else "false",
           "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF if crc and body else 0)}
    return RemotingCommand(RequestCode.REGISTER_BROKER, version=version, ext_fields=ext, body=body)


def strict_json(data: bytes) -> Any:
    """Parse with a strict parser: no NaN/Infinity, no duplicate keys; and demand compact output."""
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate keys in {keys}"
        return dict(pairs)

    def no_constants(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")
    obj = json.loads(data.decode("utf-8"), object_pairs_hook=no_duplicates, parse_constant=no_constants)
    assert json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() == data, "not compact JSON"
    return obj


@pytest.fixture
def registry_process(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Start/stop `python -m smartgo.registry` processes on one port and store dir; reaps them all."""
    port = free_port()
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "smartgo.registry", "--listen-port", str(port),
                                 "--store-dir", str(tmp_path / "namesrv"), "--log-level", "WARNING"], cwd=ROOT)
        procs.append(proc)
        wait_for_port(port)
        return proc

    try:
        yield {"start": start, "port": port, "store": tmp_path / "namesrv"}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
