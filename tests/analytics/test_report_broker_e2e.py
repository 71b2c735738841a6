"""The report's numbers equal what a test sent and pulled through a real broker: the broker (1-second
stats windows) writes its stats files, analytics.report.run_report reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from analytics.report import run_report
from tests.support.broker import (batch_command, pull_command, send_command, start_broker, stats_records,
                                    update_offset_command)
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import ResponseCode
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(300)

SENT = {"Orders": 40, "Logs": 15}


def pull_all(client, addr: str, topic: str, group: str, queues: int) -> tuple[int, int]:
    """Pull every message of the topic as group; (messages, bytes)."""
    msgs = size = 0
    for q in range(queues):
        offset = 0
        while True:
            r = client.invoke(addr, pull_command(topic, q, offset, max_nums=8, group=group))
            if r.code != ResponseCode.SUCCESS:
                break
            body = r.body_bytes()
            msgs += int(r.ext_fields["nextBeginOffset"]) - offset
            size += len(body)
            offset = int(r.ext_fields["nextBeginOffset"])
    return msgs, size


def by(frame, key):
    return {row[key]: row for row in frame.to_dict("records")}


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """A broker that took SENT and served them; its stats folder once the records add up."""
    node = start_broker(tmp_path_factory.mktemp("e2e") / "node", {"stats_interval": 1, "topics": "Orders:2;Logs:1"})
    client = BlockingRemotingClient()
    try:
        addr = f"127.0.0.1:{node.port}"
        sends = 0
        for i in range(SENT["Orders"]):
            assert client.invoke(addr, send_command("Orders", b"o" * (50 + i), queue_id=i % 2)).code == 0
            sends += 1
        for start in range(0, SENT["Logs"], 5):
            assert client.invoke(addr, batch_command("Logs", [(b"l" * 20, "") for _ in range(5)])).code == 0
            sends += 1
        wait_until(lambda: client.invoke(addr, pull_command("Logs", 0, SENT["Logs"] - 1, group="Probe")).code == 0,
                   message="everything dispatched")
        orders = pull_all(client, addr, "Orders", "G1", 2)
        logs = pull_all(client, addr, "Logs", "G2", 1)
        assert orders[0] == SENT["Orders"] and logs[0] == SENT["Logs"]
        assert client.invoke(addr, update_offset_command("G1", "Orders", 0, 5)).code == 0

        def complete():
            recs = stats_records(node.store)
            puts = sum(r["totals"]["put_msgs"] for r in recs)
            gets = sum(g["get_msgs"] for r in recs for g in r["groups"] if g["group"] in ("G1", "G2"))
            return puts == sum(SENT.values()) and gets == sum(SENT.values()) and any(r["lag"] for r in recs)
        wait_until(complete, timeout=20, interval=0.2, message="stats records adding up to the traffic")
        yield node.store / "stats", {"Orders": orders, "Logs": logs}, sends
    finally:
        client.close()
        node.reap()


def test_report_numbers_equal_what_was_sent_and_pulled(spark, traffic, tmp_path):
    stats_dir, pulled, sends = traffic
    report = run_report(spark, [str(stats_dir)], tmp_path / "out")
    assert report.summary.bad_total == 0 and report.summary.used > 0
    topics = by(report.frames["top_topics"], "topic")
    for topic, count in SENT.items():
        # every message was pulled back whole, so the bytes pulled are the bytes stored
        assert (topics[topic]["put_msgs"], topics[topic]["put_bytes"]) == (count, pulled[topic][1])
    groups = by(report.frames["top_groups"], "group")
    assert groups["G1"]["get_msgs"] == SENT["Orders"] and groups["G2"]["get_msgs"] == SENT["Logs"]
    assert groups["G1"]["topics"] == "Orders"
    probe = groups["Probe"]["get_msgs"]                     # the readiness probe's pulls count too
    load = by(report.frames["broker_load"], "broker")["broker-a"]
    assert (load["put_msgs"], load["get_msgs"]) == (sum(SENT.values()), sum(SENT.values()) + probe)
    latency = by(report.frames["latency_overall"], "kind")
    assert latency["send"]["count"] == sends
    lag = report.frames["lag_summary"].to_dict("records")
    assert any(r["group"] == "G1" and r["topic"] == "Orders" and r["latest_lag"] == 15 for r in lag), lag
    assert (Path(report.out) / "index.html").exists()
