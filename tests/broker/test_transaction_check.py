"""The transaction check-back against a real node: a half message left without END_TRANSACTION is
sent to a producer of its group as CHECK_TRANSACTION_STATE, and the producer's answer (END_TRANSACTION
with fromTransactionCheck, as the Java client sends it) commits it, rolls it back, or leaves it for
the next pass until the check limit gives it up."""

from __future__ import annotations

import json
import threading

import pytest

from smartgo.broker.schedule.schedule_message import HALF_TOPIC, OP_TOPIC
from tests.support.broker import (FREE_PORT, end_transaction_command, group_command, heartbeat_body, metric_value,
                                    parse_metrics, pull_command, restart_broker, scrape_metrics, send_command,
                                    stats_records, uniq_key)
from smartgo.broker.transaction.transaction_check import CHECK_GROUP
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import TRANS_CHECK_MAX_TIME_TOPIC, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import (TRANSACTION_COMMIT_TYPE, TRANSACTION_MASK, TRANSACTION_PREPARED_TYPE,
                                  TRANSACTION_ROLLBACK_TYPE, decode_record, decode_records, parse_offset_msg_id)
from tests.support.waits import wait_until

NODE_SETTINGS = {"transaction_timeout": 1.0, "transaction_check_interval": 0.2, "transaction_check_max": 3,
                 "metrics_port": FREE_PORT, "metrics_host": "127.0.0.1", "stats_interval": 1}


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


def pull_all(broker, topic: str, queue_id: int = 1) -> list:
    wait_until(lambda: broker.board("commitlog.dispatched") == broker.board("commitlog.written"))
    r = broker.call(pull_command(topic, queue_id, 0))
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


def test_the_metrics_page_counts_commits_rollbacks_and_open_halves(broker, producer):
    """5.x's transaction families: commits and rollbacks by the message's topic with the seconds
    from each half's birth, and the halves open at the last check-back pass, by topic (gone once
    the check-back gives the half up)."""
    p = producer("tx_metrics", 0)                         # checks answered UNKNOW: the open half stays open
    for body, ending in ((b"yes", TRANSACTION_COMMIT_TYPE), (b"no", TRANSACTION_ROLLBACK_TYPE)):
        prepared, _ = p.prepare("TxMetrics", body)
        assert p.call(end_transaction_command(prepared, "tx_metrics", ending)).code == ResponseCode.SUCCESS
    p.prepare("TxMetricsOpen", b"maybe")

    def page_with(*wanted: tuple[str, str]):
        samples = parse_metrics(scrape_metrics(broker.node.metrics_port)[2])
        return samples if all(metric_value(samples, name, topic=topic) for name, topic in wanted) else None
    samples = wait_until(lambda: page_with(("rocketmq_half_messages", "TxMetricsOpen"),    # the check-back's pass
                                           ("rocketmq_commit_messages_total", "TxMetrics"),   # the net actor's
                                           ("rocketmq_rollback_messages_total", "TxMetrics")),   # flushes (one
                         timeout=10, message="the open half and the ended ones on the page")  # may fall between)
    assert metric_value(samples, "rocketmq_half_messages", topic="TxMetricsOpen") == 1
    assert metric_value(samples, "rocketmq_half_messages", topic="TxMetrics") is None       # both ended
    assert metric_value(samples, "rocketmq_commit_messages_total", topic="TxMetrics") == 1
    assert metric_value(samples, "rocketmq_rollback_messages_total", topic="TxMetrics") == 1
    assert metric_value(samples, "rocketmq_finish_message_latency_bucket", topic="TxMetrics", le="5.0") == 2
    assert metric_value(samples, "rocketmq_finish_message_latency_count", topic="TxMetrics") == 2
    assert metric_value(samples, "rocketmq_finish_message_latency_sum", topic="TxMetrics") <= 4
    wait_until(lambda: page_with(("rocketmq_half_messages", "TxMetricsOpen")) is None, timeout=15,
               message="the given-up half off the page")

    def recorded() -> tuple[int, int]:                    # the stats files' transactions[] (docs/STATS.md)
        ended = [x for r in stats_records(broker.node.store) for x in r.get("transactions", ())
                 if x["topic"] == "TxMetrics"]
        return sum(x["commits"] for x in ended), sum(x["rollbacks"] for x in ended)
    wait_until(lambda: recorded() == (1, 1), timeout=10, message="the transactions in the stats records")


def resume(broker, msg_id: str) -> RemotingCommand:
    return broker.call(RemotingCommand(RequestCode.RESUME_CHECK_HALF_MESSAGE, ext_fields={"msgId": msg_id}))


def test_a_given_up_half_is_copied_aside_and_resuming_it_has_it_checked_again(broker, producer, capsys):
    """4.x's TRANS_CHECK_MAX_TIME_TOPIC and RESUME_CHECK_HALF_MESSAGE (323), over the wire, then
    through the admin CLI by the transaction's msgId."""
    from smartgo.cli.main import main
    p = producer("tx_resumed", 0)                         # UNKNOW, until its transaction is decided
    prepared, key = p.prepare("TxResumed", b"late")
    half = int(prepared.ext_fields["queueOffset"])

    def copies() -> list:                                 # other tests of the module give halves up too
        return [m for m in pull_all(broker, TRANS_CHECK_MAX_TIME_TOPIC, 0) if m.uniq_key == key]
    wait_until(copies, timeout=15, message="the given-up copy")
    [copy] = copies()
    assert (copy.topic, copy.queue_id, copy.body, copy.reconsume_times) == (TRANS_CHECK_MAX_TIME_TOPIC, 0, b"late", 0)
    assert {k: copy.properties.get(k) for k in ("REAL_TOPIC", "REAL_QID", "PGROUP", "UNIQ_KEY", "TRAN_MSG",
                                                "TRANSACTION_CHECK_TIMES")} == {
        "REAL_TOPIC": "TxResumed", "REAL_QID": "1", "PGROUP": "tx_resumed", "UNIQ_KEY": key, "TRAN_MSG": "true",
        "TRANSACTION_CHECK_TIMES": str(NODE_SETTINGS["transaction_check_max"])}
    wait_until(lambda: "copied to TRANS_CHECK_MAX_TIME_TOPIC as " + copy.msg_id in broker.node.log_text(),
               message="the copy's log line")
    assert len(p.checks_of(half)) == NODE_SETTINGS["transaction_check_max"]

    # refusals: SYSTEM_ERROR with 4.x's remark and the reason; nothing is stored
    plain = broker.call(send_command("TxResumed", b"plain", queue_id=0)).ext_fields["msgId"]
    written = broker.board("commitlog.written")
    host, offset = copy.msg_id[:-16], int(copy.msg_id[-16:], 16)
    other_port = host[:8] + f"{(int(host[8:], 16) + 1) % 65536:08X}"
    for msg_id, reason in [("not-an-id", "bad msgId"), (plain, "is not a transaction half message"),
                           (f"{host}{offset + (1 << 30):016X}", "no message"),
                           (other_port + copy.msg_id[-16:], "names another broker"),
                           (f"{host}{offset + 1:016X}", "no message")]:                # inside the copy's record
        refused = resume(broker, msg_id)
        assert refused.code == ResponseCode.SYSTEM_ERROR, msg_id
        assert refused.remark.startswith(f"Exception was thrown when putting message back to {HALF_TOPIC}. ")
        assert reason in refused.remark, (msg_id, refused.remark)
    assert broker.board("commitlog.written") == written

    p.answer = TRANSACTION_COMMIT_TYPE                    # the transaction is decided now
    resumed = resume(broker, copy.msg_id)
    assert (resumed.code, resumed.remark, resumed.ext_fields or {}) == (ResponseCode.SUCCESS, None, {})
    wait_until(lambda: pull_all(broker, "TxResumed"), timeout=10, message="the resumed half committed by its check")
    [msg] = pull_all(broker, "TxResumed")
    assert (msg.body, msg.uniq_key) == (b"late", key)
    [again] = [c for c in p.checks if c.ext_fields["msgId"] == key and c.ext_fields["tranStateTableOffset"] != str(half)]
    assert int(again.ext_fields["tranStateTableOffset"]) > half              # a new half, checked from 0
    broker.node.logged(f"half message {copy.msg_id} put back in {HALF_TOPIC}")

    # the admin CLI: list the given-up copies, resume one by the transaction's msgId (its UNIQ_KEY)
    assert main(["admin", "tx-given-up", "--json", "-n", broker.registry]) == 0
    [listed] = [m for m in json.loads(capsys.readouterr().out)["messages"] if m["msg_id"] == key]
    assert (listed["offset_msg_id"], listed["msg_id"], listed["properties"]["REAL_TOPIC"]) == (copy.msg_id, key,
                                                                                                "TxResumed")
    assert main(["admin", "tx-resume", "--id", key, "--json", "-n", broker.registry]) == 0
    assert json.loads(capsys.readouterr().out) == {"resumed": copy.msg_id}
    wait_until(lambda: len(pull_all(broker, "TxResumed")) == 2, timeout=10, message="the second resume's commit")


@pytest.mark.timeout(120)
def test_a_restart_goes_on_counting_a_half_s_checks(start_node):
    """transaction_check_max 2: a half checked once (or twice) before a restart is given up after
    two checks in all, not two more (the counts are in config/transactionChecks.json). A check due
    before the producer is back counts too, as in 4.x: the log names it."""
    broker = start_node({**NODE_SETTINGS, "transaction_check_max": 2, "metrics_port": 0})
    undecided = TransactionalProducer(broker, "tx_counted", 0)
    try:
        prepared, _ = undecided.prepare("TxCounted", b"maybe")
        half = int(prepared.ext_fields["queueOffset"])
        wait_until(lambda: undecided.checks_of(half), timeout=10, message="the first check")
    finally:
        undecided.close()
    assert broker.node.stop() == 0
    before = len(undecided.checks_of(half))
    saved = json.loads((broker.node.store / "config" / "transactionChecks.json").read_text())
    assert saved["checks"][str(half)][0] == before
    broker.node = restart_broker(broker.node)
    undecided = TransactionalProducer(broker, "tx_counted", 0)
    try:
        wait_until(lambda: check_progress(broker) > half, timeout=15, message="the half to be given up")
        missed = broker.node.log_text().count(f"half message {half} of group tx_counted is open, and no producer")
        assert before + len(undecided.checks_of(half)) + missed == 2
    finally:
        undecided.close()
    assert pull_all(broker, "TxCounted") == []
    wait_until(lambda: "given up" in broker.node.log_text(), message="the give-up log line")


@pytest.mark.timeout(120)
def test_a_restart_never_checks_a_half_closed_past_the_progress(start_node):
    """The op record closing half 1 is read while an older half 0 holds the progress back: after a
    restart it must be read again, or half 1's producer would be asked (and commit a second time)."""
    broker = start_node({**NODE_SETTINGS, "transaction_check_max": 1000, "metrics_port": 0})
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
