"""Request-reply with the SDK: producer.request() against a real node (two net actors) with a push
consumer that answers through create_reply_message; timeouts and late replies; and the pure
parts (the reply message, the reply push's decoding, the send codes) without a broker."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
import zlib

import pytest

from smartgo.client import (AsyncAdmin, AsyncProducer, AsyncPushConsumer, BrokerError, Message, MessageError,
                            Producer, PushConsumer, RequestTimeoutError, create_reply_message, reply_topic)
from smartgo.client import api
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import COMPRESSED_FLAG, MessageExt
from tests.support.waits import async_wait_until

from .conftest import ROOT, RealCluster, arun

REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"


def name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A registry and a broker with two net actors (requester and replier may sit on either)."""
    with RealCluster(tmp_path_factory.mktemp("rr"), extra_args=("--net-actors", "2")) as c:
        yield c


async def create_topic(registry: str, topic: str) -> None:
    async with AsyncAdmin(registry) as admin:
        await admin.create_topic(topic, 2)

        async def routed() -> bool:
            try:
                return bool((await admin.topic_route(topic)).subscribe_queues(topic))
            except Exception:
                return False
        await async_wait_until(routed, 10, 0.1, "route of the new topic")


class Replier:
    """A push consumer answering every request on a topic with b"re:" + body, after `delay` s."""

    def __init__(self, registry: str, topic: str, delay: float = 0.0) -> None:
        self.delay = delay
        self.answered: list[str] = []
        self.producer = AsyncProducer(name("PG_REPLIER"), registry)
        self.consumer = AsyncPushConsumer(name("G_REPLIER"), registry, listener=self.on_message,
                                          consume_from="CONSUME_FROM_FIRST_OFFSET")
        self.consumer.subscribe(topic)

    async def on_message(self, msg: MessageExt) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        await self.producer.send(create_reply_message(msg, b"re:" + msg.body))
        self.answered.append(msg.properties["CORRELATION_ID"])

    async def __aenter__(self) -> Replier:
        await self.producer.start()
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.close()
        await self.producer.close()


@pytest.mark.timeout(60)
def test_request_gets_the_consumers_reply(cluster):
    topic = name("RPC")

    async def main():
        await create_topic(cluster.registry, topic)
        async with Replier(cluster.registry, topic) as replier, \
                AsyncProducer(name("PG_REQ"), cluster.registry) as requester:
            first = await requester.request(Message(topic, b"ping", tags="T"), timeout=10)
            many = await asyncio.gather(*(requester.request(Message(topic, f"n{i}".encode()), timeout=10)
                                          for i in range(20)))
            return requester.client_id, first, many, replier.answered
    client_id, first, many, answered = arun(main())
    assert first.body == b"re:ping" and first.topic == REPLY_TOPIC
    props = first.properties
    assert props["REPLY_TO_CLIENT"] == client_id and props["MSG_TYPE"] == "reply" and props["TTL"] == "10000"
    assert props["CORRELATION_ID"] == answered[0]
    assert int(props["ARRIVE_TIME"]) >= int(props["PUSH_REPLY_TIME"]) > 0
    assert first.born_host[0] == "127.0.0.1" and first.store_host == ("127.0.0.1", int(cluster.broker.split(":")[1]))
    assert [m.body for m in many] == [f"re:n{i}".encode() for i in range(20)]      # each its own reply
    assert len({m.properties["CORRELATION_ID"] for m in many}) == 20


@pytest.mark.timeout(60)
def test_blocking_request_and_reply(cluster):
    topic = name("RPCB")
    arun(create_topic(cluster.registry, topic))
    with Producer(name("PG_REP"), cluster.registry) as reply_producer:
        consumer = PushConsumer(name("G_REP"), cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET")
        consumer.subscribe(topic)

        def answer(msg: MessageExt) -> None:                # runs on a consume thread: blocking calls are fine
            reply_producer.send(create_reply_message(msg, msg.body.upper()))
        consumer.set_listener(answer)
        consumer.start()
        try:
            with Producer(name("PG_REQ"), cluster.registry) as p:
                reply = p.request(Message(topic, b"shout"), timeout=10)
        finally:
            consumer.close()
    assert reply.body == b"SHOUT"


@pytest.mark.timeout(60)
def test_request_without_a_replier_times_out(cluster):
    topic = name("NOBODY")

    async def main():
        await create_topic(cluster.registry, topic)
        async with AsyncProducer(name("PG_REQ"), cluster.registry) as requester:
            await requester.publish_info(topic)
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError, match="no reply came within 0.5 s") as err:
                await requester.request(Message(topic, b"hello?"), timeout=0.5)
            return time.monotonic() - started, err.value, requester._requests
    elapsed, err, waiting = arun(main())
    assert 0.4 < elapsed < 3.0 and isinstance(err, TimeoutError)
    assert not waiting                                  # the request's entry is gone


@pytest.mark.timeout(60)
def test_late_reply_is_dropped_with_a_log_line(cluster, caplog):
    topic = name("SLOW")
    caplog.set_level(logging.WARNING, "smartgo.client.producer")

    async def main():
        await create_topic(cluster.registry, topic)
        async with Replier(cluster.registry, topic, delay=1.5) as replier, \
                AsyncProducer(name("PG_REQ"), cluster.registry) as requester:
            with pytest.raises(RequestTimeoutError):
                await requester.request(Message(topic, b"too slow"), timeout=1.0)
            await async_wait_until(lambda: replier.answered, 20, 0.05, "the late reply")
            await async_wait_until(lambda: "not matched any request" in caplog.text, 5, 0.05, "the log line")
            # the producer still works: a quick request after the late one
            replier.delay = 0
            reply = await requester.request(Message(topic, b"quick"), timeout=10)
            return replier.answered[0], reply
    correlation, reply = arun(main())
    assert reply.body == b"re:quick"
    late = [r for r in caplog.records if "not matched any request" in r.getMessage()]
    assert len(late) == 1 and correlation in late[0].getMessage()


@pytest.mark.timeout(60)
def test_reply_to_an_unknown_client_raises_the_brokers_error(cluster):
    async def main():
        async with AsyncProducer(name("PG"), cluster.registry, retries=0) as p:
            msg = Message(reply_topic("DefaultCluster"), b"x", properties={
                "MSG_TYPE": "reply", "CORRELATION_ID": "c", "REPLY_TO_CLIENT": "10.0.0.9@nobody"})
            with pytest.raises(BrokerError) as err:
                await p.send(msg)
            return err.value
    err = arun(main())
    assert err.code == ResponseCode.SYSTEM_ERROR and "channel of <10.0.0.9@nobody> not found" in err.remark


@pytest.mark.timeout(60)
def test_cli_request(cluster):
    topic = name("RPCCLI")

    async def cli(*argv: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartgo.cli", "request", "-n", cluster.registry, "--topic", topic, *argv,
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        return proc.returncode, out.decode(), err.decode()

    async def main():
        await create_topic(cluster.registry, topic)
        timed_out = await cli("--body", "anyone?", "--timeout", "1")
        async with Replier(cluster.registry, topic):
            answered = await cli("--body", "hi", "--json")
        return timed_out, answered
    timed_out, (code, out, err) = arun(main())
    assert timed_out[0] == 1 and "no reply came within 1 s" in timed_out[2]
    assert code == 0, err
    reply = json.loads(out.strip().splitlines()[-1])
    assert reply["body"] == "re:hi" and reply["topic"] == REPLY_TOPIC


# ---- without a broker -------------------------------------------------------------------------------------

def received(props: dict[str, str]) -> MessageExt:
    return MessageExt("RPC", 0, 5, 100, 0, 0, 1, ("127.0.0.1", 1), 2, ("127.0.0.1", 2), 0, 0, b"req", props)


def test_create_reply_message_copies_what_routes_the_reply():
    req = received({"CLUSTER": "C1", "CORRELATION_ID": "abc", "REPLY_TO_CLIENT": "1.2.3.4@9", "TTL": "3000",
                    "TAGS": "x", "UNIQ_KEY": "u"})
    reply = create_reply_message(req, b"answer")
    assert (reply.topic, reply.body) == ("C1_REPLY_TOPIC", b"answer")
    assert reply.properties == {"MSG_TYPE": "reply", "CORRELATION_ID": "abc", "REPLY_TO_CLIENT": "1.2.3.4@9",
                                "TTL": "3000"}
    with pytest.raises(MessageError, match=r"property\[CLUSTER\] is null"):
        create_reply_message(received({"CORRELATION_ID": "abc"}), b"x")


def test_a_reply_is_sent_with_the_reply_codes():
    fields = api.send_fields("PG", REPLY_TOPIC, 0, 0, 1, 0, "MSG_TYPE\x01reply")
    assert api.send_request(fields, b"x", reply=True).code == RequestCode.SEND_REPLY_MESSAGE_V2
    v1 = api.send_request(fields, b"x", reply=True, v1=True)
    assert v1.code == RequestCode.SEND_REPLY_MESSAGE and v1.ext_fields["topic"] == REPLY_TOPIC
    assert api.send_request(fields, b"x").code == RequestCode.SEND_MESSAGE_V2


def push(ext: dict[str, str], body: bytes) -> RemotingCommand:
    return RemotingCommand(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, ext_fields=ext, body=body)


def test_decode_reply_reads_javas_header():
    ext = {"producerGroup": "PG", "topic": REPLY_TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
           "queueId": "0", "sysFlag": str(COMPRESSED_FLAG), "bornTimestamp": "111", "flag": "7",
           "properties": "CORRELATION_ID\x01abc\x02MSG_TYPE\x01reply\x02", "reconsumeTimes": "0",
           "unitMode": "false", "bornHost": "/10.0.0.5:50000", "storeHost": "broker-host/10.0.0.1:10911",
           "storeTimestamp": "222"}
    msg = api.decode_reply(push(ext, zlib.compress(b"big reply")), 333)
    assert (msg.topic, msg.queue_id, msg.flag, msg.born_timestamp, msg.store_timestamp) == (REPLY_TOPIC, 0, 7, 111, 222)
    assert msg.born_host == ("10.0.0.5", 50000) and msg.store_host == ("10.0.0.1", 10911)
    assert msg.body == b"big reply" and not msg.sys_flag & COMPRESSED_FLAG
    assert msg.properties == {"CORRELATION_ID": "abc", "MSG_TYPE": "reply", "ARRIVE_TIME": "333"}
    with pytest.raises(ValueError):
        api.decode_reply(push({**ext, "queueId": "zero"}, b""), 1)


def test_unmatched_and_undecodable_reply_pushes(caplog):
    caplog.set_level(logging.WARNING, "smartgo.client.producer")

    async def main():
        p = AsyncProducer("PG", "127.0.0.1:1")              # never started: only its reply handler runs
        good = push({"topic": REPLY_TOPIC, "properties": "CORRELATION_ID\x01nobody-waits",
                     "bornHost": "/127.0.0.1:4000"}, b"x")
        waiting = asyncio.get_running_loop().create_future()
        p._requests["someone-waits"] = waiting
        matched = push({"topic": REPLY_TOPIC, "properties": "CORRELATION_ID\x01someone-waits"}, b"y")
        return (await p.instance.reply_handler(good), await p.instance.reply_handler(matched), waiting.result(),
                await p.instance.reply_handler(push({"queueId": "x"}, b"")))
    unmatched, matched, reply, bad = arun(main())
    assert unmatched.code == ResponseCode.SUCCESS and matched.code == ResponseCode.SUCCESS
    assert reply.body == b"y"
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, "process reply message fail")
    assert "CorrelationId: nobody-waits, reply from host: 127.0.0.1:4000" in caplog.text
    assert "does not decode" in caplog.text
