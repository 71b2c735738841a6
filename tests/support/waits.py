"""Helpers shared by tests and benchmarks: free loopback ports, deadline polling, benchmark runs, certificates."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago on loopback (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def held_port_outside_ephemeral_range(host: str = LOOPBACK) -> socket.socket:
    """A listening socket on a port below the kernel's ephemeral range, for a test that holds a
    port, lets it go and expects a service to bind it next: no connect() and no bind to port 0
    (free_port, every other test's nodes) can take such a port in between, as one of the
    ephemeral range can."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(max(1024, low - 12_000), low), 200):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((host, port))
        except OSError:
            s.close()
            continue
        s.listen()
        return s
    raise OSError(f"no free port below the ephemeral range (from {low})")


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """n distinct free ports, held open together so the kernel cannot hand out one twice."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_until(predicate: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.01,
               message: str = "condition") -> T:
    """Poll predicate until it returns a truthy value or the deadline passes (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


async def async_wait_until(predicate: Callable[[], T | Awaitable[T]], timeout: float = 10.0,
                           interval: float = 0.01, message: str = "condition") -> T:
    """The asyncio twin of wait_until; predicate may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]  # awaited above, so a T
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)


def wait_for_port(port: int, host: str = LOOPBACK, timeout: float = 15.0) -> None:
    """Block until something accepts TCP connections on host:port."""
    def accepting() -> bool:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            return False
    wait_until(accepting, timeout=timeout, interval=0.05, message=f"{host}:{port} to accept")


def steady_disk_usage(path: Path, ratio: float = 0.1) -> str:
    """A `disk_usage_file` holding `ratio`, for test nodes: the host's disk must not decide a
    test. Over disk_force_clean_ratio (85 %) the cleanup actor deletes the oldest CommitLog files,
    which once failed the kill -9 test on a CI disk that others had filled."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{ratio}\n")
    return str(path)


def run_benchmark(script: str, *args: str, timeout: float = 170.0, tmpdir: Path | None = None) -> dict:
    """`benchmarks/<script> --quick --json [args]` from the checkout: its figures (the JSON object
    on the last line). For the benchmark smoke tests: a benchmark that breaks fails the suite.
    tmpdir: the benchmark's TMPDIR (to check that it leaves nothing behind)."""
    root = Path(__file__).resolve().parents[2]
    env = None if tmpdir is None else {**os.environ, "TMPDIR": str(tmpdir)}
    out = subprocess.run([sys.executable, str(root / "benchmarks" / script), "--quick", "--json", *args],
                         capture_output=True, text=True, timeout=timeout, cwd=root, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def self_signed_cert(folder: Path, name: str) -> tuple[str, str]:
    """A self-signed certificate and its key (PEM files in folder), made with openssl as an operator
    makes one: for TLS tests."""
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def end_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, and SIGKILL if it is still there after timeout: a peer broker a test or benchmark started."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
