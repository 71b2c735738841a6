"""Transactional messages against a real node, with the requests a Java TransactionMQProducer sends:
the half message (TRAN_MSG) kept from consumers in RMQ_SYS_TRANS_HALF_TOPIC, END_TRANSACTION
commit and rollback with their op records, the refusals of checkPrepareMessage, malformed
headers, and a half that outlives a kill -9 of the node."""

from __future__ import annotations

import signal
import socket

import pytest

from smartgo.broker.schedule.schedule_message import HALF_TOPIC, OP_TOPIC
from tests.support.broker import (batch_command, end_transaction_command, message_properties, pull_command,
                                    restart_broker, send_command, uniq_key)
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import RemotingTimeoutError
from smartgo.net.frame import encode_command
from smartgo.store.record import (TRANSACTION_COMMIT_TYPE, TRANSACTION_MASK, TRANSACTION_PREPARED_TYPE,
                                  TRANSACTION_ROLLBACK_TYPE, decode_record, decode_records, parse_offset_msg_id)
from tests.support.waits import wait_until

GROUP = "tx_producer"


def prepare(broker, topic: str, body: bytes, group: str = GROUP) -> tuple[RemotingCommand, str]:
    """A half message as TransactionMQProducer sends it: sysFlag PREPARED, TRAN_MSG and PGROUP."""
    key = uniq_key()
    r = broker.call(send_command(topic, body, queue_id=1, uniq=key, group=group, sys_flag=TRANSACTION_PREPARED_TYPE,
                                 extra={"TRAN_MSG": "true", "PGROUP": group}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return r, key


def stored(broker) -> list:
    """Every record of the node's (first) CommitLog file: the op records' topic has no route."""
    written = broker.board("commitlog.written")
    return decode_records((broker.node.store / "commitlog" / f"{0:020d}").read_bytes()[:written])


def pull_all(broker, topic: str, queue_id: int) -> list:
    """Everything in the queue once dispatch has caught up with what was acknowledged."""
    wait_until(lambda: broker.board("commitlog.dispatched") == broker.board("commitlog.written"))
    r = broker.call(pull_command(topic, queue_id, 0))
    return decode_records(r.body_bytes()) if r.code == ResponseCode.SUCCESS else []


def test_commit_delivers_the_half_message_to_its_topic(broker):
    prepared, key = prepare(broker, "TxCommit", b"order-1")
    assert prepared.ext_fields["queueId"] == "1"          # the real queue, with the half queue's offset
    half_offset = parse_offset_msg_id(prepared.ext_fields["msgId"])[2]
    view = broker.call(RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID, ext_fields={
        "offset": str(half_offset)}))
    half = decode_record(view.body_bytes())
    assert (half.topic, half.queue_id, half.queue_offset) == (HALF_TOPIC, 0, int(prepared.ext_fields["queueOffset"]))
    assert half.sys_flag & TRANSACTION_MASK == 0 and half.properties["TRAN_MSG"] == "true"
    assert half.properties["REAL_TOPIC"] == "TxCommit" and half.properties["REAL_QID"] == "1"
    assert pull_all(broker, "TxCommit", 1) == []          # consumers do not see a half message

    commit = end_transaction_command(prepared, GROUP, TRANSACTION_COMMIT_TYPE)
    broker.client.invoke_oneway(broker.addr, commit)      # oneway: the Java client's way
    wait_until(lambda: pull_all(broker, "TxCommit", 1), message="the committed message")
    [msg] = pull_all(broker, "TxCommit", 1)
    assert (msg.body, msg.uniq_key, msg.born_timestamp, msg.queue_offset) == (b"order-1", key, half.born_timestamp, 0)
    assert msg.sys_flag & TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE
    assert msg.prepared_transaction_offset == half_offset
    assert not {"TRAN_MSG", "REAL_TOPIC", "REAL_QID"} & set(msg.properties) and msg.properties["PGROUP"] == GROUP
    wait_until(lambda: any(m.topic == OP_TOPIC for m in stored(broker)), message="the op record")
    [op] = [m for m in stored(broker) if m.topic == OP_TOPIC]
    assert (op.queue_id, op.tags, op.body) == (0, "d", prepared.ext_fields["queueOffset"].encode())



def test_a_commit_whose_producer_hangs_up_at_once_is_stored_once_and_marked_done(broker):
    """A producer that sends END_TRANSACTION oneway and closes its connection in the same breath
    (a command-line tool exiting): the commit and its op record still land, so the check-back
    never asks about the half and the message is stored once. (Closing the connection used to
    cancel the commit between storing the message and storing the op record.)"""
    prepared, _ = prepare(broker, "TxHangUp", b"order-5")
    ops_before = sum(m.topic == OP_TOPIC for m in stored(broker))
    frame = b"".join(bytes(b) for b in encode_command(end_transaction_command(prepared, GROUP,
                                                                               TRANSACTION_COMMIT_TYPE)))
    with socket.create_connection(("127.0.0.1", broker.node.port), timeout=5) as s:
        s.sendall(frame)
    wait_until(lambda: sum(m.topic == OP_TOPIC for m in stored(broker)) == ops_before + 1, message="the op record")
    assert [m.body for m in pull_all(broker, "TxHangUp", 1)] == [b"order-5"]

def test_rollback_delivers_nothing_and_marks_the_half_done(broker):
    prepared, _ = prepare(broker, "TxRollback", b"order-2")
    r = broker.call(end_transaction_command(prepared, GROUP, TRANSACTION_ROLLBACK_TYPE))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert broker.call(send_command("TxRollback", b"plain", queue_id=1)).code == ResponseCode.SUCCESS
    assert [m.body for m in pull_all(broker, "TxRollback", 1)] == [b"plain"]      # dispatched past the half
    ops = [m for m in stored(broker) if m.topic == OP_TOPIC]
    assert prepared.ext_fields["queueOffset"].encode() in [op.body for op in ops]


@pytest.mark.parametrize("case, overrides, remark", [
    ("Group", {"producerGroup": "other_group"}, "The producer group wrong"),
    ("Table", {"tranStateTableOffset": "12345"}, "The transaction state table offset wrong"),
    ("Offset", {"commitLogOffset": str(1 << 40)}, "Find prepared transaction message failed"),
])
def test_end_transaction_refusals_leave_the_half_to_commit(broker, case, overrides, remark):
    topic = f"TxRefused{case}"
    prepared, _ = prepare(broker, topic, b"order-3")
    r = broker.call(end_transaction_command(prepared, GROUP, TRANSACTION_COMMIT_TYPE, **overrides))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, remark)
    assert broker.call(end_transaction_command(prepared, GROUP, TRANSACTION_COMMIT_TYPE)).code == ResponseCode.SUCCESS
    assert [m.body for m in pull_all(broker, topic, 1)] == [b"order-3"]


def test_only_a_half_message_can_be_ended(broker):
    plain = broker.call(send_command("TxPlain", b"not a half", queue_id=1))
    r = broker.call(end_transaction_command(plain, GROUP, TRANSACTION_COMMIT_TYPE))
    assert r.code == ResponseCode.SYSTEM_ERROR and "not a half message" in r.remark
    assert [m.body for m in pull_all(broker, "TxPlain", 1)] == [b"not a half"]      # not stored twice


def test_an_unknown_state_gets_no_answer_and_the_connection_serves_on(broker):
    prepared, _ = prepare(broker, "TxUnknown", b"order-4")
    with pytest.raises(RemotingTimeoutError):
        broker.call(end_transaction_command(prepared, GROUP, 0), timeout=0.5)   # NOT_TYPE: Java does not answer either
    assert broker.call(end_transaction_command(prepared, GROUP, TRANSACTION_COMMIT_TYPE)).code == ResponseCode.SUCCESS


def test_a_transactional_batch_is_refused(broker):
    batch = batch_command("TxBatch", [(b"a", message_properties(uniq=uniq_key())), (b"b", "")], queue_id=0)
    batch.ext_fields["i"] = message_properties(extra={"TRAN_MSG": "true", "PGROUP": GROUP})   # the batch's own
    r = broker.call(batch)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "TRAN_MSG" in r.remark


@pytest.mark.parametrize("overrides, remark", [
    ({"commitLogOffset": None}, "the custom field commitLogOffset is null"),
    ({"tranStateTableOffset": "seven"}, "tranStateTableOffset"),
])
def test_a_malformed_end_transaction_is_refused_and_the_connection_serves_on(broker, overrides, remark):
    prepared, _ = prepare(broker, "TxMalformed", b"order-5")
    bad = end_transaction_command(prepared, GROUP, TRANSACTION_COMMIT_TYPE)
    for name, value in overrides.items():
        if value is None:
            del bad.ext_fields[name]
        else:
            bad.ext_fields[name] = value
    r = broker.call(bad)
    assert r.code == ResponseCode.SYSTEM_ERROR and remark in r.remark
    assert broker.call(end_transaction_command(prepared, GROUP, TRANSACTION_COMMIT_TYPE)).code == ResponseCode.SUCCESS


@pytest.mark.timeout(120)
def test_a_half_survives_a_kill_of_the_whole_node(start_node):
    node_broker = start_node()
    prepared, key = prepare(node_broker, "TxSurvives", b"order-6")
    node_broker.node.stop(signal.SIGKILL)
    node_broker.node.reap()
    node_broker.node = restart_broker(node_broker.node)
    assert node_broker.call(end_transaction_command(prepared, GROUP, TRANSACTION_COMMIT_TYPE)).code == \
        ResponseCode.SUCCESS
    wait_until(lambda: pull_all(node_broker, "TxSurvives", 1), message="the committed message after the restart")
    assert [m.uniq_key for m in pull_all(node_broker, "TxSurvives", 1)] == [key]
