"""RemotingServer and RemotingClient end to end on loopback, on both event loops."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time

import pytest

from smartgo.net.client import BlockingRemotingClient, RemotingClient
from smartgo.net.codes import (FLAG_COMPRESSED, FLAG_ONEWAY, FLAG_RESPONSE, FLAG_SMARTGO, RequestCode,
                               ResponseCode, SerializeType)
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, ConnectionEvent, eager
from smartgo.net.errors import ConnectionClosedError, RemotingConnectError, RemotingTimeoutError
from smartgo.net.frame import FrameDecoder, encode_frame
from smartgo.net.loop import wait_within
from smartgo.net.server import RemotingServer
from tests.support.waits import async_wait_until, free_port

HOST = "127.0.0.1"


async def echo(conn: Connection, req: RemotingCommand) -> RemotingCommand:
    return req.make_response(ResponseCode.SUCCESS, ext_fields=req.ext_fields, body=req.body)


class Recorder:
    """A connection listener that keeps (event, connection id, reason) in order."""

    def __init__(self) -> None:
        self.events: list[tuple[ConnectionEvent, int, str | None]] = []

    def __call__(self, event: ConnectionEvent, conn: Connection, reason: str | None) -> None:
        self.events.append((event, conn.id, reason))

    def kinds(self) -> list[ConnectionEvent]:
        return [e for e, _, _ in self.events]


def _addr(server: RemotingServer, i: int = 0) -> str:
    return f"{HOST}:{server.ports[i]}"


def test_request_response_error_paths(arun) -> None:
    async def fails(conn, req):
        raise RuntimeError("disk on fire")

    async def needs_topic(conn, req):
        req.ext_str("topic")

    async def main() -> None:
        async with RemotingServer(HOST, [0], {10: echo, 11: fails, 12: needs_topic}) as server, \
                RemotingClient() as client:
            ok = await client.invoke(_addr(server), RemotingCommand(10, ext_fields={"k": "v"}, body=b"payload"))
            assert (ok.code, ok.ext_fields, ok.body, ok.is_response) == (0, {"k": "v"}, b"payload", True)
            unknown = await client.invoke(_addr(server), RemotingCommand(777))
            assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            assert unknown.remark == " request type 777 not supported"
            boom = await client.invoke(_addr(server), RemotingCommand(11))
            assert boom.code == ResponseCode.SYSTEM_ERROR and "RuntimeError: disk on fire" in boom.remark
            missing = await client.invoke(_addr(server), RemotingCommand(12))
            assert missing.code == ResponseCode.SYSTEM_ERROR and missing.remark == "the custom field topic is null"
    arun(main())


def test_slow_processor_does_not_block_the_connection(arun) -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def long_poll(conn, req):
            await release.wait()
            return req.make_response(ResponseCode.SUCCESS, remark="late")

        async with RemotingServer(HOST, [0], {11: long_poll, 10: echo}) as server, RemotingClient() as client:
            conn = await client.connection(_addr(server))
            slow = conn.invoke(RemotingCommand(11), 5)
            for i in range(20):
                fast = await conn.invoke(RemotingCommand(10, body=b"%d" % i), 5)
                assert fast.body == b"%d" % i
            assert not slow.done()
            release.set()
            assert (await slow).remark == "late"
    arun(main())


def test_eager_processor_that_suspends_continues_in_a_task(arun) -> None:
    async def main() -> None:
        gate = asyncio.Event()
        seen: list[bool] = []

        @eager
        async def sometimes_waits(conn, req):
            if req.ext_bool("wait"):
                await gate.wait()
                seen.append(asyncio.current_task() is not None)
                await asyncio.sleep(0)
            if req.ext_bool("fail", False):
                raise ValueError("late failure")
            return req.make_response(ResponseCode.SUCCESS, remark=req.ext_str("wait"))

        async with RemotingServer(HOST, [0], {1: sometimes_waits}) as server, RemotingClient() as client:
            conn = await client.connection(_addr(server))
            waiting = conn.invoke(RemotingCommand(1, ext_fields={"wait": "true"}), 5)
            failing = conn.invoke(RemotingCommand(1, ext_fields={"wait": "true", "fail": "true"}), 5)
            assert (await conn.invoke(RemotingCommand(1, ext_fields={"wait": "false"}), 5)).remark == "false"
            gate.set()
            assert (await waiting).remark == "true" and seen[0]
            failed = await failing
            assert failed.code == ResponseCode.SYSTEM_ERROR and "late failure" in failed.remark
            immediate_error = await conn.invoke(RemotingCommand(1), 5)
            assert immediate_error.remark == "the custom field wait is null"
    arun(main())



def test_wait_within_works_in_an_eager_first_step(arun) -> None:
    """An eager processor's first step has no current task, where Python 3.12's wait_for raises
    "Timeout should be used inside a task" (every send that went through the broker actor failed
    so there). wait_within gives the answer, times out with TimeoutError, and cancels what it waited
    for either way."""
    async def main() -> None:
        answers: dict[str, asyncio.Future] = {}
        inner: list[asyncio.Future] = []

        @eager
        async def ask(conn, req):
            fut = answers[req.ext_str("k")] = asyncio.get_running_loop().create_future()
            inner.append(fut)
            try:
                got = await wait_within(fut, float(req.ext_str("timeout")))
            except TimeoutError as exc:
                return req.make_response(ResponseCode.SYSTEM_BUSY, remark=str(exc))
            return req.make_response(ResponseCode.SUCCESS, remark=got)

        async with RemotingServer(HOST, [0], {1: ask}) as server, RemotingClient() as client:
            conn = await client.connection(_addr(server))
            answered = conn.invoke(RemotingCommand(1, ext_fields={"k": "a", "timeout": "5"}), 5)
            await async_wait_until(lambda: "a" in answers)
            answers["a"].set_result("the answer")
            assert ((await answered).code, (await answered).remark) == (ResponseCode.SUCCESS, "the answer")
            late = await conn.invoke(RemotingCommand(1, ext_fields={"k": "b", "timeout": "0.05"}), 5)
            assert late.code == ResponseCode.SYSTEM_BUSY and "within 0.05 s" in late.remark
            assert answers["b"].cancelled()
            abandoned = conn.invoke(RemotingCommand(1, ext_fields={"k": "c", "timeout": "30"}), 30)
            await async_wait_until(lambda: "c" in answers)
            conn.close("the caller goes away")
            with pytest.raises(ConnectionClosedError):
                await abandoned
            await async_wait_until(lambda: answers["c"].cancelled(), 5)     # its two-way task was cancelled
    arun(main())


def test_wait_within_keeps_a_cancel_that_arrives_as_what_it_waits_for_completes(arun) -> None:
    """Python 3.11's asyncio.wait_for returns the result instead (gh-86296): a loop around it runs
    on, and whoever cancelled it to stop it waits for ever (a consumer's close hung so)."""
    async def main() -> None:
        event, rounds = asyncio.Event(), []

        async def loop() -> None:
            while True:
                await wait_within(event.wait(), 30)
                event.clear()
                rounds.append(1)
        task = asyncio.get_running_loop().create_task(loop())
        await asyncio.sleep(0)          # parked in event.wait()
        event.set()
        await asyncio.sleep(0)          # event.wait() is done; the loop's wake-up is due, not run yet
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        assert done and task.cancelled() and rounds == []
    arun(main())


def test_several_ports_share_one_processor_table(arun) -> None:
    async def main() -> None:
        async with RemotingServer(HOST, [0, 0], {10: echo}) as server, RemotingClient() as client:
            assert len(set(server.ports)) == 2
            for i in range(2):
                assert (await client.invoke(_addr(server, i), RemotingCommand(10, body=b"p"))).body == b"p"
    arun(main())


def test_reuse_port_lets_two_servers_share_a_port(arun) -> None:
    async def main() -> None:
        port = free_port()
        first = RemotingServer(HOST, [port], {10: echo}, reuse_port=True)
        second = RemotingServer(HOST, [port], {10: echo}, reuse_port=True)
        await first.start()
        try:
            await second.start()
            async with RemotingClient() as client:
                assert (await client.invoke(f"{HOST}:{port}", RemotingCommand(10, body=b"x"))).body == b"x"
            await second.stop()
            exclusive = RemotingServer(HOST, [port], {10: echo})
            with pytest.raises(OSError):
                await exclusive.start()
        finally:
            await first.stop()
    arun(main())


def test_oneway_gets_no_reply_and_server_can_call_the_client(arun) -> None:
    async def main() -> None:
        got_oneway = asyncio.Event()
        notified = asyncio.Event()

        async def oneway(conn, req):
            got_oneway.set()
            return req.make_response(ResponseCode.SUCCESS)   # must be dropped: the request is oneway

        async def ask_client(conn, req):
            conn.invoke_oneway(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                               ext_fields={"consumerGroup": "G"}))
            answer = await conn.invoke(RemotingCommand(RequestCode.GET_CONSUMER_RUNNING_INFO), 3)
            return req.make_response(ResponseCode.SUCCESS, body=answer.body)

        async def notify(conn, req):
            assert req.is_oneway and req.ext_str("consumerGroup") == "G"
            notified.set()

        async def running_info(conn, req):
            return req.make_response(ResponseCode.SUCCESS, body=b"client-info")

        async with RemotingServer(HOST, [0], {15: oneway, 1: ask_client}) as server, RemotingClient(
                {RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: notify,
                 RequestCode.GET_CONSUMER_RUNNING_INFO: running_info}) as client:
            await client.invoke_oneway(_addr(server), RemotingCommand(15))
            await asyncio.wait_for(got_oneway.wait(), 5)
            reply = await client.invoke(_addr(server), RemotingCommand(1))
            assert reply.body == b"client-info"
            await asyncio.wait_for(notified.wait(), 5)
            conn = await client.connection(_addr(server))
            assert conn.pending_count == 0
    arun(main())


def test_timeouts_and_close_fail_pending_requests(arun) -> None:
    async def main() -> None:
        async def never(conn, req):
            await asyncio.Event().wait()

        async with RemotingServer(HOST, [0], {1: never, 10: echo}) as server, \
                RemotingClient(scan_interval=0.02) as client:
            addr = _addr(server)
            start = time.monotonic()
            with pytest.raises(RemotingTimeoutError, match="within 0.2 s"):
                await client.invoke(addr, RemotingCommand(1), timeout=0.2)
            assert 0.15 <= time.monotonic() - start < 2.0
            conn = await client.connection(addr)
            assert conn.pending_count == 0
            waiting = [conn.invoke(RemotingCommand(1), 30) for _ in range(3)]
            # the timed-out request is still being processed on the server: 1 + 3 in flight
            await async_wait_until(lambda: sum(c.inflight_count for c in server.connections.values()) == 4)
            for server_conn in list(server.connections.values()):
                server_conn.close("test closes it")
            results = await asyncio.gather(*waiting, return_exceptions=True)
            assert all(isinstance(r, ConnectionClosedError) for r in results)
            with pytest.raises(ConnectionClosedError):
                conn.invoke_oneway(RemotingCommand(10))
            assert (await client.invoke(addr, RemotingCommand(10, body=b"again"))).body == b"again"
            assert (await client.connection(addr)) is not conn
    arun(main())



def test_a_closed_connection_cancels_two_way_work_but_finishes_oneway_work(arun) -> None:
    """The peer of a oneway request expects no answer, so its going away does not undo the
    request (4.x's processor threads never look at the channel); a two-way request's answer has
    nowhere to go, so its work stops."""
    async def main() -> None:
        release = asyncio.Event()
        ended: dict[bool, str] = {}

        async def slow(conn, req):
            try:
                await release.wait()
                ended[req.is_oneway] = "finished"
            except asyncio.CancelledError:
                ended[req.is_oneway] = "cancelled"
                raise

        async with RemotingServer(HOST, [0], {1: slow}) as server, RemotingClient() as client:
            addr = _addr(server)
            await client.invoke_oneway(addr, RemotingCommand(1))
            two_way = asyncio.ensure_future(client.invoke(addr, RemotingCommand(1), 30))
            await async_wait_until(lambda: sum(c.inflight_count for c in server.connections.values()) == 2)
            await client.close()
            with pytest.raises(ConnectionClosedError):
                await two_way
            await async_wait_until(lambda: ended.get(False), 5)
            release.set()
            await async_wait_until(lambda: ended.get(True), 5)
        assert ended == {False: "cancelled", True: "finished"}
    arun(main())

def test_concurrent_first_calls_share_one_dial_and_connect_errors_are_clear(arun) -> None:
    async def main() -> None:
        events = Recorder()
        async with RemotingServer(HOST, [0], {10: echo}, listeners=[events]) as server, RemotingClient() as client:
            replies = await asyncio.gather(*(client.invoke(_addr(server), RemotingCommand(10, body=b"%d" % i))
                                             for i in range(50)))
            assert [r.body for r in replies] == [b"%d" % i for i in range(50)]
            assert events.kinds() == [ConnectionEvent.ACTIVE]
            with pytest.raises(RemotingConnectError, match="failed"):
                await client.invoke(f"{HOST}:{free_port()}", RemotingCommand(10))
            with pytest.raises(ValueError):
                await client.invoke("no-port", RemotingCommand(10))
    arun(main())


def test_connection_events(arun) -> None:
    async def main() -> None:
        server_events, client_events = Recorder(), Recorder()
        async with RemotingServer(HOST, [0], {10: echo}, listeners=[server_events], idle_timeout=0.3) as server:
            client = RemotingClient(listeners=[client_events])
            await client.invoke(_addr(server), RemotingCommand(10))
            await client.close()           # the client closes: CLOSED here, DISCONNECT on the server
            await async_wait_until(lambda: len(server_events.events) == 2)
            assert server_events.kinds() == [ConnectionEvent.ACTIVE, ConnectionEvent.DISCONNECT]
            assert client_events.kinds() == [ConnectionEvent.CONNECT, ConnectionEvent.CLOSED]

            server_events.events.clear()
            client_events.events.clear()
            client = RemotingClient(listeners=[client_events])
            await client.invoke(_addr(server), RemotingCommand(10))
            await async_wait_until(lambda: ConnectionEvent.CLOSED in server_events.kinds(), timeout=5)
            assert server_events.kinds() == [ConnectionEvent.ACTIVE, ConnectionEvent.IDLE, ConnectionEvent.CLOSED]
            assert "idle" in (server_events.events[-1][2] or "")
            await async_wait_until(lambda: ConnectionEvent.DISCONNECT in client_events.kinds())
            await client.close()

            server_events.events.clear()
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(struct.pack(">I", 0x7FFFFFFF))
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
            await async_wait_until(lambda: ConnectionEvent.CLOSED in server_events.kinds())
            assert server_events.kinds() == [ConnectionEvent.ACTIVE, ConnectionEvent.ERROR, ConnectionEvent.CLOSED]
            assert "exceeds the limit" in (server_events.events[1][2] or "")
    arun(main())


def test_inflight_limit_pauses_reading(arun) -> None:
    async def main() -> None:
        gate = asyncio.Event()
        running = 0
        peak = 0

        async def slow(conn, req):
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await gate.wait()
            running -= 1
            return req.make_response(ResponseCode.SUCCESS)

        async with RemotingServer(HOST, [0], {1: slow}, max_inflight=4) as server, RemotingClient() as client:
            conn = await client.connection(_addr(server))
            futures = [conn.invoke(RemotingCommand(1), 10) for _ in range(40)]
            await async_wait_until(lambda: running == 4)
            await asyncio.sleep(0.1)
            assert peak == 4
            gate.set()
            assert all(r.code == 0 for r in await asyncio.gather(*futures))
            assert peak <= 4
    arun(main())


def test_replies_are_batched_into_few_writes(arun) -> None:
    """100 pipelined requests in one read: replies leave in batches of 64 buffers, not one by one."""
    async def main() -> None:
        async with RemotingServer(HOST, [0], {10: eager(echo)}) as server:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            await async_wait_until(lambda: len(server.connections) == 1)
            conn = next(iter(server.connections.values()))
            transport = conn._transport
            writes = []
            real_writelines = transport.writelines

            def counting(buffers):
                writes.append(len(buffers))
                real_writelines(buffers)
            conn._transport = type("Spy", (), {"writelines": staticmethod(counting),
                                               "__getattr__": lambda s, n: getattr(transport, n)})()
            batch = b"".join(encode_frame(RemotingCommand(10, opaque=i, body=b"b")) for i in range(100))
            writer.write(batch)
            decoder, replies = FrameDecoder(), []
            while len(replies) < 100:
                replies += decoder.feed(await asyncio.wait_for(reader.read(65536), 5))
            assert sorted(r.opaque for r in replies) == list(range(100))
            assert len(writes) <= 10 and sum(writes) == 200 and max(writes) > 1
            writer.close()
    arun(main())


def _raw_exchange(port: int, frame: bytes, expect: int = 1, quiet: float = 0.2) -> list[RemotingCommand]:
    """Send bytes on a plain socket; collect replies until `expect` arrived and `quiet` s pass."""
    decoder, out = FrameDecoder(), []
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.sendall(frame)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            sock.settimeout(quiet if len(out) >= expect else 5)
            try:
                chunk = sock.recv(1 << 20)
            except socket.timeout:
                break
            if not chunk:
                break
            out += decoder.feed(chunk)
    return out


def test_wire_details_for_foreign_and_smartgo_peers(arun) -> None:
    """A foreign client sees only RocketMQ's own encodings; a SmartGo peer gets msgpack/compression."""
    async def main() -> None:
        big = b"compress me " * 20_000
        types_seen: list[int] = []

        async def record(conn, req):
            types_seen.append(req.serialize_type)
            return await echo(conn, req)

        async with RemotingServer(HOST, [0], {10: record, 15: echo}, compress_threshold=4096) as server:
            port = server.port
            loop = asyncio.get_running_loop()
            foreign = await loop.run_in_executor(None, _raw_exchange, port, b"".join([
                encode_frame(RemotingCommand(10, opaque=1, body=big)),
                encode_frame(RemotingCommand(15, opaque=2, flag=FLAG_ONEWAY)),
                encode_frame(RemotingCommand(999, opaque=3, flag=FLAG_ONEWAY)),
                encode_frame(RemotingCommand(10, opaque=4, serialize_type=SerializeType.ROCKETMQ))]), 2)
            assert [(r.opaque, r.flag, r.serialize_type) for r in foreign] == [
                (1, FLAG_RESPONSE, SerializeType.JSON), (4, FLAG_RESPONSE, SerializeType.ROCKETMQ)]
            assert foreign[0].body == big
            smartgo = encode_frame(RemotingCommand(10, opaque=5, flag=FLAG_SMARTGO, body=big))
            raw = await loop.run_in_executor(None, _raw_wire, port, smartgo)
            header_len = struct.unpack_from(">I", raw, 4)[0] & 0xFFFFFF
            wire_flag = json.loads(raw[8:8 + header_len])["flag"]
            assert wire_flag == FLAG_RESPONSE | FLAG_SMARTGO | FLAG_COMPRESSED and len(raw) < len(big) // 20

            async with RemotingClient(compress_threshold=4096) as client:
                for _ in range(3):
                    assert (await client.invoke(_addr(server), RemotingCommand(10, body=big))).body == big
                assert (await client.connection(_addr(server))).peer_is_smartgo
            assert types_seen[-3:] == [SerializeType.JSON, SerializeType.MSGPACK, SerializeType.MSGPACK]
            async with RemotingClient(announce=False) as plain:
                await plain.invoke(_addr(server), RemotingCommand(10))
                await plain.invoke(_addr(server), RemotingCommand(10))
                assert not (await plain.connection(_addr(server))).peer_is_smartgo
            assert types_seen[-2:] == [SerializeType.JSON, SerializeType.JSON]
    arun(main())


def _raw_wire(port: int, frame: bytes) -> bytes:
    """The exact bytes of one reply frame."""
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.sendall(frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">I", data)[0]:
            chunk = sock.recv(1 << 20)
            assert chunk, "server closed"
            data += chunk
        return data


def test_blocking_client(echo_server) -> None:
    _proc, port = echo_server
    addr = f"{HOST}:{port}"
    with BlockingRemotingClient() as client:
        reply = client.invoke(addr, RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields={"e": "3"}))
        assert reply.code == 0 and reply.ext_str("queueId") == "3" and reply.ext_int("queueOffset") >= 1
        assert client.invoke(addr, RemotingCommand(1000)).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        got = []
        done = threading.Event()

        def callback(response, error):
            got.append((response, error))
            done.set()
        client.invoke_async(addr, RemotingCommand(5, body=b"async"), 3.0, callback)
        assert done.wait(5) and got[0][0].body == b"async" and got[0][1] is None
        client.invoke_oneway(addr, RemotingCommand(5))
        with pytest.raises(RemotingConnectError):
            client.invoke(f"{HOST}:{free_port()}", RemotingCommand(5), timeout=1.0)



def test_a_request_hook_sees_every_request_before_it_is_encoded(arun) -> None:
    """EndpointOptions.request_hook (RPCHook.doBeforeRequest): what it adds goes on the wire, for
    invoke, invoke_async and oneway requests alike, and never for the responses a client sends."""
    seen: list[int] = []

    def hook(cmd: RemotingCommand) -> None:
        seen.append(cmd.code)
        cmd.ext_fields = {**(cmd.ext_fields or {}), "Signed": "yes"}

    async def main() -> list:
        got: list[dict] = []
        oneway_done = asyncio.Event()

        async def record(conn, req):
            got.append(dict(req.ext_fields or {}))
            oneway_done.set()

        async with RemotingServer(HOST, [0], {10: echo, 12: record}) as server, \
                RemotingClient(request_hook=hook) as client:
            answer = await client.invoke(_addr(server), RemotingCommand(10, ext_fields={"k": "v"}))
            conn = await client.connection(_addr(server))
            fut = asyncio.get_running_loop().create_future()
            conn.invoke_async(RemotingCommand(10), 3.0, lambda r, e: fut.set_result(r))
            again = await fut
            conn.invoke_oneway(RemotingCommand(12, ext_fields={"x": "1"}))
            await asyncio.wait_for(oneway_done.wait(), 5)
        return [answer.ext_fields, again.ext_fields, got]
    answer, again, got = arun(main())
    assert answer == {"k": "v", "Signed": "yes"} and again == {"Signed": "yes"}
    assert got == [{"x": "1", "Signed": "yes"}]
    assert seen == [10, 10, 12]
