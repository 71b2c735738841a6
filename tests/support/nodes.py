"""Test harness for whole nodes: start a supervisor process, read its health, reap everything.

Used by tests/actors and benchmarks/bench_restart.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from smartgo.actors.board import Board, BoardError
from smartgo.actors.health import node_health
from tests.support.waits import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
SUPERVISOR = ROOT / "supervisor.py"

# Fast supervision for tests: quick heartbeats, short backoff.
FAST = {"heartbeat_interval": 0.05, "restart_backoff": 0.02, "restart_backoff_max": 0.2}
#: A test node serves MQTT only when its test asks: the default ports (1883, 8083) are fixed.
NO_MQTT = {"mqtt_port": 0, "mqtt_ws_port": 0}

#: The store dir of every node started in this process, in order: a failed test's report shows
#: the warnings of the nodes it started (tests/conftest.py), all a CI run leaves to go on.
STARTED: list[Path] = []


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def toml_dumps(settings: dict) -> str:
    lines = [f"{k} = {toml_value(v)}" for k, v in settings.items() if k != "actor"]
    for table in settings.get("actor", []):
        lines.append("\n[[actor]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def registry_request(port: int, opaque: int = 7, timeout: float = 5.0) -> dict:
    """One GET_ROUTEINFO_BY_TOPIC (105) as a raw JSON RocketMQ frame; the response header."""
    header = json.dumps({"code": 105, "extFields": {"topic": "NoSuchTopic"}, "flag": 0, "language": "JAVA",
                         "opaque": opaque, "serializeTypeCurrentRPC": "JSON", "version": 401}).encode()
    frame = struct.pack(">ii", 4 + len(header), len(header)) + header
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(frame)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("registry closed the connection")
            buf += chunk
    hlen = struct.unpack(">i", buf[4:8])[0] & 0xFFFFFF
    return json.loads(buf[8:8 + hlen])


@dataclass
class Node:
    proc: subprocess.Popen
    store: Path
    port: int
    stderr: Path
    seen: dict[int, psutil.Process] = field(default_factory=dict)

    def __post_init__(self) -> None:
        STARTED.append(self.store)

    def health(self) -> dict | None:
        """The node's health report, or None while there is no readable board."""
        try:
            board = Board.open(self.store / "run" / "board", writable=False)
        except BoardError:
            return None
        try:
            report = node_health(board)
        finally:
            board.close()
        self.remember()
        return report

    def actor(self, name: str) -> dict:
        report = self.health()
        assert report is not None, "no board"
        return next(a for a in report["actors"] if a["name"] == name)

    def wait_healthy(self, timeout: float = 20.0, check: Callable[[dict], bool] = lambda report: True,
                     give_up: Callable[[], bool] = lambda: False) -> dict:
        """The health report once healthy (and check(report)); AssertionError after timeout, or
        as soon as give_up() says the node never will be."""
        def healthy() -> dict | None:
            if (r := self.health()) is not None and r["healthy"] and check(r):
                return r
            if give_up():
                raise AssertionError(f"the node gave up starting ({self.last_verdict()})")
            return None
        return wait_until(healthy, timeout=timeout, interval=0.02, message=f"healthy node ({self.last_verdict()})")

    def last_verdict(self) -> str:
        r = self.health()
        return "no board" if r is None else r["verdict"]

    def remember(self) -> None:
        """Note every process of the node now, so the finalizer can reap orphans too."""
        try:
            for p in [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass

    def descendants(self) -> list[psutil.Process]:
        self.remember()
        return [p for pid, p in self.seen.items() if pid != self.proc.pid]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        self.remember()
        os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """kill -9 of the whole node: every process at once, the supervisor included (a SIGKILL to
        the supervisor alone lets its actors stop cleanly when their control pipes close). All are
        stopped (SIGSTOP) before any is killed: an actor still running when the supervisor died
        would take its pipe's end for a stop and shut down cleanly (a CI run's flush actor removed
        the abort file that way), and a supervisor still running would restart a killed actor."""
        self.remember()
        supervisor = psutil.Process(self.proc.pid)
        supervisor.send_signal(signal.SIGSTOP)
        procs = [supervisor, *supervisor.children(recursive=True)]
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in procs:
                try:
                    p.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass
        self.proc.wait(10)

    def log_text(self) -> str:
        return log_text(self.store)

    def logged(self, *texts: str, timeout: float = 10.0) -> str:
        """The node log once it holds every one of texts: an actor's records reach it through the
        supervisor, so a line may land after the answer or event that followed it."""
        def present() -> str | None:
            log = self.log_text()
            return log if all(t in log for t in texts) else None
        return wait_until(present, timeout=timeout, message=f"the node log to show {texts}")

    def reap(self) -> None:
        """Kill the node and every process it had. The supervisor is stopped first, so no actor it
        restarts between the listing and the kill escapes (one did, still writing its store)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)
        self.remember()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        left = [p for p in self.seen.values() if running(p)]
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        wait_gone(left, 5)          # a zombie counts as gone: whoever inherited it reaps it


def log_text(store: Path) -> str:
    """The node log of the node on store ("" before it wrote one)."""
    path = store / "logs" / "node.log"
    return path.read_text(errors="replace") if path.exists() else ""


def warnings_in(store: Path, last: int = 30) -> list[str]:
    """The last warnings and errors in the node log of the node on store."""
    return [line for line in log_text(store).splitlines()
            if " WARNING " in line or " ERROR " in line or " CRITICAL " in line][-last:]


def launch_node(base: Path, settings: dict | Callable[[], dict] | None = None, role: str = "registry",
                launcher: Path = SUPERVISOR, wait: bool = True, fast: bool = True) -> Node:
    """Start `launcher --role role` on a free loopback port with settings in a TOML file.

    fast: apply FAST (quick heartbeats and backoff) under `settings`; False keeps the defaults.
    base becomes the store dir; the config file and the supervisor's stderr go next to it. When a
    port picked free was taken before the node bound it, it starts again (at most 3 times) on
    another port, with settings called again if it is a function (it picks ports of its own).
    """
    attempts = 3
    while True:         # fresh ports when one picked free was taken before the node bound it
        try:
            return _launch(base, settings() if callable(settings) else settings, role, launcher, wait, fast)
        except NodeStartError as exc:
            attempts -= 1
            if not exc.port_taken or not attempts:
                raise
            shutil.rmtree(base)


def _launch(base: Path, settings: dict | None, role: str, launcher: Path, wait: bool, fast: bool) -> Node:
    base.mkdir(parents=True)
    config = base.with_name(base.name + ".toml")
    config.write_text(toml_dumps({**NO_MQTT, **(FAST if fast else {}), **(settings or {})}))
    port = free_port()
    err = base.with_name(base.name + ".stderr")
    cmd = [sys.executable, str(launcher), "--role", role, "--store-dir", str(base), "--config", str(config),
           "--listen-host", "127.0.0.1", "--listen-port", str(port)]
    with open(err, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, cwd=ROOT)
    node = Node(proc, base, port, err)
    if wait:
        try:
            node.wait_healthy(give_up=lambda: proc.poll() is not None or _port_taken(err))
        except AssertionError as exc:
            node.reap()
            log = err.read_text(errors="replace")
            first = [line for line in log.splitlines() if " ERROR " in line or " CRITICAL " in line][:3]
            raise NodeStartError("\n".join([str(exc), "first errors in the node's log:", *first, "its end:",
                                             log[-1500:]]), port_taken=_PORT_TAKEN in log.lower()) from None
        except BaseException:
            node.reap()
            raise
    return node


_PORT_TAKEN = "address already in use"


def _port_taken(log: Path) -> bool:
    return _PORT_TAKEN in log.read_text(errors="replace").lower()


class NodeStartError(AssertionError):
    """A test node did not become healthy; the message carries its first errors and the end of
    its log. port_taken: a port picked free was taken before the node bound it (free_port() can
    only pick a port, not hold it)."""

    def __init__(self, message: str, port_taken: bool) -> None:
        super().__init__(message)
        self.port_taken = port_taken


def events(path: Path) -> list[tuple[str, str]]:
    """(what, actor) pairs a RecorderActor wrote."""
    if not path.exists():
        return []
    return [tuple(line.split()[:2]) for line in path.read_text().splitlines()]  # type: ignore[misc]  # 2 words a line


def running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(procs: list[psutil.Process], timeout: float) -> None:
    wait_until(lambda: not any(running(p) for p in procs), timeout=timeout,
               message="every child process to exit")
