"""GET_CONSUMER_RUNNING_INFO (307) and CONSUME_MESSAGE_DIRECTLY (309) against a real node, as
AdminBrokerProcessor.callConsumer: the broker actor sends the request (a new opaque, the same
header) to the named consumer's connection through its net actor and answers with the consumer's
response; the refusals are 4.x's (not online, too old a client, a timeout, a failed call)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from smartgo.broker.processor.admin_processor import CALL_CLIENT_TIMEOUT
from tests.support.broker import ClientStub, send_command
from smartgo.net.codes import FLAG_ONEWAY, FLAG_RESPONSE, MQVersion, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import decode_records
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(60)


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def running_info(group: str, client_id: str, jstack: bool = False) -> RemotingCommand:
    return RemotingCommand(RequestCode.GET_CONSUMER_RUNNING_INFO, ext_fields={
        "consumerGroup": group, "clientId": client_id, "jstackEnable": str(jstack).lower()})


def consume_directly(group: str, client_id: str, msg_id: str) -> RemotingCommand:
    return RemotingCommand(RequestCode.CONSUME_MESSAGE_DIRECTLY, ext_fields={
        "consumerGroup": group, "clientId": client_id, "msgId": msg_id})


@pytest.fixture
def consumer(broker):
    """A stub consumer of a fresh group, heartbeating to the node: (group, stub)."""
    group, stub = uid("G"), ClientStub(broker.addr, uid("127.0.0.1@stub"))
    assert stub.heartbeat({group: {uid("T"): "*"}}).code == ResponseCode.SUCCESS
    yield group, stub
    stub.close()


def test_running_info_is_asked_of_the_consumer_and_its_answer_relayed(broker, consumer):
    group, stub = consumer

    async def answer(conn, cmd):
        return RemotingCommand(ResponseCode.SUCCESS, remark="from the stub", ext_fields={"x": "1"},
                               body=b'{"properties":{}}')
    stub.answer = answer
    r = broker.call(running_info(group, stub.client_id, jstack=True))
    assert (r.code, r.remark, r.ext_fields, r.body_bytes()) == (
        ResponseCode.SUCCESS, "from the stub", {"x": "1"}, b'{"properties":{}}')
    (asked,) = stub.relayed
    assert asked.code == RequestCode.GET_CONSUMER_RUNNING_INFO and not asked.flag & (FLAG_ONEWAY | FLAG_RESPONSE)
    assert asked.ext_fields == {"consumerGroup": group, "clientId": stub.client_id, "jstackEnable": "true"}


def test_consume_directly_sends_the_stored_record_and_the_broker_name(broker, consumer):
    group, stub = consumer
    topic = uid("Direct")
    sent = broker.call(send_command(topic, b"direct-body", tags="TagD"))
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    msg_id = sent.ext_fields["msgId"]
    r = broker.call(consume_directly(group, stub.client_id, msg_id))
    assert (r.code, r.body_bytes()) == (ResponseCode.SUCCESS, b'{"stub":true}')
    (asked,) = stub.relayed
    assert asked.code == RequestCode.CONSUME_MESSAGE_DIRECTLY
    assert asked.ext_fields == {"consumerGroup": group, "clientId": stub.client_id, "msgId": msg_id,
                                "brokerName": "broker-a"}
    (record,) = decode_records(asked.body_bytes())
    assert (record.topic, record.body, record.tags, record.msg_id) == (topic, b"direct-body", "TagD", msg_id)


def test_refusals_name_the_reason(broker, consumer):
    group, stub = consumer
    r = broker.call(running_info(group, "127.0.0.1@gone"))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <127.0.0.1@gone> not online")
    r = broker.call(running_info(uid("NoGroup"), stub.client_id))
    assert r.code == ResponseCode.SYSTEM_ERROR and "not online" in r.remark
    r = broker.call(consume_directly(group, stub.client_id, "not-hex"))
    assert r.code == ResponseCode.SYSTEM_ERROR and r.remark.startswith("bad msgId")
    r = broker.call(consume_directly(group, stub.client_id, "7F00000100002A9F00000000FFFFFFFF"))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "can not find message by the offset, 4294967295")
    assert stub.relayed == []                                  # none of them reached the consumer
    old_group, old = uid("G"), ClientStub(broker.addr, uid("127.0.0.1@old"))
    try:
        assert old.heartbeat({old_group: {uid("T"): "*"}}, client_version=MQVersion.V3_1_8_SNAPSHOT - 1).code == 0
        r = broker.call(running_info(old_group, old.client_id))
        assert r.code == ResponseCode.SYSTEM_ERROR and "too low to finish" in r.remark and old.relayed == []
    finally:
        old.close()


def test_a_consumer_whose_connection_drops_is_a_failed_invocation(broker, consumer):
    group, stub = consumer

    async def vanish(conn, cmd):
        conn.close("the stub drops the connection")
        return None
    stub.answer = vanish
    r = broker.call(running_info(group, stub.client_id))
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert r.remark.startswith(f"invoke consumer <{group}> <{stub.client_id}> Exception:"), r.remark


def test_a_slow_consumer_holds_only_its_own_request(broker, consumer):
    """While the broker actor waits on one consumer, it answers every other request; a consumer
    that never answers is CONSUME_MSG_TIMEOUT after 4.x's 10 s."""
    group, stub = consumer
    release = threading.Event()

    async def hang(conn, cmd):
        while not release.is_set():
            await asyncio.sleep(0.05)
        return None
    stub.answer = hang
    result: list[RemotingCommand] = []
    started = time.monotonic()
    caller = threading.Thread(target=lambda: result.append(broker.call(running_info(group, stub.client_id),
                                                                       timeout=CALL_CLIENT_TIMEOUT + 5)))
    caller.start()
    try:
        wait_until(lambda: stub.relayed, message="the request at the consumer")
        r = broker.call(RemotingCommand(RequestCode.GET_CONSUMER_CONNECTION_LIST, ext_fields={"consumerGroup": group}))
        assert r.code == ResponseCode.SUCCESS and time.monotonic() - started < CALL_CLIENT_TIMEOUT / 2
        caller.join(CALL_CLIENT_TIMEOUT + 5)
    finally:
        release.set()
    (timed_out,) = result
    assert timed_out.code == ResponseCode.CONSUME_MSG_TIMEOUT, timed_out.remark
    assert timed_out.remark.startswith(f"consumer <{group}> <{stub.client_id}> Timeout:")
    assert time.monotonic() - started >= CALL_CLIENT_TIMEOUT
