"""The board's queue table at its load limit: a send that would open one more queue, and a topic
that would need more, are refused with the reason while the node serves every queue it has; a
restart sizes the table from the store, even below the queues it holds."""

from __future__ import annotations

import pytest

from tests.support.broker import (FREE_PORT, metric_value, parse_metrics, pull_command, restart_broker,
                                    scrape_metrics, send_command)
from smartgo.client import Admin
from smartgo.cli.health import render
from smartgo.client.errors import BrokerError
from smartgo.net.codes import ResponseCode
from smartgo.store.record import decode_records
from tests.support.waits import wait_until

LIMIT = 48                                      # 75% of board_queue_capacity 64


def _pulled(broker, topic: str, queue_id: int) -> list[bytes]:
    return [m.body for m in decode_records(broker.call(pull_command(topic, queue_id, 0)).body_bytes())]


@pytest.mark.timeout(120)
def test_a_full_queue_table_refuses_new_queues_and_a_restart_sizes_it(start_node):
    broker = start_node({"board_queue_capacity": 64, "topics": "Wide:40,More:40", "metrics_port": FREE_PORT,
                         "metrics_host": "127.0.0.1"})
    for q in range(40):
        assert broker.call(send_command("Wide", b"w%d" % q, queue_id=q)).code == ResponseCode.SUCCESS
    answers = [broker.call(send_command("More", b"m%d" % q, queue_id=q)) for q in range(40)]
    stored = [q for q, r in enumerate(answers) if r.code == ResponseCode.SUCCESS]
    assert stored == list(range(LIMIT - 40)), [(r.code, r.remark) for r in answers]
    refused = answers[LIMIT - 40]
    assert refused.code == ResponseCode.SYSTEM_ERROR
    assert f"cannot open another queue: its queue table is full ({LIMIT} queues" in refused.remark
    assert all(r.code == ResponseCode.SYSTEM_ERROR for r in answers[LIMIT - 40:])
    assert broker.call(send_command("Wide", b"again", queue_id=3)).code == ResponseCode.SUCCESS   # open queues go on
    wait_until(lambda: _pulled(broker, "Wide", 3) == [b"w3", b"again"], message="Wide:3 dispatched")
    with Admin(broker.registry) as admin, pytest.raises(BrokerError, match="room for 0 more queues, not 4"):
        admin.create_topic("Third", 4, broker_addr=broker.addr)      # counts dispatched queues: after the wait
    assert _pulled(broker, "More", LIMIT - 41) == [b"m%d" % (LIMIT - 41)]
    report = broker.node.health()
    assert report["healthy"] and broker.node.actor("dispatch")["restarts"] == 0
    assert (report["node"]["queues"], report["node"]["queue_limit"]) == (LIMIT, LIMIT)
    assert f"queues {LIMIT} of {LIMIT}" in render(report)
    page = parse_metrics(scrape_metrics(broker.node.metrics_port)[2])
    assert metric_value(page, "smartgo_queue_table_queues") == metric_value(page, "smartgo_queue_limit") == LIMIT
    broker.node.logged("send refused: no room for queue 8 of topic More: the broker holds 48 queues",
                       "topic Third refused")

    broker.node.stop()                          # smaller than the store's 48 queues: dispatch failed to start before
    config = broker.node.store.with_name(broker.node.store.name + ".toml")
    config.write_text(config.read_text().replace("board_queue_capacity = 64", "board_queue_capacity = 32"))
    broker.node = restart_broker(broker.node)
    assert "the board's queue table is sized for 128 entries (board_queue_capacity 32): the store has 48 queues" \
        in broker.node.log_text()
    for q in range(LIMIT - 40, 40):
        assert broker.call(send_command("More", b"m%d" % q, queue_id=q)).code == ResponseCode.SUCCESS
    wait_until(lambda: _pulled(broker, "More", 39) == [b"m39"], message="More:39 dispatched")
    assert _pulled(broker, "Wide", 3) == [b"w3", b"again"] and _pulled(broker, "More", 0) == [b"m0"]


@pytest.mark.timeout(120)
def test_a_slave_whose_table_overflows_restarts_sized_from_its_store(start_node, slaves):
    """The master's table is larger: the slave's dispatch cannot publish its 25th queue, fails,
    and the node restart that escalation brings sizes the table from the queues it copied."""
    master = start_node({"board_queue_capacity": 128, "topics": "Wide:40"})
    slave = slaves(master.node, {"board_queue_capacity": 32})
    for q in range(40):
        assert master.call(send_command("Wide", b"w%d" % q, queue_id=q)).code == ResponseCode.SUCCESS
    slave_addr = f"127.0.0.1:{slave.port}"

    def copied() -> bool:
        try:
            answer = master.client.invoke(slave_addr, pull_command("Wide", 39, 0), 5.0)
        except (ConnectionError, TimeoutError):         # the slave node restarts
            return False
        return answer.code == ResponseCode.SUCCESS and [m.body for m in decode_records(answer.body_bytes())] == [b"w39"]
    wait_until(copied, timeout=60, message="the slave serves the 40th queue")
    slave.logged("the board's queue table is full (24 queues", "the board's queue table is sized for", "the store has")
    assert slave.wait_healthy()["healthy"]
