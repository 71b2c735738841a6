"""Producer against a scripted fake broker and a real registry: request shapes (SEND_MESSAGE_V2
header letters, properties, batch body), statuses, retries, timeouts, TBW102 auto-creation."""

from __future__ import annotations

import asyncio
import zlib

import pytest

from smartgo.client import AsyncProducer, BrokerError, Message, NoRouteError, SendStatus, SendTimeoutError
from smartgo.net.busy_poll import poller_for
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.store.record import COMPRESSED_FLAG, decode_batch_body, decode_properties
from tests.support.waits import async_wait_until

from .conftest import FakeBroker, arun, fake_cluster

V2_FIELDS = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m"}


def test_send_request_shape_and_result(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 4})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[RequestCode.SEND_MESSAGE_V2] = broker.send_ok()
            async with AsyncProducer("PG", registry) as p:
                r = await p.send(Message("T", b"hello", tags="TagA", keys=["k1", "k2"], properties={"color": "red"}))
            req = broker.of(RequestCode.SEND_MESSAGE_V2)[0]
            return r, req
    r, req = arun(main())
    assert r.status is SendStatus.SEND_OK
    assert len(r.msg_id) == 32 and r.msg_id == r.msg_id.upper()
    assert r.offset_msg_id.endswith("0000000000000064") and r.queue_offset == 0
    ext = req.ext_fields
    assert set(ext) == V2_FIELDS
    assert (ext["a"], ext["b"], ext["c"], ext["d"], ext["f"], ext["h"], ext["j"], ext["k"], ext["m"]) == \
        ("PG", "T", "TBW102", "4", "0", "0", "0", "false", "false")
    assert int(ext["e"]) == r.queue.queue_id and int(ext["g"]) > 1_600_000_000_000
    props = decode_properties(ext["i"])
    assert props == {"TAGS": "TagA", "KEYS": "k1 k2", "color": "red", "WAIT": "true", "UNIQ_KEY": r.msg_id}
    assert req.body == b"hello" and req.language == 3 and req.version >= 401


@pytest.mark.parametrize("code,status", [(10, SendStatus.FLUSH_DISK_TIMEOUT), (12, SendStatus.FLUSH_SLAVE_TIMEOUT),
                                         (11, SendStatus.SLAVE_NOT_AVAILABLE)])
def test_stored_but_statuses(tmp, code, status):
    async def main():
        broker = FakeBroker(topics={"T": 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[RequestCode.SEND_MESSAGE_V2] = broker.send_ok(code)
            async with AsyncProducer("PG", registry) as p:
                return await p.send(Message("T", b"x")), len(broker.of(RequestCode.SEND_MESSAGE_V2))
    r, n = arun(main())
    assert r.status is status and n == 1  # no retry for a stored message


def test_compression_over_4k(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[RequestCode.SEND_MESSAGE_V2] = broker.send_ok()
            async with AsyncProducer("PG", registry) as p:
                await p.send(Message("T", b"a" * 4095))
                await p.send(Message("T", b"b" * 4096))
            return broker.of(RequestCode.SEND_MESSAGE_V2)
    small, big = arun(main())
    assert int(small.ext_fields["f"]) & COMPRESSED_FLAG == 0 and small.body == b"a" * 4095
    assert int(big.ext_fields["f"]) & COMPRESSED_FLAG and zlib.decompress(big.body) == b"b" * 4096


def test_busy_poll_option_reaches_the_connection(tmp):
    """busy_poll_us= on a client: its loop polls after each request (the poller turned), and
    sends work as usual."""
    async def main():
        broker = FakeBroker(topics={"T": 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[RequestCode.SEND_MESSAGE_V2] = broker.send_ok()
            assert poller_for(0) is None
            async with AsyncProducer("PG", registry, busy_poll_us=300) as p:
                results = [await p.send(Message("T", b"x%d" % i)) for i in range(20)]
            poller = poller_for(1)                # this loop's poller (widen-only: stays 300 µs)
            return results, poller.window_ns, poller.turns
    results, window_ns, turns = arun(main())
    assert [r.status for r in results] == [SendStatus.SEND_OK] * 20
    assert window_ns == 300_000 and turns > 0


def test_batch_is_one_request(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 2})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[RequestCode.SEND_BATCH_MESSAGE] = broker.send_ok()
            async with AsyncProducer("PG", registry) as p:
                r = await p.send_batch([Message("T", f"m{i}".encode(), tags="A", keys=f"k{i}") for i in range(5)])
            return r, broker.of(RequestCode.SEND_BATCH_MESSAGE)
    r, reqs = arun(main())
    assert len(reqs) == 1
    req = reqs[0]
    assert req.ext_fields["m"] == "true" and decode_properties(req.ext_fields["i"]) == {"WAIT": "true"}
    items = decode_batch_body(req.body)
    assert [i.body for i in items] == [f"m{i}".encode() for i in range(5)]
    ids = r.msg_id.split(",")
    assert len(ids) == 5 and len(set(ids)) == 5
    assert [decode_properties(i.properties)["UNIQ_KEY"] for i in items] == ids
    assert decode_properties(items[3].properties)["KEYS"] == "k3"


def test_batch_rejects_mixed_topics_and_delay(tmp):
    async def main():
        async with fake_cluster(tmp) as (registry, _):
            async with AsyncProducer("PG", registry) as p:
                with pytest.raises(ValueError, match="one topic"):
                    await p.send_batch([Message("A", b"1"), Message("B", b"2")])
                with pytest.raises(ValueError, match="delayed"):
                    await p.send_batch([Message("A", b"1", delay_level=2)])
    arun(main())


def test_retry_on_another_broker_and_fault_avoidance(tmp):
    async def main():
        bad, good = FakeBroker("broker-a", {"T": 2}), FakeBroker("broker-b", {"T": 2})
        async with fake_cluster(tmp, [bad, good]) as (registry, _):
            bad.handlers[RequestCode.SEND_MESSAGE_V2] = lambda c, cmd: cmd.make_response(
                ResponseCode.SYSTEM_ERROR, "disk on fire")
            good.handlers[RequestCode.SEND_MESSAGE_V2] = good.send_ok()
            async with AsyncProducer("PG", registry) as p:
                results = [await p.send(Message("T", b"x")) for _ in range(10)]
            return results, len(bad.of(RequestCode.SEND_MESSAGE_V2))
    results, bad_attempts = arun(main())
    assert all(r.queue.broker_name == "broker-b" for r in results)
    assert bad_attempts == 1  # after one failure broker-a is avoided


def test_no_retry_on_non_retriable_code(tmp):
    async def main():
        a, b = FakeBroker("broker-a", {"T": 1}), FakeBroker("broker-b", {"T": 1})
        async with fake_cluster(tmp, [a, b]) as (registry, _):
            for x in (a, b):
                x.handlers[RequestCode.SEND_MESSAGE_V2] = lambda c, cmd: cmd.make_response(
                    ResponseCode.MESSAGE_ILLEGAL, "too big")
            async with AsyncProducer("PG", registry) as p:
                with pytest.raises(BrokerError) as info:
                    await p.send(Message("T", b"x"))
            return info.value, len(a.of(310)) + len(b.of(310))
    err, attempts = arun(main())
    assert err.code == ResponseCode.MESSAGE_ILLEGAL and "too big" in str(err) and attempts == 1


def test_retries_exhausted_raise_last_error(tmp):
    async def main():
        a = FakeBroker("broker-a", {"T": 1})
        async with fake_cluster(tmp, [a]) as (registry, _):
            a.handlers[310] = lambda c, cmd: cmd.make_response(ResponseCode.SYSTEM_BUSY, "busy")
            async with AsyncProducer("PG", registry, retries=2) as p:
                with pytest.raises(BrokerError, match="busy"):
                    await p.send(Message("T", b"x"))
            return len(a.of(310))
    assert arun(main()) == 3


def test_timeout_is_not_retried(tmp):
    async def main():
        a, b = FakeBroker("broker-a", {"T": 1}), FakeBroker("broker-b", {"T": 1})
        async with fake_cluster(tmp, [a, b]) as (registry, _):
            async def never(conn, cmd):
                await asyncio.sleep(10)
            for x in (a, b):
                x.handlers[310] = never
            async with AsyncProducer("PG", registry, send_timeout=0.3) as p:
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                with pytest.raises(SendTimeoutError):
                    await p.send(Message("T", b"x"))
                elapsed = loop.time() - t0
            return elapsed, len(a.of(310)) + len(b.of(310))
    elapsed, attempts = arun(main())
    assert attempts == 1 and elapsed < 1.5


def test_tbw102_auto_creation_headers(tmp):
    async def main():
        broker = FakeBroker(topics={})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[310] = broker.send_ok()
            async with AsyncProducer("PG", registry) as p:
                r = await p.send(Message("NewTopic", b"x"))
                queues = await p.fetch_publish_queues("NewTopic")
            return r, broker.of(310)[0], queues
    r, req, queues = arun(main())
    assert req.ext_fields["b"] == "NewTopic" and req.ext_fields["c"] == "TBW102" and req.ext_fields["d"] == "4"
    assert len(queues) == 4 and {q.queue_id for q in queues} == {0, 1, 2, 3}
    assert r.status is SendStatus.SEND_OK


def test_no_route_at_all(tmp):
    async def main():
        async with fake_cluster(tmp, []) as (registry, _):
            async with AsyncProducer("PG", registry) as p:
                with pytest.raises(NoRouteError, match="T"):
                    await p.send(Message("T", b"x"))
    arun(main())


def test_orderly_send_same_key_same_queue(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 8})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[310] = broker.send_ok()
            async with AsyncProducer("PG", registry) as p:
                out = {}
                for i in range(40):
                    key = f"order-{i % 5}"
                    r = await p.send_orderly(Message("T", f"{key}:{i}".encode()), key)
                    out.setdefault(key, set()).add(r.queue.queue_id)
            return out
    out = arun(main())
    assert all(len(qs) == 1 for qs in out.values())


def test_async_callback_and_oneway(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 4})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[310] = broker.send_ok()
            seen = []
            async with AsyncProducer("PG", registry) as p:
                futs = [p.send_async(Message("T", b"x"), lambda r, e: seen.append((r, e))) for _ in range(50)]
                results = await asyncio.gather(*futs)
                await p.send_oneway(Message("T", b"one-way"))

                def oneway_arrived():
                    return [r for r in broker.of(310) if r.body == b"one-way"]
                oneway = await async_wait_until(oneway_arrived, 5, message="the one-way send")
            return results, seen, oneway
    results, seen, oneway = arun(main())
    assert len(results) == 50 and len(seen) == 50 and all(e is None for _, e in seen)
    assert len({r.msg_id for r in results}) == 50
    assert len(oneway) == 1 and oneway[0].flag & 2


def test_message_validation():
    async def main():
        p = AsyncProducer("PG", "127.0.0.1:1")
        await p.start()
        try:
            for bad in (Message("bad topic", b"x"), Message("T", b""), Message("T", b"x" * (4 * 1024 * 1024 + 1)),
                        Message("T", b"x", properties={"UNIQ_KEY": "mine"})):
                with pytest.raises(ValueError):
                    p.send_async(bad)
        finally:
            await p.close()
    arun(main())


def test_registry_down_is_clear():
    async def main():
        async with AsyncProducer("PG", "127.0.0.1:1;127.0.0.1:2", timeout=0.5) as p:
            with pytest.raises(Exception, match="no registry answered"):
                await p.send(Message("T", b"x"))
    arun(main())


def test_heartbeat_shape(tmp):
    async def main():
        broker = FakeBroker(topics={"T": 1})
        async with fake_cluster(tmp, [broker]) as (registry, _):
            broker.handlers[310] = broker.send_ok()
            broker.handlers[RequestCode.HEART_BEAT] = lambda c, cmd: cmd.make_response(0)
            async with AsyncProducer("PG", registry) as p:
                await p.send(Message("T", b"x"))
                assert await p.instance.heartbeat_all() == 1
                cid = p.client_id
            hb = broker.of(RequestCode.HEART_BEAT)[-1]
            return cid, hb, broker.of(RequestCode.UNREGISTER_CLIENT)
    cid, hb, unreg = arun(main())
    import json
    body = json.loads(hb.body)
    assert body["clientID"] == cid and "@" in cid
    assert body["consumerDataSet"] == []
    assert {"groupName": "PG"} in body["producerDataSet"]
    assert unreg and unreg[0].ext_fields == {"clientID": cid, "producerGroup": "PG"}


@pytest.mark.parametrize("code", [ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.NO_PERMISSION])
def test_a_broker_that_takes_no_sends_makes_the_routes_refresh_early(tmp, code):
    """The route's master became a slave (a switchover) or is handing its role over: its answer
    makes the producer re-read routes at once rather than at the next poll (30 s)."""
    async def main():
        old = FakeBroker("broker-a", {"T": 1})
        async with fake_cluster(tmp, [old]) as (registry, _):
            old.handlers[310] = old.send_ok()
            async with AsyncProducer("PG", registry, retries=0) as p:
                assert (await p.send(Message("T", b"first"))).queue.broker_name == "broker-a"
                new = await FakeBroker("broker-a", {"T": 1}).start(registry)     # brokerId 0 moves
                try:
                    new.handlers[310] = new.send_ok()
                    old.handlers[310] = lambda c, cmd: cmd.make_response(code, "this broker takes no sends")
                    with pytest.raises(BrokerError, match="takes no sends"):
                        await p.send(Message("T", b"refused"))

                    async def through_the_new_master() -> bool:
                        try:
                            await p.send(Message("T", b"again"))
                        except BrokerError:
                            return False
                        return True
                    await async_wait_until(through_the_new_master, timeout=5, message="a send at the new master")
                    return len(new.of(310))
                finally:
                    await new.stop()
    assert arun(main()) == 1
