"""Remoting test helpers: run every async test on both uvloop and the standard loop."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from smartgo.net.loop import run, uvloop_available
from tests.support.waits import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
LOOPS = ["asyncio"] + (["uvloop"] if uvloop_available() else [])


@pytest.fixture(params=LOOPS)
def arun(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """arun(coro) runs coro to completion on a fresh loop of the parametrised kind."""
    prefer = request.param == "uvloop"
    return lambda coro: run(coro, prefer_uvloop=prefer)


@pytest.fixture
def echo_server() -> Iterator[tuple[subprocess.Popen, int]]:
    """A `python -m smartgo.net.echo` process with a 1 MiB frame limit: (process, port)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "smartgo.net.echo", "--port", str(port),
                             "--max-frame", str(1 << 20)], cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield proc, port
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module", params=["c", "python"])
def each_codec(request: pytest.FixtureRequest) -> Iterator[str]:
    """The module's tests once on the C codec and once on the pure-Python one."""
    from smartgo.net import frame
    frame.use_codec(request.param)
    try:
        yield request.param
    finally:
        frame.use_codec("c")
