"""What an operator asks of one running consumer, through a real broker: GET_CONSUMER_RUNNING_INFO
(307) and CONSUME_MESSAGE_DIRECTLY (309), relayed by the broker to the client's connection and
answered by the SDK's consumers (AsyncAdmin.consumer_running_info / consume_message_directly)."""

from __future__ import annotations

import pytest

from smartgo.client import AsyncAdmin, AsyncProducer, AsyncPullConsumer, AsyncPushConsumer, ConsumeResult, Message
from smartgo.client.errors import BrokerError, ClientError
from smartgo.net.codes import ResponseCode
from tests.support.waits import async_wait_until

from .conftest import arun
from .test_push_e2e import create_topic, name, send_all

pytestmark = pytest.mark.timeout(90)


async def committed(admin: AsyncAdmin, group: str, topic: str, total: int) -> bool:
    return sum(q.consumer_offset for q in (await admin.consumer_progress(group, topic)).queues) == total


def test_running_info_reports_settings_queues_offsets_and_rates(real_cluster):
    topic, group = name("STATUS"), name("G")

    async def main():
        await create_topic(real_cluster.registry, topic, 2)
        await send_all(real_cluster.registry, topic, 30)
        got: list[bytes] = []
        c = AsyncPushConsumer(group, real_cluster.registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                              consume_threads=3, listener=lambda m: got.append(m.body))
        c.subscribe(topic)
        async with AsyncAdmin(real_cluster.registry) as admin, c:
            await async_wait_until(lambda: len(got) == 30, 30, 0.05, "30 messages consumed")
            info = await admin.consumer_running_info(group, c.client_id)
            with_stacks = await admin.consumer_running_info(group, c.client_id, jstack=True)
            try:
                await admin.consumer_running_info(group, "127.0.0.1@no-such-client")
            except BrokerError as exc:
                missing = exc
        return c.client_id, info, with_stacks, missing
    client_id, info, with_stacks, missing = arun(main())
    props = info.properties
    assert props["consumerGroup"] == group and props["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
    assert props["PROP_CONSUMEORDERLY"] == "false" and props["PROP_THREADPOOL_CORE_SIZE"] == "3"
    assert props["PROP_CLIENT_VERSION"] == "V4_9_8" and props["PROP_NAMESERVER_ADDR"] == real_cluster.registry
    assert props["consumeFromWhere"] == "CONSUME_FROM_FIRST_OFFSET" and int(props["PROP_CONSUMER_START_TIMESTAMP"]) > 0
    assert {s["topic"]: s["subString"] for s in info.subscriptions} == {topic: "*", f"%RETRY%{group}": "*"}
    mine = {mq.queue_id: q for mq, q in info.queues.items() if mq.topic == topic}
    assert sorted(mine) == [0, 1]
    assert sum(q["commitOffset"] for q in mine.values()) == 30            # everything consumed, nothing cached
    assert all(q["cachedMsgCount"] == 0 and q["lastPullTimestamp"] > 0 and not q["droped"] for q in mine.values())
    assert max(q["lastConsumeTimestamp"] for q in mine.values()) > 0
    status = info.status[topic]
    assert status["pullTPS"] > 0 and status["consumeOKTPS"] > 0 and status["consumeFailedMsgs"] == 0
    assert info.jstack is None and "smartgo-" in with_stacks.jstack          # the consume pool's threads
    assert missing.code == ResponseCode.SYSTEM_ERROR and "not online" in missing.remark


def test_consume_directly_runs_the_listener_and_reports_its_verdict(real_cluster):
    """By UNIQ_KEY (with the topic) and by offsetMsgId; a listener that asks for later, one that
    raises (the remark carries the trace). A pull consumer's group and an id that names nothing
    are refused."""
    topic, group, pull_group = name("DIRECT"), name("G"), name("PULLG")
    seen: list[bytes] = []
    armed: list[bool] = []                  # verdicts other than success only once consumed directly

    def listener(m):
        seen.append(m.body)
        if armed and m.body == b"later":
            return ConsumeResult.RECONSUME_LATER
        if armed and m.body == b"boom":
            raise RuntimeError("listener exploded")
        return ConsumeResult.SUCCESS

    async def main():
        await create_topic(real_cluster.registry, topic, 1)
        c = AsyncPushConsumer(group, real_cluster.registry, listener=listener)   # from the last offset: nothing
        c.subscribe(topic)
        async with AsyncAdmin(real_cluster.registry) as admin, c:
            await async_wait_until(lambda: c.process_queues, 20, 0.05, "the consumer holds its queue")
            async with AsyncProducer("PG", real_cluster.registry) as p:
                await p.send(Message(topic, b"warm-up"))          # pulled after the consumer took the queue
                await async_wait_until(lambda: seen == [b"warm-up"], 20, 0.05, "the warm-up consumed")
                sent = {body: await p.send(Message(topic, body)) for body in (b"ok", b"later", b"boom")}
            await async_wait_until(lambda: len(seen) == 4, 20, 0.05, "the three consumed normally")
            await async_wait_until(lambda: committed(admin, group, topic, 4), 20, 0.1, "the offsets committed")
            armed.append(True)
            results = {b"ok": await admin.consume_message_directly(group, c.client_id, sent[b"ok"].msg_id, topic),
                       b"later": await admin.consume_message_directly(group, c.client_id,
                                                                      sent[b"later"].offset_msg_id),
                       b"boom": await admin.consume_message_directly(group, c.client_id, sent[b"boom"].msg_id, topic)}
            async with AsyncPullConsumer(pull_group, real_cluster.registry) as pc:
                await pc.fetch_queues(topic)
                await pc.instance.heartbeat_all()
                pull_info = await admin.consumer_running_info(pull_group, pc.client_id)
                try:
                    await admin.consume_message_directly(pull_group, pc.client_id, sent[b"ok"].offset_msg_id)
                except BrokerError as exc:
                    refused = exc
            try:
                await admin.consume_message_directly(group, c.client_id, sent[b"ok"].offset_msg_id[:-6] + "FFFFFF")
            except ClientError as exc:
                nowhere = exc
        return results, pull_info, refused, nowhere
    results, pull_info, refused, nowhere = arun(main())
    assert seen[4:] == [b"ok", b"later", b"boom"]                       # each consumed once more, directly
    assert [results[b]["consumeResult"] for b in (b"ok", b"later", b"boom")] == \
        ["CR_SUCCESS", "CR_LATER", "CR_THROW_EXCEPTION"]
    assert "RuntimeError: listener exploded" in results[b"boom"]["remark"]
    assert all(r["order"] is False and r["autoCommit"] is True and r["spentTimeMills"] >= 0 for r in results.values())
    assert pull_info.properties["PROP_CONSUME_TYPE"] == "CONSUME_ACTIVELY" and pull_info.queues == {}
    assert [s["topic"] for s in pull_info.subscriptions] == [topic]
    assert refused.code == ResponseCode.SYSTEM_ERROR and "not exist in this consumer" in refused.remark
    assert "can not find message by the offset" in str(nowhere)
