"""The examples of docs/CLIENT.md and README.md, run as written and in document order against one real
node on free ports: each `smartgo` command of their shell blocks and code spans, and each SDK code
block that is a whole program, must end with status 0 within its time. A doc example that hangs or
fails fails here, so the docs stay a list of commands that work.

The docs address a default node (registry 127.0.0.1:9876, broker 127.0.0.1:10911): each example runs
with $SMARTGO_REGISTRY set to the test node's registry and those two addresses replaced by its own.
Both nodes run with ACL on, from the README's own plain_acl.yml, and the commands sign with its admin
account ($SMARTGO_ACCESS_KEY, $SMARTGO_SECRET_KEY), as the docs tell an operator of such a broker.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.broker import start_broker
from smartgo.client import Admin, ConsumeResult, Message, Producer, PushConsumer, create_reply_message
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
CLIENT_MD, README = ROOT / "docs" / "CLIENT.md", ROOT / "README.md"
BIN = Path(sys.executable).parent              # the venv's bin: its `smartgo`
EXAMPLE_TIMEOUT = 60.0                         # generous for a shared machine; a hang is forever
FENCE = re.compile(r"^ *```(\w*)\n(.*?)^ *```", re.M | re.S)
ADMIN = ("operator", "operator-secret")        # the admin account of the README's plain_acl.yml
# `smartgo bench` runs 10 s by default; 2 s runs the same code and leaves the shared CPU to others.
BENCH_SHORTENED = " --duration 2"


@dataclass
class Example:
    doc: str
    text: str           # a shell command line, or a Python program
    python: bool = False

    def __str__(self) -> str:
        return f"{self.doc}: {self.text.splitlines()[0]}{' ...' if self.python else ''}"


def doc_examples(path: Path, spans: bool = False) -> list[Example]:
    """In document order: each line of a shell block that runs `smartgo` (without its comment),
    each Python block that is a whole program, and with spans the prose's `smartgo ...` code spans."""
    text, name, found = path.read_text(), path.relative_to(ROOT).as_posix(), []
    for m in FENCE.finditer(text):
        lang, body = m.group(1), textwrap.dedent(m.group(2))
        if lang in ("sh", "bash", "shell"):
            for line in body.splitlines():
                command = line.split("  #", 1)[0].strip()
                if re.search(r"(^|\| *)(\.venv/bin/)?smartgo ", command):
                    found.append((m.start(), Example(name, command)))
        elif lang == "python" and whole_program(body):
            found.append((m.start(), Example(name, body, python=True)))
    if spans:
        prose = FENCE.sub(lambda m: " " * len(m.group(0)), text)       # keeps the offsets
        for m in re.finditer(r"`(smartgo [^`]+)`", prose):
            found.append((m.start(), Example(name, " ".join(m.group(1).split()))))
    return [ex for _, ex in sorted(found, key=lambda pair: pair[0])]


def whole_program(code: str) -> bool:
    """Whether a Python block runs by itself: it compiles as a module and binds every name it reads
    (a snippet reads the reader's own `handle`, `consumer`, `ts_ms`, ...)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    bound, read = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return read <= bound


def readme_acl() -> str:
    """The README's plain_acl.yml."""
    return next(body for lang, body in FENCE.findall(README.read_text()) if lang == "yaml" and "accounts:" in body)


@dataclass
class Node:
    registry: str
    broker: str
    home: Path
    admin: Admin
    placeholders: dict[str, str] = field(default_factory=dict)


@contextmanager
def running_node(base: Path, acl: str, store: Path | None = None) -> Iterator[Node]:
    """A default-named node (broker-a of DefaultCluster) with ACL on and an empty store (in base, or
    at store), once routable; $HOME of the examples is base/home."""
    (base / "plain_acl.yml").write_text(acl)
    (base / "home").mkdir()
    started = start_broker(store or base / "node", {"acl_enable": "true", "acl_file": str(base / "plain_acl.yml")})
    registry = f"127.0.0.1:{started.registry_port}"       # type: ignore[attr-defined]
    try:
        with Admin(registry, access_key=ADMIN[0], secret_key=ADMIN[1]) as admin:
            wait_until(lambda: "broker-a" in admin.topic_list(), 30, 0.1, "the node's own topic in the registry")
            yield Node(registry, f"127.0.0.1:{started.port}", base / "home", admin)
    finally:
        started.reap()


def env_of(node: Node, signed: bool) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(node.home),
           "SMARTGO_REGISTRY": node.registry, "PYTHONUNBUFFERED": "1"}
    for name in ("SMARTGO_ACCESS_KEY", "SMARTGO_SECRET_KEY"):
        env.pop(name, None)
    if signed:
        env["SMARTGO_ACCESS_KEY"], env["SMARTGO_SECRET_KEY"] = ADMIN
    return env


def run_example(node: Node, ex: Example) -> str | None:
    """None once the example ended with status 0; else how it hung or failed."""
    text = ex.text.replace("127.0.0.1:9876", node.registry).replace("127.0.0.1:10911", node.broker)
    for placeholder, value in node.placeholders.items():
        text = text.replace(placeholder, value)
    if ex.python:
        argv = [sys.executable, "-c", text]
    else:
        argv = ["bash", "-c", text + (BENCH_SHORTENED if "smartgo bench " in text else "")]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env_of(node, signed=not ex.python), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=EXAMPLE_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)           # the whole pipeline it started, not only bash
        _, err = proc.communicate()
        return f"hangs: still running after {time.monotonic() - started:.0f} s; stderr: {err.strip()[-800:]!r}"
    return f"exit {proc.returncode}: {err.strip()[-800:]}" if proc.returncode else None


def run_in_order(node: Node, examples: list[Example], excluded: dict[str, str],
                 before: Callable[[Example], None] = lambda ex: None) -> list[str]:
    """Every example but the excluded ones, in order; what each that failed said."""
    listed = {ex.text for ex in examples}
    assert set(excluded) <= listed, f"excluded examples no longer in the docs: {set(excluded) - listed}"
    failed = []
    for ex in examples:
        if ex.text in excluded:
            continue
        before(ex)
        why = run_example(node, ex)
        if why is not None:
            failed.append(f"{ex}\n    {why}")
    return failed


class Application:
    """What runs beside the commands that ask live clients about themselves: a consumer of g1 on
    Orders, a producer of pg1 that has sent to Orders, and a replier on Quotes (the request-reply
    section's quote-service)."""

    def __init__(self, node: Node) -> None:
        keys = {"access_key": ADMIN[0], "secret_key": ADMIN[1]}
        node.admin.create_topic("Quotes", 4)
        self.consumer = PushConsumer("g1", node.registry, **keys)
        self.consumer.subscribe("Orders", "created || paid")
        self.consumer.set_listener(lambda msg: ConsumeResult.SUCCESS)
        self.producer = Producer("pg1", node.registry, **keys)
        self.replier = PushConsumer("quote-service", node.registry, **keys)
        self.replier.subscribe("Quotes")
        self.replier.set_listener(self.answer)
        for client in (self.consumer, self.producer, self.replier):
            client.start()
        self.producer.send(Message("Orders", b"from pg1"))
        wait_until(self.replies, 30, 0.5, "the replier answering a request")
        node.placeholders["--client ID"] = f"--client {self.consumer.client_id}"

    def answer(self, msg) -> ConsumeResult:
        self.producer.send(create_reply_message(msg, b"1.0842"))
        return ConsumeResult.SUCCESS

    def replies(self) -> bool:
        try:
            return self.producer.request(Message("Quotes", b"EURUSD?"), timeout=2.0).body == b"1.0842"
        except Exception:           # not yet: the replier is still taking its queues
            return False

    def close(self) -> None:
        for client in (self.consumer, self.replier, self.producer):
            client.close()


# docs/CLIENT.md: the commands that need what one node cannot give, each with where it is tested
CLIENT_EXCLUDED = {
    "smartgo admin elect-master --broker-name broker-a --broker-id 1":
        "hands the master role to a slave: needs a slave and a failover registry (tests/broker/test_switchover.py)",
    "smartgo admin tx-resume --id 7F0000010000...":
        "needs a transaction the broker gave up on after 15 check-backs (tests/broker/test_transaction_check.py)",
    "smartgo admin mqtt-kick --client dev-42":
        "needs a connected MQTT device; this node serves no MQTT (tests/mqtt/test_operability.py kicks one)",
}
# These ask live clients about themselves (or, request, need a replier): the Application runs from then on.
NEEDS_APPLICATION = re.compile(r"smartgo (admin (consumer-status|consume-directly|client-offsets|producer-connections)"
                               r"|request) ")
# The ids and positions the docs write as placeholders, once the first send has made them real.
FIRST_SEND = "order-42"


@pytest.fixture(scope="module")
def client_node(tmp_path_factory) -> Iterator[Node]:
    """CLIENT.md's SDK programs are unsigned, as written: 127.0.0.1 is white-listed until its
    `acl-white` example replaces that list; the `smartgo` commands sign throughout."""
    acl = readme_acl().replace("globalWhiteRemoteAddresses: []", "globalWhiteRemoteAddresses: ['127.0.0.1']")
    assert acl != readme_acl()
    with running_node(tmp_path_factory.mktemp("client-md"), acl) as node:
        yield node


@pytest.mark.timeout(1200)
def test_client_md_examples_run_and_end(client_node):
    node, apps = client_node, []

    def before(ex: Example) -> None:
        if "7F0000010000..." in ex.text and "7F0000010000..." not in node.placeholders:
            sent = wait_until(lambda: node.admin.query_by_key("Orders", FIRST_SEND), 10, 0.2, "order-42 indexed")[0]
            node.placeholders["7F0000010000..."] = sent.msg_id
            node.placeholders["--queue 3 --offset 17"] = f"--queue {sent.queue_id} --offset {sent.queue_offset}"
        if not apps and NEEDS_APPLICATION.search(ex.text):
            apps.append(Application(node))

    examples = doc_examples(CLIENT_MD)
    assert sum(ex.python for ex in examples) >= 2 and len(examples) > 50, examples
    try:
        failed = run_in_order(node, examples, CLIENT_EXCLUDED, before)
    finally:
        for app in apps:
            app.close()
    assert not failed, f"{len(failed)} of {len(examples)} examples of docs/CLIENT.md failed:\n" + "\n".join(failed)


# README.md: the examples that need more than one running node
README_EXCLUDED = {
    "smartgo mqtt-passwd": "a command named in prose; it reads a password: tests/cli/test_mqtt_passwd.py runs it",
    ".venv/bin/smartgo consume --topic MQTT --expression devices/42/telemetry --from first --count 1":
        "needs a device's MQTT publish first: tests/mqtt/test_readme_mqtt.py runs the block with MQTT on",
    ".venv/bin/smartgo send --topic MQTT --tags devices/42/cmd --body reboot":
        "its MQTT subscriber is in the same block: tests/mqtt/test_readme_mqtt.py runs it",
    "smartgo scrub --store-dir DIR --repair": "checks the store of a stopped node (tests/store/test_damage.py)",
    "smartgo send --delay-ms": "an option named in prose, not a whole command (docs/CLIENT.md's sends run)",
    ".venv/bin/smartgo admin elect-master --broker-name broker-a --broker 127.0.0.1:11911":
        "hands the master role to a slave: needs a slave and a failover registry (tests/broker/test_switchover.py)",
    "smartgo admin consumer-progress --group G":
        "G is the reader's consumer group; docs/CLIENT.md's `consumer-progress --group g1` runs the command",
}


@pytest.fixture(scope="module")
def readme_node(tmp_path_factory) -> Iterator[Node]:
    """The node a bare `python supervisor.py --role master` starts: its store is ~/smartgo/master
    (what a bare `smartgo health` checks), its ACL file the README's."""
    base = tmp_path_factory.mktemp("readme")
    with running_node(base, readme_acl(), base / "home" / "smartgo" / "master") as node:
        yield node


@pytest.mark.timeout(600)
def test_readme_smartgo_examples_run_and_end(readme_node):
    node = readme_node
    node.placeholders["--broker ADDR"] = f"--broker {node.broker}"
    examples = doc_examples(README, spans=True)
    assert len(examples) > 5, examples
    failed = run_in_order(node, examples, README_EXCLUDED)
    assert not failed, f"{len(failed)} of {len(examples)} examples of README.md failed:\n" + "\n".join(failed)
