"""Timer messages (5.x's TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS) against a real node:
never delivered early, within the precision after, hopping through the schedule queues on the
way; what the delivered copy keeps; refusals; the SDK's and the CLI's way to send one."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.schedule import max_offset, pull_all, view
from tests.support.broker import FREE_PORT, batch_command, parse_metrics, scrape_metrics, send_command, uniq_key
from smartgo.client import AsyncProducer, Message
from smartgo.net.codes import ResponseCode
from smartgo.net.loop import run
from smartgo.store.config import TIMER_FIRST_LEVEL
from smartgo.store.record import SCHEDULE_TOPIC
from tests.support.waits import wait_until

PRECISION_MS = 200
NODE_SETTINGS = {"topics": "Timed:3;Sdk:1;Cli:1;Refused:1", "timer_precision_ms": PRECISION_MS,
                 "timer_max_delay_sec": 600, "metrics_port": FREE_PORT, "metrics_host": "127.0.0.1"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def timers_waiting(broker) -> int:
    """smartgo_schedule_waiting_messages summed over the timer hop levels."""
    status, _, text = scrape_metrics(broker.node.metrics_port)
    assert status == 200
    return sum(v for (name, labels), v in parse_metrics(text).items()
               if name == "smartgo_schedule_waiting_messages" and ("kind", "timer") in labels)


@pytest.mark.timeout(60)
def test_timer_messages_arrive_at_their_time_never_before_after_their_hops(broker):
    asked = {0: {"TIMER_DELAY_MS": "1500"}, 1: {"TIMER_DELAY_SEC": "1"},
             2: {"TIMER_DELIVER_MS": str(now_ms() + 2500)}}
    sent = {}
    for q, timer in asked.items():
        key = uniq_key()
        r = broker.call(send_command("Timed", f"body-{q}".encode(), queue_id=q, uniq=key, tags="T", extra=timer))
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert r.ext_fields["queueId"] == str(q)                # the real queue, as for a delay level
        sent[q] = (key, view(broker.call, r.ext_fields["msgId"]))
    for q, (_, first) in sent.items():
        assert first.topic == SCHEDULE_TOPIC and int(first.properties["DELAY"]) >= TIMER_FIRST_LEVEL
        assert (first.properties["REAL_TOPIC"], first.properties["REAL_QID"]) == ("Timed", str(q))
        assert int(first.properties["TIMER_OUT_MS"]) > first.store_timestamp
        assert max_offset(broker.call, "Timed", q) == 0

    def counted() -> bool:
        """All three wait at the timer levels once dispatch has indexed them (a hop not yet saved in
        delayOffset.json counts twice), and before the first is due (1 s)."""
        assert not any(max_offset(broker.call, "Timed", q) for q in sent), "a timer arrived before it was counted"
        return timers_waiting(broker) >= 3
    wait_until(counted, timeout=5, interval=0.02, message="three timers counted waiting")

    def arrived() -> bool:
        for q, (_, first) in sent.items():
            if not max_offset(broker.call, "Timed", q):
                assert now_ms() < int(first.properties["TIMER_OUT_MS"]) + PRECISION_MS + 2000, f"queue {q} is late"
        return all(max_offset(broker.call, "Timed", q) for q in sent)
    wait_until(arrived, timeout=20, interval=0.02, message="every timer message")

    for q, (key, first) in sent.items():
        [copy] = pull_all(broker.call, "Timed", q)
        due = int(first.properties["TIMER_OUT_MS"])
        assert 0 <= copy.store_timestamp - due < PRECISION_MS + 1000, copy.store_timestamp - due
        assert (copy.topic, copy.queue_id, copy.uniq_key, copy.tags, copy.body) == ("Timed", q, key, "T",
                                                                                   f"body-{q}".encode())
        assert copy.born_timestamp == first.born_timestamp and "DELAY" not in copy.properties
        assert int(copy.properties["TIMER_ROLL_TIMES"]) >= 1       # 1-2.5 s at 200 ms: two hops or more
        assert {k: v for k, v in copy.properties.items() if k != "TIMER_ROLL_TIMES"} == {
            k: v for k, v in first.properties.items() if k != "DELAY"}
    wait_until(lambda: timers_waiting(broker) == 0, timeout=10, message="no timer waiting on the metrics page")


def test_a_time_already_past_is_stored_at_once(broker):
    r = broker.call(send_command("Timed", b"late", queue_id=0, extra={"TIMER_DELIVER_MS": str(now_ms() - 1000)}))
    assert r.code == ResponseCode.SUCCESS
    stored = view(broker.call, r.ext_fields["msgId"])
    assert (stored.topic, stored.queue_id) == ("Timed", 0) and "TIMER_OUT_MS" not in stored.properties


@pytest.mark.parametrize("timer, remark", [
    ({"TIMER_DELAY_SEC": "later"}, "TIMER_DELAY_SEC 'later' is not an integer"),
    ({"TIMER_DELAY_SEC": "601"}, "bigger than the max delay 600000ms"),
    ({"TIMER_DELIVER_MS": str(2 ** 70)}, "bigger than the max delay"),
])
def test_a_bad_timer_is_refused_and_the_connection_serves_on(broker, timer, remark):
    r = broker.call(send_command("Refused", b"x", extra=timer))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and remark in r.remark, r.remark
    batch = batch_command("Refused", [(b"a", ""), (b"b", "")])
    batch.ext_fields["i"] = "TIMER_DELAY_MS\x011000"
    r = broker.call(batch)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "a batch cannot be delayed" in r.remark
    assert broker.call(send_command("Refused", b"fine")).code == ResponseCode.SUCCESS
    assert max_offset(broker.call, SCHEDULE_TOPIC, TIMER_FIRST_LEVEL - 1 + 9) == 0   # the 600 s hop: none stored


@pytest.mark.timeout(60)
def test_the_sdk_and_the_cli_send_timer_messages(broker):
    async def send() -> tuple:
        async with AsyncProducer("timer_producer", broker.registry) as producer:
            at = now_ms() + 1000
            by_time = await producer.send(Message("Sdk", b"at", deliver_time_ms=at))
            after = await producer.send(Message("Sdk", b"after", delay_time_ms=700))
            return at, by_time, after
    at, by_time, after = run(send())
    done = subprocess.run([sys.executable, "-m", "smartgo.cli", "send", "--registry", broker.registry, "--topic",
                           "Cli", "--body", "cli", "--delay-ms", "800", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "SEND_OK"
    wait_until(lambda: max_offset(broker.call, "Sdk", 0) == 2 and max_offset(broker.call, "Cli", 0) == 1,
               timeout=20, message="the SDK's and the CLI's timer messages")
    got = {m.body: m for m in pull_all(broker.call, "Sdk", 0)}
    assert got[b"at"].store_timestamp >= at and got[b"at"].uniq_key == by_time.msg_id
    assert got[b"after"].properties["TIMER_DELAY_MS"] == "700" and got[b"after"].uniq_key == after.msg_id
    [cli] = pull_all(broker.call, "Cli", 0)
    assert cli.properties["TIMER_DELAY_MS"] == "800" and cli.store_timestamp >= int(cli.properties["TIMER_OUT_MS"])


def test_a_node_with_timers_off_refuses_them(start_node):
    broker = start_node({"topics": "Off:1", "timer_wheel_enable": "false"})
    r = broker.call(send_command("Off", b"x", extra={"TIMER_DELAY_MS": "1000"}))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "timer_wheel_enable is false" in r.remark
    assert broker.call(send_command("Off", b"x", extra={"DELAY": "1"})).code == ResponseCode.SUCCESS
