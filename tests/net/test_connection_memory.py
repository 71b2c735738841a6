"""What an idle remoting connection holds: a node keeps 100,000 of them (clients heartbeating every
30 s), so a connection allocates its request table, task sets, backlog, write list, drain waiters
and close future only when it uses them, and gives them back when it is idle again; and the
housekeeping tick visits only the connections with requests outstanding (the idle ones wait in a
timing wheel)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest

from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection
from smartgo.net.errors import RemotingTimeoutError
from smartgo.net.frame import encode_frame
from smartgo.net.server import RemotingServer

HOST = "127.0.0.1"
CONNECTIONS = 400
TRACED = ("smartgo/net/connection.py", "smartgo/net/frame.py")


async def _answered(conn: Connection, req: RemotingCommand) -> RemotingCommand:
    await asyncio.sleep(0)              # suspends: the request runs as a task, as a forwarded one does
    return req.make_response(ResponseCode.SUCCESS)


def _held_by_connections(snapshot: tracemalloc.Snapshot) -> int:
    return sum(stat.size for stat in snapshot.statistics("filename")
               if stat.traceback[0].filename.endswith(TRACED))


async def _clients(port: int, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    clients = [await asyncio.open_connection(HOST, port) for _ in range(count)]
    for opaque, (_, writer) in enumerate(clients, 1):
        writer.write(encode_frame(RemotingCommand(34, opaque=opaque, body=b'{"clientID":"c"}')))
    for reader, _ in clients:
        length = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 10), "big")
        await reader.readexactly(length)
    return clients


@pytest.mark.timeout(60)
def test_an_idle_connection_holds_no_containers_of_its_own(arun) -> None:
    async def main() -> None:
        async with RemotingServer(HOST, [0], {34: _answered}) as server:
            gc.collect()
            tracemalloc.start()
            try:
                before = _held_by_connections(tracemalloc.take_snapshot())
                clients = await _clients(server.port, CONNECTIONS)
                assert len(server.connections) == CONNECTIONS
                gc.collect()
                per_connection = (_held_by_connections(tracemalloc.take_snapshot()) - before) / CONNECTIONS
            finally:
                tracemalloc.stop()
            for _, writer in clients:
                writer.close()
        # the Connection itself (slots) and its frame decoder; each container it used is gone again
        assert per_connection < 400, f"{per_connection:.0f} B per idle connection"
    arun(main())


@pytest.mark.timeout(60)
def test_only_connections_awaiting_answers_are_visited_and_their_requests_time_out(arun) -> None:
    async def main() -> None:
        async with RemotingServer(HOST, [0], {34: _answered}, idle_timeout=60) as server:
            clients = await _clients(server.port, 20)
            assert server.waiting == set()
            conn = next(iter(server.connections.values()))
            asking = conn.invoke(RemotingCommand(40), timeout=0.3)    # the client never answers
            assert server.waiting == {conn}
            with pytest.raises(RemotingTimeoutError, match="within 0.3 s"):
                await asyncio.wait_for(asking, 5)
            assert server.waiting == set() and conn.pending_count == 0 and not conn.closed
            for _, writer in clients:
                writer.close()
    arun(main())
