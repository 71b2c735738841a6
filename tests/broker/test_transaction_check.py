"""The transaction check-back against a real node: a half message left without END_TRANSACTION is
sent to a producer of its group as CHECK_TRANSACTION_STATE, and the producer's answer (END_TRANSACTION
with fromTransactionCheck, as the Java client sends it) commits it, rolls it back, or leaves it for
the next pass until the check limit gives it up."""

from __future__ import annotations

import json
import threading

import pytest

from smartgo.broker.schedule_message import HALF_TOPIC, OP_TOPIC
from smartgo.broker.testing import (end_transaction_command, group_command, heartbeat_body, pull_command,
                                    restart_broker, send_command, uniq_key)
from smartgo.broker.transaction_check import CHECK_GROUP
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import (TRANSACTION_COMMIT_TYPE, TRANSACTION_MASK, TRANSACTION_PREPARED_TYPE,
                                  TRANSACTION_ROLLBACK_TYPE, decode_record, decode_records, parse_offset_msg_id)
from smartgo.testing import wait_until

NODE_SETTINGS = {"transaction_timeout": 1.0, "transaction_check_interval": 0.2, "transaction_check_max": 3}


class TransactionalProducer:
    """A producer connection that answers CHECK_TRANSACTION_STATE the way the Java client does:
    END_TRANSACTION oneway on the same connection, fromTransactionCheck true, the check's offsets."""

    def __init__(self, broker, group: str, answer: int) -> None:
        self.broker, self.group, self.answer = broker, group, answer
        self.checks: list[RemotingCommand] = []
        self._lock = threading.Lock()
        self.remoting = BlockingRemotingClient(processors={RequestCode.CHECK_TRANSACTION_STATE: self._on_check})
        hb = RemotingCommand(RequestCode.HEART_BEAT, body=heartbeat_body(f"tx-{group}", producers=(group,)))
        assert self.call(hb).code == ResponseCode.SUCCESS

    def call(self, cmd: RemotingCommand) -> RemotingCommand:
        return self.remoting.invoke(self.broker.addr, cmd, 5.0)

    async def _on_check(self, conn, check: RemotingCommand) -> None:
        with self._lock:
            self.checks.append(check)
        conn.invoke_oneway(end_transaction_command(check, self.group, self.answer, checked=True))

    def checks_of(self, half_offset: int) -> list[RemotingCommand]:
        with self._lock:
            return [c for c in self.checks if c.ext_fields["tranStateTableOffset"] == str(half_offset)]

    def prepare(self, topic: str, body: bytes) -> tuple[RemotingCommand, str]:
        key = uniq_key()
        r = self.call(send_command(topic, body, queue_id=1, uniq=key, group=self.group,
                                   sys_flag=TRANSACTION_PREPARED_TYPE,
                                   extra={"TRAN_MSG": "true", "PGROUP": self.group}))
        assert r.code == ResponseCode.SUCCESS, r.remark
        return r, key

    def close(self) -> None:
        self.remoting.close()


@pytest.fixture
def producer(broker, request):
    made = []

    def make(group: str, answer: int) -> TransactionalProducer:
        made.append(TransactionalProducer(broker, group, answer))
        return made[-1]
    yield make
    for p in made:
        p.close()


def check_progress(broker) -> int:
    r = broker.call(group_command(RequestCode.QUERY_CONSUMER_OFFSET, CHECK_GROUP, topic=HALF_TOPIC, queueId=0))
    return int(r.ext_fields["offset"]) if r.code == ResponseCode.SUCCESS else -1


def pull_all(broker, topic: str) -> list:
    wait_until(lambda: broker.board("commitlog.dispatched") == broker.board("commitlog.written"))
    r = broker.call(pull_command(topic, 1, 0))
    return decode_records(r.body_bytes()) if r.code == ResponseCode.SUCCESS else []


def test_an_open_half_is_checked_back_and_committed(broker, producer):
    p = producer("tx_check_commit", TRANSACTION_COMMIT_TYPE)
    prepared, key = p.prepare("TxChecked", b"paid")
    half = int(prepared.ext_fields["queueOffset"])
    wait_until(lambda: pull_all(broker, "TxChecked"), timeout=10, message="the message committed by the check")
    [msg] = pull_all(broker, "TxChecked")
    assert msg.body == b"paid" and msg.uniq_key == key and msg.sys_flag & TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE
    [check] = p.checks_of(half)
    offset_msg_id = prepared.ext_fields["msgId"]
    assert check.ext_fields == {"tranStateTableOffset": str(half), "msgId": key, "transactionId": key,
                                "commitLogOffset": str(parse_offset_msg_id(offset_msg_id)[2]),
                                "offsetMsgId": offset_msg_id}
    shown = decode_record(check.body_bytes())            # the half under its real topic and queue
    assert (shown.topic, shown.queue_id, shown.body, shown.properties["TRAN_MSG"]) == ("TxChecked", 1, b"paid", "true")
    wait_until(lambda: check_progress(broker) > half, message="the check progress to pass the committed half")
    assert len(p.checks_of(half)) == 1                    # done: never checked again
    topics = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG)).body_bytes())["topicConfigTable"]
    for name in (HALF_TOPIC, OP_TOPIC):                   # created on first use, as 4.x does: open halves show as lag
        assert (topics[name]["readQueueNums"], topics[name]["writeQueueNums"], topics[name]["perm"]) == (1, 1, 6)


def test_a_half_rolled_back_by_its_check_is_not_delivered(broker, producer):
    p = producer("tx_check_rollback", TRANSACTION_ROLLBACK_TYPE)
    prepared, _ = p.prepare("TxCheckedBack", b"cancelled")
    half = int(prepared.ext_fields["queueOffset"])
    wait_until(lambda: check_progress(broker) > half, timeout=10, message="the rolled-back half to be done")
    assert len(p.checks_of(half)) == 1
    assert broker.call(send_command("TxCheckedBack", b"plain", queue_id=1)).code == ResponseCode.SUCCESS
    assert [m.body for m in pull_all(broker, "TxCheckedBack")] == [b"plain"]


def test_an_unknown_state_is_checked_again_until_the_limit_gives_it_up(broker, producer):
    p = producer("tx_check_unknown", 0)                   # the listener keeps answering UNKNOW
    prepared, _ = p.prepare("TxUndecided", b"maybe")
    half = int(prepared.ext_fields["queueOffset"])
    wait_until(lambda: check_progress(broker) > half, timeout=15, message="the half to be given up")
    assert len(p.checks_of(half)) == NODE_SETTINGS["transaction_check_max"]
    assert pull_all(broker, "TxUndecided") == []
    wait_until(lambda: "given up" in broker.node.log_text(), message="the give-up log line")


@pytest.mark.timeout(120)
def test_a_restart_never_checks_a_half_closed_past_the_progress(start_node):
    """The op record closing half 1 is read while an older half 0 holds the progress back: after a
    restart it must be read again, or half 1's producer would be asked (and commit a second time)."""
    broker = start_node({**NODE_SETTINGS, "transaction_check_max": 1000})
    undecided = TransactionalProducer(broker, "tx_slow", 0)
    decided = TransactionalProducer(broker, "tx_fast", TRANSACTION_COMMIT_TYPE)
    try:
        first, _ = undecided.prepare("TxHeld", b"held")
        second, _ = decided.prepare("TxDone", b"done")
        assert decided.call(end_transaction_command(second, "tx_fast")).code == ResponseCode.SUCCESS
        wait_until(lambda: undecided.checks_of(int(first.ext_fields["queueOffset"])), timeout=10,
                   message="a pass after the commit")
        assert check_progress(broker) == int(first.ext_fields["queueOffset"])         # held back by half 0
    finally:
        undecided.close()
        decided.close()
    assert broker.node.stop() == 0
    broker.node = restart_broker(broker.node)
    undecided = TransactionalProducer(broker, "tx_slow", 0)
    decided = TransactionalProducer(broker, "tx_fast", TRANSACTION_COMMIT_TYPE)
    try:
        wait_until(lambda: undecided.checks_of(int(first.ext_fields["queueOffset"])), timeout=10,
                   message="a pass after the restart")
        assert decided.checks == []
        assert [m.body for m in pull_all(broker, "TxDone")] == [b"done"]
    finally:
        undecided.close()
        decided.close()
