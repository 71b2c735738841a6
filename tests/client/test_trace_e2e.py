"""Message trace against a real node: a traced producer and push consumer leave a message's whole
story in RMQ_SYS_TRACE_TOPIC (auto-created on the first trace), which AsyncAdmin.message_trace
and `smartgo admin trace` read back: the send, a failed consumption, its retry, and a
transaction's end."""

from __future__ import annotations

import json
import uuid

import pytest

from smartgo.cli.main import main
from smartgo.client import (AsyncAdmin, AsyncProducer, AsyncPushConsumer, ConsumeResult, LocalTransactionState,
                            Message)
from smartgo.client.trace import TRACE_TOPIC, ConsumeReturnType, MessageType, TraceType
from tests.support.waits import async_wait_until

from .conftest import RealCluster, arun

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A node that checks an open transaction 1 s after its birth."""
    with RealCluster(tmp_path_factory.mktemp("trace"), extra_args=(
            "--transaction-timeout", "1", "--transaction-check-interval", "0.2")) as c:
        yield c


def _kinds(records) -> list[TraceType]:
    return [r.type for r in records]


def test_a_message_story_from_send_to_retried_consumption(cluster, capsys):
    topic = "TRACE_" + uuid.uuid4().hex[:8]
    seen: list[int] = []

    def listener(msg):
        seen.append(msg.reconsume_times)
        return ConsumeResult.RECONSUME_LATER if msg.reconsume_times == 0 else ConsumeResult.SUCCESS

    async def main_():
        async with AsyncAdmin(cluster.registry) as admin:
            await admin.create_topic(topic, 2)
            async with AsyncProducer("PG_TRACE", cluster.registry, enable_msg_trace=True) as p:
                consumer = AsyncPushConsumer("CG_TRACE", cluster.registry, listener=listener, enable_msg_trace=True,
                                             consume_from="CONSUME_FROM_FIRST_OFFSET", retry_delay_level=1)
                consumer.subscribe(topic, "*")
                async with consumer:
                    sent = await p.send(Message(topic, b"order body", tags="TagA", keys="order-42"))

                    async def story():
                        records = await admin.message_trace(sent.msg_id)
                        return records if _kinds(records).count(TraceType.SUB_AFTER) >= 2 else None
                    records = await async_wait_until(story, 40, 0.3, "the trace of a send and two consumptions")
        return sent, records

    sent, records = arun(main_())
    assert seen[:2] == [0, 1]
    pub = [r for r in records if r.type is TraceType.PUB]
    assert len(pub) == 1
    pub = pub[0]
    assert (pub.group, pub.topic, pub.tags, pub.keys, pub.store_host, pub.offset_msg_id, pub.body_length,
            pub.msg_type, pub.success, pub.client_host) == (
        "PG_TRACE", topic, "TagA", "order-42", cluster.broker, sent.offset_msg_id, 10, MessageType.NORMAL, True,
        "127.0.0.1")
    befores = [r for r in records if r.type is TraceType.SUB_BEFORE]
    afters = [r for r in records if r.type is TraceType.SUB_AFTER]
    assert [b.retry_times for b in befores[:2]] == [0, 1]
    first, second = afters[:2]
    # each SubAfter is paired with its SubBefore: the group, topic and retry count come from it
    assert (first.group, first.topic, first.retry_times, first.success, first.context_code) == (
        "CG_TRACE", topic, 0, False, ConsumeReturnType.FAILED)
    assert (second.group, second.retry_times, second.success, second.context_code) == (
        "CG_TRACE", 1, True, ConsumeReturnType.SUCCESS)
    assert pub.timestamp <= befores[0].timestamp <= first.timestamp <= second.timestamp

    # the same story through the CLI, as JSON and as mqadmin's tables
    assert main(["admin", "trace", "--id", sent.msg_id, "--json", "-n", cluster.registry]) == 0
    doc = json.loads(capsys.readouterr().out)["trace"]
    assert [d["type"] for d in doc if d["type"] != "SubBefore"][:3] == ["Pub", "SubAfter", "SubAfter"]
    assert main(["admin", "trace", "--id", sent.msg_id, "-n", cluster.registry]) == 0
    text = capsys.readouterr().out
    assert "#ProducerGroup" in text and "#ConsumerGroup" in text
    pub_line = next(line for line in text.splitlines() if line.startswith("Pub "))
    assert "PG_TRACE" in pub_line and "success" in pub_line and sent.offset_msg_id in pub_line
    sub_lines = [line for line in text.splitlines() if line.startswith("Sub ")]
    assert "failed" in sub_lines[0] and "end=FAILED" in sub_lines[0] and "retry=1" in sub_lines[1]
    assert main(["admin", "trace", "--id", "0" * 32, "-n", cluster.registry]) == 0
    assert f"no trace of {'0' * 32} in {TRACE_TOPIC}" in capsys.readouterr().out


def test_a_transaction_leaves_its_half_its_open_end_and_its_checked_end(cluster):
    topic = "TRACE_TX_" + uuid.uuid4().hex[:8]

    class Commit:
        def execute(self, msg, arg):
            return LocalTransactionState.UNKNOW

        def check(self, msg):
            return LocalTransactionState.COMMIT_MESSAGE

    async def main_():
        async with AsyncAdmin(cluster.registry) as admin:
            await admin.create_topic(topic, 1)
            async with AsyncProducer("PG_TRACE_TX", cluster.registry, enable_msg_trace=True,
                                     transaction_listener=Commit(), trace_topic="MY_TRACE_TOPIC") as p:
                sent = await p.send_in_transaction(Message(topic, b"tx", keys="tx-1"))

                async def all_three():
                    records = await admin.message_trace(sent.msg_id, "MY_TRACE_TOPIC")
                    return records if len(records) >= 3 else None
                records = await async_wait_until(all_three, 20, 0.2, "the half's Pub and both EndTransactions")
                elsewhere = await admin.message_trace(sent.msg_id)
        return sent, records, elsewhere

    sent, records, elsewhere = arun(main_())
    pub, unknown, checked = records
    assert (pub.type, pub.msg_type, pub.group, pub.topic) == (TraceType.PUB, MessageType.TRANS_HALF, "PG_TRACE_TX",
                                                              topic)
    assert (unknown.type, unknown.transaction_state, unknown.from_check, unknown.msg_type, unknown.transaction_id,
            unknown.keys, unknown.store_host) == (TraceType.END_TRANSACTION, "UNKNOW", False,
                                                  MessageType.TRANS_COMMIT, sent.msg_id, "tx-1", cluster.broker)
    # the broker's check, answered COMMIT: its record names the real topic and the broker it came from
    assert (checked.type, checked.transaction_state, checked.from_check, checked.topic, checked.keys,
            checked.store_host) == (TraceType.END_TRANSACTION, "COMMIT_MESSAGE", True, topic, "tx-1", cluster.broker)
    assert elsewhere == []              # written to the producer's own trace topic only


def test_the_cli_traces_what_it_sends_and_consumes(cluster, capsys):
    topic = "TRACE_CLI_" + uuid.uuid4().hex[:8]
    registry = ["-n", cluster.registry]
    assert main(["admin", "topic-create", "--topic", topic, "--queues", "1", *registry]) == 0
    assert main(["send", "--topic", topic, "--body", "via cli", "--keys", "cli-1", "--trace", "--json",
                 *registry]) == 0
    msg_id = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg_id"]
    assert main(["consume", "--topic", topic, "--from", "first", "--count", "1", "--group", "CG_TRACE_CLI",
                 "--trace", "--json", *registry]) == 0
    capsys.readouterr()

    async def story(group: str):
        async with AsyncAdmin(cluster.registry) as admin:
            records = await admin.message_trace(msg_id)
        return records if any(r.type is TraceType.SUB_AFTER and r.group == group for r in records) else None
    records = arun(async_wait_until(lambda: story("CG_TRACE_CLI"), 20, 0.2, "the CLI's traces"))
    assert [(r.type, r.group) for r in records if r.type is not TraceType.SUB_BEFORE] == [
        (TraceType.PUB, "smartgo-cli-producer"), (TraceType.SUB_AFTER, "CG_TRACE_CLI")]
    # a lite pull consumer traces as Java's does: at poll, a SubBefore and a successful SubAfter
    assert main(["consume", "--topic", topic, "--lite", "--from", "first", "--count", "1", "--group", "CG_TRACE_LITE",
                 "--trace", "--json", *registry]) == 0
    capsys.readouterr()
    records = arun(async_wait_until(lambda: story("CG_TRACE_LITE"), 20, 0.2, "the lite consumer's traces"))
    lite = [r for r in records if r.group == "CG_TRACE_LITE"]
    assert [r.type for r in lite] == [TraceType.SUB_BEFORE, TraceType.SUB_AFTER]
    assert (lite[1].topic, lite[1].success, lite[1].context_code, lite[1].cost_ms) == (
        topic, True, ConsumeReturnType.SUCCESS, 0)
    assert main(["consume", "--topic", topic, "--pull", "--trace", *registry]) != 0
    assert "--trace apply to the push consumer" in capsys.readouterr().err
