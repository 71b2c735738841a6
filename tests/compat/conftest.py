"""Compatibility fixtures: a real broker node and two third-party RocketMQ 4.x clients - ali-ons
(pure JavaScript, from the npm registry) driven through small Node scripts in node/, and the
C++ client (rocketmq-client-cpp, PyPI `rocketmq`, a dev dependency) driven by cpp_client.py.

The ali-ons install is pinned by node/package-lock.json and made with `npm ci` the first time a
session needs it (Node.js and npm from Debian's packages when missing). An unreachable registry or
a missing `rocketmq` package FAIL the tests with a clear message: a compatibility suite that
silently skips proves nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.nodes import Node
from tests.support.broker import start_broker
from tests.support.npm import npm_ci
from smartgo.client import AsyncProducer, AsyncPullConsumer, Message, MessageExt, NoRouteError, PullStatus, SendResult
from smartgo.net.loop import run
from tests.support.waits import wait_until

NODE_DIR = Path(__file__).resolve().parent / "node"
CPP_DRIVER = Path(__file__).resolve().parent / "cpp_client.py"
#: The exact client release under test (package.json pins it too; a mismatch reinstalls).
ALI_ONS_VERSION = "3.12.0"


@pytest.fixture(scope="session")
def ali_ons() -> Path:
    """node/ with the pinned ali-ons in its node_modules (tests/support/npm.py)."""
    return npm_ci(NODE_DIR, "ali-ons", ALI_ONS_VERSION)


@dataclass
class Cluster:
    node: Node

    @property
    def broker(self) -> str:
        return f"127.0.0.1:{self.node.port}"

    @property
    def registry(self) -> str:
        return f"127.0.0.1:{self.node.registry_port}"


def _routed(registry: str, topic: str) -> bool:
    async def ask() -> bool:
        from smartgo.client import AsyncAdmin, NoRouteError
        async with AsyncAdmin(registry) as admin:
            try:
                await admin.topic_route(topic)
                return True
            except NoRouteError:
                return False
    return run(ask())


#: 4.x's levels with the first three shortened, so a send-back (level 3 + reconsume times) is due in
#: 3 s instead of 10 s.
COMPAT_DELAY_LEVELS = "1s 2s 3s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, ali_ons: Path) -> Cluster:
    """One master node with its embedded registry (supervisor.py) for the whole folder; tests use
    their own topics and groups. Every test of it may create its topic through ali-ons
    (`create_topic`), the C++ client's too: so ali-ons is installed first (a pytest-xdist worker
    that ran only C++ tests found no node_modules)."""
    node = start_broker(tmp_path_factory.mktemp("compat") / "node", {"message_delay_level": COMPAT_DELAY_LEVELS})
    try:
        c = Cluster(node)
        wait_until(lambda: _routed(c.registry, "TBW102"), timeout=30, interval=0.2,
                   message="the broker's registration")
        yield c
    finally:
        node.reap()


class OnsError(AssertionError):
    pass


class CppError(AssertionError):
    pass


@pytest.fixture(scope="session")
def cpp_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HOME for the C++ client (it logs to $HOME/logs/rocketmq-cpp); fails without the package."""
    if importlib.util.find_spec("rocketmq") is None:
        pytest.fail("the C++ client tests need PyPI `rocketmq` 0.4.4 (Linux x86_64), a dev dependency: "
                    "pip install -e '.[dev]'", pytrace=False)
    return tmp_path_factory.mktemp("cpp-home")


def cpp(home: Path, registry: str, ops: list[dict], timeout: float = 90.0) -> list:
    """Run cpp_client.py's ops against the registry; each op's value (CppError if one failed,
    naming it, or if the process died: the native client's log tail is in the message)."""
    spec = json.dumps({"nameSrv": registry, "ops": ops})
    _, out = run_driver([sys.executable, str(CPP_DRIVER), spec], "the C++ client", CppError, timeout,
                        {**os.environ, "HOME": str(home)}, context=lambda: _cpp_log(home))
    for op, r in zip(ops, out["results"]):
        if not r["ok"]:
            raise CppError(f"C++ client op {op} failed: {r['error']}\n{r.get('trace', '')}\n{_cpp_log(home)}")
    return [r["value"] for r in out["results"]]


def _cpp_log(home: Path) -> str:
    logs = sorted((home / "logs" / "rocketmq-cpp").glob("*"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return "(no C++ client log)"
    tail = logs[-1].read_text(errors="replace").splitlines()[-40:]
    return f"end of {logs[-1].name}:\n" + "\n".join(tail)


def run_driver(argv: list[str], what: str, error: type[AssertionError], timeout: float, env: dict[str, str],
               cwd: Path | None = None, context: Callable[[], str] = str) -> tuple[subprocess.CompletedProcess, Any]:
    """Run a client driver that prints one JSON document on its last stdout line: (the process,
    the document). `error`, naming `what`, with its stderr and context(), when it runs past
    timeout or prints no JSON."""
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise error(f"{what} did not finish in {timeout}s; stderr:\n{exc.stderr}\n{context()}") from None
    try:
        return done, json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise error(f"{what} printed no JSON (exit {done.returncode}); stderr:\n{done.stderr[-4000:]}\n"
                    f"{context()}") from None


def ons(script: str, spec: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """Run node/<script>.js with the JSON spec; its one JSON document from stdout. A script that
    failed (fatal error, non-zero exit, no JSON) raises OnsError with its stderr."""
    spec = {"deadlineMs": int(timeout * 1000) - 2000, **spec}
    done, result = run_driver(["node", f"{script}.js", json.dumps(spec)], f"ali-ons {script}", OnsError, timeout,
                              {**os.environ, "NODE_NO_WARNINGS": "1"}, cwd=NODE_DIR)
    if done.returncode != 0 or "fatal" in result:
        raise OnsError(f"ali-ons {script} failed: {result.get('fatal')}\nrequests: {summary(result)}\n"
                       f"stderr:\n{done.stderr[-4000:]}")
    return result


def summary(result: dict[str, Any]) -> list[str]:
    """The requests a script made, one `code -> answer (remark)` line each, for failure messages."""
    return [f"{c['code']} -> {c['resp']}" + (f" ({c['remark']})" if c.get("remark") else "")
            for c in result.get("calls", [])]


def arun(coro: Any) -> Any:
    return run(coro)


# -- shared steps ------------------------------------------------------------------------------------

def topic_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def create_topic(cluster: Cluster, topic: str, queues: int = 4) -> dict:
    """UPDATE_AND_CREATE_TOPIC through ali-ons (its own request, numbers and booleans in extFields),
    then the route as ali-ons parsed it. ali-ons cannot send to a topic the registry does not know
    (it never falls back to TBW102), so every test creates its topic first. The route is asked
    for once: the broker answers the create after its registration round, as Java's
    registerIncrementBrokerData does."""
    out = ons("api", {"nameSrv": cluster.registry, "ops": [
        {"op": "createTopic", "broker": cluster.broker, "topic": topic, "queues": queues},
        {"op": "route", "topic": topic}]})
    created, route = out["results"]
    assert created["ok"], created
    assert route["ok"], route
    return route["value"]


def python_send(cluster: Cluster, topic: str, n: int, big_every: int = 0) -> list[tuple[Message, SendResult]]:
    """n messages from SmartGo's Python producer: tags A, B, C in turn, a key and a property each;
    every big_every-th body is ~6-8 KiB (compressed on the wire)."""
    async def main():
        async with AsyncProducer("PG_COMPAT_PY", cluster.registry) as p:
            out = []
            for i in range(n):
                body = (f"py-{i}-".encode() * 1000) if big_every and i % big_every == 0 else f"py-{i}".encode()
                msg = Message(topic, body, tags="ABC"[i % 3], keys=[f"py-key-{i}"], properties={"idx": str(i)})
                out.append((msg, await p.send(msg)))
            return out
    return arun(main())


def python_read(cluster: Cluster, topic: str, expression: str = "*") -> list[MessageExt]:
    """Every message of the topic matching expression, through SmartGo's Python PullConsumer;
    none while the registries have no route yet (a topic created by a send is registered a
    moment later)."""
    async def main():
        async with AsyncPullConsumer("COMPAT_PY_PULL", cluster.registry) as pc:
            out = []
            try:
                queues = await pc.fetch_queues(topic)
            except NoRouteError:
                return out
            for q in queues:
                offset = 0
                while (r := await pc.pull(q, expression, offset, 32)).status is PullStatus.FOUND:
                    out += r.messages
                    offset = r.next_begin_offset
            return out
    return arun(main())
