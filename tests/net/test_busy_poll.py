"""Busy polling (smartgo.net.busy_poll): the window opens on I/O, keeps the loop turning without
sleeping, and closes by itself; a server and a client that poll still answer correctly."""

from __future__ import annotations

import asyncio

import pytest

from smartgo.net.busy_poll import BusyPoller, poller_for
from smartgo.net.client import RemotingClient
from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import eager
from smartgo.net.server import RemotingServer
from tests.support.waits import async_wait_until

HOST = "127.0.0.1"


class FakeClock:
    def __init__(self) -> None:
        self.ns = 1_000_000

    def __call__(self) -> int:
        return self.ns


def test_window_opens_extends_and_closes(arun) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        poller = BusyPoller(asyncio.get_running_loop(), 100, clock)
        assert not poller.spinning
        poller.kick()
        for _ in range(5):
            await asyncio.sleep(0)
        assert poller.spinning and poller.turns >= 4      # one turn per loop iteration, no sleep
        clock.ns += 90_000
        poller.kick()                                     # 90 µs in: the window restarts
        clock.ns += 90_000
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert poller.spinning
        clock.ns += 20_000                                # 110 µs after the last kick
        turns = poller.turns
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not poller.spinning
        await asyncio.sleep(0)
        assert poller.turns == turns                      # nothing keeps the loop busy any more
    arun(scenario())


def test_one_poller_per_loop_widened_never_narrowed(arun) -> None:
    async def scenario() -> None:
        assert poller_for(0) is None
        p = poller_for(50)
        assert p is poller_for(20) and p.window_ns == 50_000
        assert poller_for(200) is p and p.window_ns == 200_000
    arun(scenario())
    arun(scenario())                                      # a new loop gets its own poller


@pytest.mark.parametrize("poll_us", [0, 200])
def test_polling_server_and_client_answer_correctly(arun, poll_us) -> None:
    @eager
    async def echo(conn, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(ResponseCode.SUCCESS, ext_fields=req.ext_fields, body=req.body)

    async def scenario() -> None:
        async with RemotingServer(HOST, [0], {10: echo}, busy_poll_us=poll_us) as server, \
                RemotingClient(busy_poll_us=poll_us) as client:
            addr = f"{HOST}:{server.ports[0]}"
            for i in range(200):
                r = await client.invoke(addr, RemotingCommand(10, ext_fields={"i": str(i)}, body=b"%d" % i), 5)
                assert r.code == ResponseCode.SUCCESS and r.ext_fields["i"] == str(i) and r.body == b"%d" % i
            poller = poller_for(poll_us)
            if poll_us:
                assert poller.turns > 0                   # server and client share this loop's poller
                await async_wait_until(lambda: not poller.spinning, timeout=5, message="the window to close")
            else:
                assert poller is None
    arun(scenario())
