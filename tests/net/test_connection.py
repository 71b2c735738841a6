"""Connection internals on a fake transport: back-pressure, callbacks, expiry (no sockets)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from smartgo.net.budget import TurnBudget
from smartgo.net.codes import FLAG_RESPONSE
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, Endpoint, EndpointOptions, eager
from smartgo.net.errors import ConnectionClosedError, RemotingTimeoutError
from smartgo.net.frame import FrameDecoder, encode_frame


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.written = bytearray()
        self.writes = 0
        self.closing = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 4242)

    def writelines(self, buffers) -> None:
        self.writes += 1
        self.written += b"".join(bytes(b) for b in buffers)

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


def _connect(server_side: bool) -> tuple[Connection, FakeTransport]:
    options = EndpointOptions(pause_reading_on_backpressure=server_side)
    conn = Connection(Endpoint(options, scan_interval=1.0), dialled=not server_side)
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport


def test_a_server_stops_reading_while_its_writes_back_up(arun) -> None:
    async def main() -> None:
        conn, transport = _connect(server_side=True)
        conn.pause_writing()
        assert transport.calls == ["pause"]
        conn.resume_writing()
        assert transport.calls == ["pause", "resume"]
    arun(main())


def test_a_client_keeps_reading_and_drain_waits(arun) -> None:
    async def main() -> None:
        conn, transport = _connect(server_side=False)
        conn.pause_writing()
        assert transport.calls == []           # never stop reading responses (that would deadlock)
        drained = asyncio.ensure_future(conn.drain())
        await asyncio.sleep(0)
        assert not drained.done()
        conn.resume_writing()
        await asyncio.wait_for(drained, 1)
    arun(main())


def test_connections_of_one_loop_share_the_end_of_iteration_flush(arun) -> None:
    async def main() -> None:
        pairs = [_connect(server_side=True) for _ in range(3)]
        for conn, _ in pairs:
            for code in (20, 21, 22):
                conn.send(RemotingCommand(code, flag=FLAG_RESPONSE))
        assert [t.writes for _, t in pairs] == [1, 1, 1]               # each first reply at once
        gatherer = pairs[0][0]._gatherer
        assert all(c._gatherer is gatherer for c, _ in pairs) and len(gatherer._conns) == 3
        await asyncio.sleep(0)                                          # one callback flushes all three
        assert [t.writes for _, t in pairs] == [2, 2, 2] and not gatherer._conns
        for _, t in pairs:
            assert [c.code for c in FrameDecoder().feed(bytes(t.written))] == [20, 21, 22]
        pairs[0][0].send(RemotingCommand(23, flag=FLAG_RESPONSE))       # a new iteration: at once again
        assert pairs[0][1].writes == 3
    arun(main())


def test_callbacks_get_responses_timeouts_and_close_errors(arun) -> None:
    async def main() -> None:
        conn, transport = _connect(server_side=False)
        results: list[tuple[object, object]] = []

        def callback(response, error):
            results.append((response, error))
            raise RuntimeError("a failing callback is logged, not raised")

        conn.invoke_async(RemotingCommand(10), 5.0, callback)
        conn.invoke_async(RemotingCommand(11), 0.0, callback)
        conn.invoke_async(RemotingCommand(12), 5.0, callback)
        assert len(FrameDecoder().feed(bytes(transport.written))) == 1   # the first goes out at once...
        await asyncio.sleep(0)                                           # ...the rest in one write after
        sent = FrameDecoder().feed(bytes(transport.written))
        assert [c.code for c in sent] == [10, 11, 12]
        conn.data_received(encode_frame(RemotingCommand(0, opaque=sent[0].opaque, flag=FLAG_RESPONSE, remark="ok")))
        conn._expire(asyncio.get_running_loop().time())
        conn.connection_lost(None)
        assert results[0][0].remark == "ok" and results[0][1] is None
        assert isinstance(results[1][1], RemotingTimeoutError) and "code 11" in str(results[1][1])
        assert isinstance(results[2][1], ConnectionClosedError) and "code 12" in str(results[2][1])
        with pytest.raises(ConnectionClosedError):
            conn.invoke_async(RemotingCommand(13), 1.0, callback)
        assert isinstance(conn.invoke(RemotingCommand(14), 1.0).exception(), ConnectionClosedError)
    arun(main())


def _work(seconds: float) -> None:
    """Synchronous work of this many seconds (a pull's): the loop is held, as a processor holds it."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

def test_an_urgent_request_runs_when_the_turn_is_spent(arun) -> None:
    """A consumer catching up keeps every turn's budget spent with its pulls; a send arriving on
    another connection then waited behind them for turns. Codes the budget calls urgent (a net
    actor's sends) run at once; the rest of the other connection's requests still wait."""
    async def main() -> None:
        ran: list[tuple[int, int]] = []             # (code, pulls done before it)

        @eager
        async def work(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
            if cmd.code == 11:
                _work(0.004)                   # a pull costing 4 ms of synchronous work
            ran.append((cmd.code, sum(c == 11 for c, _ in ran)))
            return cmd.make_response(0, "")

        budget = TurnBudget(asyncio.get_running_loop(), limit=0.02, urgent=frozenset({10}))
        endpoint = Endpoint(EndpointOptions(processors={10: work, 11: work, 12: work}, budget=budget),
                            scan_interval=1.0)
        consumer, producer = Connection(endpoint, dialled=False), Connection(endpoint, dialled=False)
        consumer.connection_made(FakeTransport())
        producer.connection_made(FakeTransport())
        consumer.data_received(b"".join(encode_frame(RemotingCommand(11, opaque=n)) for n in range(60)))
        producer.data_received(b"".join(encode_frame(RemotingCommand(code, opaque=code)) for code in (10, 12)))
        sends = [pulls for code, pulls in ran if code == 10]
        assert sends and sends[0] <= 10 and not any(code == 12 for code, _ in ran)   # the send at once; not the rest
        while len(ran) < 62:
            await asyncio.sleep(0.01)
        assert [code for code, _ in ran].count(12) == 1
    arun(main())


def test_requests_of_one_read_wait_for_the_next_turn_once_its_budget_is_spent(arun) -> None:
    """A read carrying many requests (a consumer's pulls of 1,024 queues) runs them within the
    loop turn's budget and the rest in later turns, reading paused meanwhile: the loop, its
    timers and other connections get their turns. Every request is answered, in order."""
    async def main() -> None:
        turns = 0
        seen: list[int] = []            # the turn each request ran in

        @eager
        async def slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
            _work(0.004)           # a pull costing 4 ms of synchronous work
            seen.append(turns)
            return cmd.make_response(0, cmd.ext_fields["n"])

        async def ticker() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        cell = memoryview(bytearray(8)).cast("q")
        budget = TurnBudget(asyncio.get_running_loop(), limit=0.02, cell=cell)
        conn = Connection(Endpoint(EndpointOptions(processors={11: slow}, budget=budget), scan_interval=1.0),
                          dialled=False)
        transport = FakeTransport()
        conn.connection_made(transport)
        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        conn.data_received(b"".join(encode_frame(RemotingCommand(11, opaque=n, ext_fields={"n": str(n)}))
                                    for n in range(60)))
        assert len(seen) < 60 and transport.calls == ["pause"]         # the rest waits, reading paused
        while len(seen) < 60:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        ticking.cancel()
        per_turn = Counter(seen)
        assert len(per_turn) >= 6 and max(per_turn.values()) <= 10, per_turn   # ~5 of 4 ms in a 20 ms turn
        assert [c.remark for c in FrameDecoder().feed(bytes(transport.written))] == [str(n) for n in range(60)]
        assert transport.calls[-1] == "resume" and cell[0] == 60
    arun(main())
