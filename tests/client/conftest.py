"""Client test helpers: a real registry in-process and a *scripted* fake broker (a RemotingServer
whose every request is recorded and answered by the handler a test installs for its code). The
fake checks request shapes and error handling; real behaviour is tested against real brokers in
the e2e files."""

from __future__ import annotations

import asyncio
import inspect
import json
import zlib
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection
from smartgo.net.loop import run
from smartgo.net.server import RemotingServer
from smartgo.registry.server import RegistryServer
from smartgo.store.record import encode_properties, encode_record, pack_host

Handler = Callable[[Connection, RemotingCommand], "RemotingCommand | None | Awaitable[RemotingCommand | None]"]


class FakeBroker:
    """A broker-shaped RemotingServer: records requests, answers with installed handlers, and
    REQUEST_CODE_NOT_SUPPORTED for codes without one."""

    def __init__(self, name: str = "broker-a", topics: dict[str, int] | None = None, cluster: str = "DefaultCluster",
                 broker_id: int = 0) -> None:
        self.name = name
        self.cluster = cluster
        self.broker_id = broker_id
        self.topics = {"TBW102": 8, **(topics or {})}
        self.requests: list[RemotingCommand] = []
        self.handlers: dict[int, Handler] = {}
        self.connections: list[Connection] = []
        self.server = RemotingServer("127.0.0.1", [0], {}, self._dispatch)
        self.next_offsets: dict[tuple[str, int], int] = {}
        self.commit_log_offset = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    async def start(self, registry_addr: str) -> FakeBroker:
        await self.server.start()
        await self.register(registry_addr)
        return self

    async def register(self, registry_addr: str) -> None:
        from smartgo.net.client import RemotingClient
        table = {t: {"order": False, "perm": 7 if t == "TBW102" else 6, "readQueueNums": n,
                     "topicFilterType": "SINGLE_TAG", "topicName": t, "topicSysFlag": 0, "writeQueueNums": n}
                 for t, n in self.topics.items()}
        body = json.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
            "dataVersion": {"counter": len(self.requests) + 1, "timestamp": 1}, "topicConfigTable": table}}).encode()
        ext = {"brokerName": self.name, "brokerAddr": self.addr, "clusterName": self.cluster,
               "haServerAddr": self.addr, "brokerId": str(self.broker_id), "compressed": "false",
               "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)}
        self._registrar = getattr(self, "_registrar", None) or RemotingClient()
        resp = await self._registrar.invoke(registry_addr, RemotingCommand(RequestCode.REGISTER_BROKER,
                                                                           ext_fields=ext, body=body))
        assert resp.code == 0, resp.remark

    async def stop(self) -> None:
        await self.server.stop()
        if getattr(self, "_registrar", None) is not None:
            await self._registrar.close()

    def of(self, code: int) -> list[RemotingCommand]:
        return [r for r in self.requests if r.code == code]

    async def _dispatch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        if conn not in self.connections:
            self.connections.append(conn)
        self.requests.append(cmd)
        handler = self.handlers.get(cmd.code)
        if handler is None:
            return cmd.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
        out = handler(conn, cmd)
        if inspect.isawaitable(out):
            out = await out
        return out

    # -- canned handlers --------------------------------------------------------------------------

    def send_ok(self, code: int = ResponseCode.SUCCESS) -> Handler:
        """Answer sends like a broker: msgId, queueId, queueOffset (counting per queue)."""
        def handle(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
            ext = cmd.ext_fields
            topic, qid = ext["b"], int(ext["e"])
            offset = self.next_offsets.get((topic, qid), 0)
            self.next_offsets[(topic, qid)] = offset + 1
            self.commit_log_offset += 100
            msg_id = (pack_host("127.0.0.1", self.server.port) + self.commit_log_offset.to_bytes(8, "big")).hex().upper()
            return cmd.make_response(code, None, {"msgId": msg_id, "queueId": str(qid), "queueOffset": str(offset),
                                                  "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"})
        return handle

    def record(self, topic: str, queue_id: int, offset: int, body: bytes, props: dict[str, str]) -> bytes:
        """A store record as a pull body would carry it."""
        return encode_record(topic, queue_id, body, encode_properties(props), queue_offset=offset,
                             physical_offset=1000 + offset * 200, born_host=pack_host("127.0.0.1", 5555),
                             store_host=pack_host("127.0.0.1", self.server.port), born_timestamp=1, store_timestamp=2)


def response(cmd: RemotingCommand, code: int = 0, ext: dict[str, str] | None = None, body: bytes | None = None,
             remark: str | None = None) -> RemotingCommand:
    return cmd.make_response(code, remark, ext if ext is not None else {}, body)


def pull_response(cmd: RemotingCommand, code: int, next_offset: int, min_offset: int = 0, max_offset: int = 0,
                  body: bytes | None = None) -> RemotingCommand:
    return cmd.make_response(code, "FOUND" if code == 0 else "NO_MESSAGE", {
        "suggestWhichBrokerId": "0", "nextBeginOffset": str(next_offset), "minOffset": str(min_offset),
        "maxOffset": str(max_offset)}, body)


@asynccontextmanager
async def fake_cluster(tmp: Path, brokers: list[FakeBroker] | None = None):
    """A real registry (in this loop) and fake brokers registered with it."""
    registry = RegistryServer("127.0.0.1", 0, tmp / "registry")
    await registry.start()
    addr = f"127.0.0.1:{registry.port}"
    brokers = brokers if brokers is not None else [FakeBroker()]
    try:
        for b in brokers:
            await b.start(addr)
        yield addr, brokers
    finally:
        for b in brokers:
            await b.stop()
        await registry.stop()


class Background:
    """An event loop on a daemon thread, for fakes that blocking clients (or the CLI) talk to."""

    def __init__(self) -> None:
        import threading

        from smartgo.net.loop import new_event_loop
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def arun(coro: Any) -> Any:
    """Run a test coroutine on a fresh loop (no pytest-asyncio here)."""
    return run(coro)


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path


# -- real processes (e2e) ----------------------------------------------------------------------------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from tests.support.waits import free_ports, steady_disk_usage, wait_for_port, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: Small files so a test store stays small (the broker's defaults are 1 GiB CommitLog files).
SMALL_STORE = ["--commitlog-file-size", str(64 * 1024 * 1024), "--consume-queue-file-size", str(60_000 * 20),
               "--index-slot-count", "50000", "--index-entry-count", "200000"]


class RealCluster:
    """A registry process and a master broker (supervisor.py --role master) on free loopback ports."""

    def __init__(self, root: Path, topics: str = "", extra_args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.extra_args = extra_args
        self.registry_port, self.broker_port, self.ha_port = free_ports(3)
        self.registry = f"127.0.0.1:{self.registry_port}"
        self.broker = f"127.0.0.1:{self.broker_port}"
        self.topics = topics
        self.procs: list[subprocess.Popen] = []

    def start(self) -> RealCluster:
        log = open(self.root / "cluster.log", "ab")
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "smartgo.registry", "--listen-port", str(self.registry_port),
             "--store-dir", str(self.root / "registry")], cwd=ROOT, stdout=log, stderr=log, start_new_session=True))
        wait_for_port(self.registry_port)
        args = [sys.executable, "supervisor.py", "--role", "master", "--store-dir", str(self.root / "broker"),
                "--listen-host", "127.0.0.1", "--listen-port", str(self.broker_port), "--vip-port", "0",
                "--ha-port", str(self.ha_port),
                "--registry", self.registry, "--net-actors", "1", "--mqtt-port", "0", "--mqtt-ws-port", "0",
                *SMALL_STORE,
                "--stats-sample-interval", "2",          # the stats items' minute list: 2 s, not 10 s
                "--disk-usage-file", steady_disk_usage(self.root / "disk_usage")]
        if self.topics:
            args += ["--topics", self.topics]
        args += self.extra_args
        self.procs.append(subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=log, start_new_session=True))
        try:
            wait_for_port(self.broker_port, timeout=60)
            wait_until(self._tbw102_routed, timeout=30, interval=0.2, message="the broker's registration")
        except BaseException:
            self.stop()
            raise
        return self

    def _tbw102_routed(self) -> bool:
        async def ask() -> bool:
            from smartgo.client import AsyncAdmin, NoRouteError
            async with AsyncAdmin(self.registry) as admin:
                try:
                    await admin.topic_route("TBW102")
                    return True
                except NoRouteError:
                    return False
        return run(ask())

    def __enter__(self) -> RealCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.procs.clear()


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory):
    with RealCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster
