"""CONSUMER_SEND_MSG_BACK (36) against a real node: retry through the schedule actor with growing
delay levels, the DLQ past the limit (the request's or the group's), what the copies keep, and
refusals that leave the connection serving."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.schedule import max_offset, pull_all, view
from tests.support.broker import send_command, uniq_key
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import SCHEDULE_TOPIC, MessageExt, parse_offset_msg_id
from tests.support.waits import wait_until

# levels 3, 4, 5 (the first three send-backs with delay level 0) wait 1 s, 2 s, 3 s
NODE_SETTINGS = {"topics": "Orders:2", "message_delay_level": "1s 1s 1s 2s 3s"}
LEVEL_MS = {3: 1000, 4: 2000, 5: 3000}


def send_back(broker, msg_id: str, group: str, delay: int = 0, max_times: int | None = None,
              version: int | None = None, origin: str | None = None) -> RemotingCommand:
    ext = {"offset": str(parse_offset_msg_id(msg_id)[2]), "group": group, "delayLevel": str(delay),
           "originMsgId": origin or msg_id, "originTopic": "Orders", "unitMode": "false"}
    if max_times is not None:
        ext["maxReconsumeTimes"] = str(max_times)
    cmd = RemotingCommand(RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields=ext)
    if version is not None:
        cmd.version = version
    return broker.call(cmd)


def sent(broker, body: bytes, tags: str = "TagA") -> tuple[str, MessageExt]:
    r = broker.call(send_command("Orders", body, queue_id=1, tags=tags, keys="k1", uniq=uniq_key()))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return r.ext_fields["msgId"], view(broker.call, r.ext_fields["msgId"])


@pytest.mark.timeout(60)
def test_retries_come_back_with_growing_delays_then_the_dlq_takes_it(broker):
    group = f"G_{uniq_key()[-8:]}"
    retry, dlq = f"%RETRY%{group}", f"%DLQ%{group}"
    msg_id, original = sent(broker, b"fails every time")
    copies, delays = [original], []
    for attempt in range(3):                                    # reconsume times 0, 1, 2 -> retry, levels 3, 4, 5
        r = send_back(broker, copies[-1].msg_id, group, max_times=3)
        assert r.code == ResponseCode.SUCCESS, r.remark
        scheduled = view(broker.call, r.ext_fields["msgId"])
        level = 3 + attempt
        assert (scheduled.topic, scheduled.queue_id) == (SCHEDULE_TOPIC, level - 1)
        assert scheduled.properties["DELAY"] == str(level) and scheduled.properties["REAL_TOPIC"] == retry
        assert max_offset(broker.call, retry, 0) == attempt       # not visible before its time
        wait_until(lambda: max_offset(broker.call, retry, 0) == attempt + 1, timeout=10, interval=0.02,
                   message=f"retry {attempt + 1}")
        copy = pull_all(broker.call, retry, 0, attempt)[0]
        delays.append(copy.store_timestamp - scheduled.store_timestamp)
        assert delays[-1] >= LEVEL_MS[level] - 50               # the schedule keeps time (store clock, ms)
        assert copy.reconsume_times == attempt + 1
        copies.append(copy)
    assert delays == sorted(delays) and delays[-1] - delays[0] >= 1500   # growing: 1 s, 2 s, 3 s

    last = copies[-1]
    for m in copies[1:]:                                        # what every copy keeps and adds
        assert (m.body, m.tags, m.keys, m.born_timestamp) == (original.body, "TagA", ["k1"], original.born_timestamp)
        assert m.born_host == original.born_host and m.uniq_key == original.uniq_key
        assert m.properties["RETRY_TOPIC"] == "Orders"
        assert m.properties["ORIGIN_MESSAGE_ID"] == msg_id      # the first message's, kept through every retry
        assert "DELAY" not in m.properties
    r = send_back(broker, last.msg_id, group, max_times=3)   # reconsume times 3 >= 3: the DLQ, at once
    assert r.code == ResponseCode.SUCCESS, r.remark
    dead = view(broker.call, r.ext_fields["msgId"])
    assert (dead.topic, dead.queue_id, dead.reconsume_times) == (dlq, 0, 4)
    assert dead.body == original.body and dead.properties["ORIGIN_MESSAGE_ID"] == msg_id
    assert "DELAY" not in dead.properties
    wait_until(lambda: max_offset(broker.call, dlq, 0) == 1, message="the DLQ's consume queue")
    topics = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG)).body_bytes())["topicConfigTable"]
    assert topics[dlq]["readQueueNums"] == 1 and topics[retry]["writeQueueNums"] == 1
    assert max_offset(broker.call, retry, 0) == 3               # nothing more was retried


def test_negative_delay_goes_to_the_dlq_and_old_clients_get_the_groups_limit(broker):
    group = f"G_{uniq_key()[-8:]}"
    msg_id, _ = sent(broker, b"straight to the DLQ")
    r = send_back(broker, msg_id, group, delay=-1)
    assert r.code == ResponseCode.SUCCESS
    assert view(broker.call, r.ext_fields["msgId"]).topic == f"%DLQ%{group}"

    strict = f"G_{uniq_key()[-8:]}"                              # retryMaxTimes 0: the first failure is the last
    body = json.dumps({"groupName": strict, "retryMaxTimes": 0, "retryQueueNums": 1}).encode()
    assert broker.call(RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)).code == 0
    msg_id, _ = sent(broker, b"no retries")
    old = send_back(broker, msg_id, strict, max_times=16, version=100)   # before V3_4_9: the header max is ignored
    assert view(broker.call, old.ext_fields["msgId"]).topic == f"%DLQ%{strict}"
    new = send_back(broker, msg_id, strict, max_times=16)                # a current client's max wins
    assert view(broker.call, new.ext_fields["msgId"]).topic == SCHEDULE_TOPIC


def test_refusals_are_clear_and_the_connection_keeps_serving(broker):
    r = send_back(broker, "7F00000100002A9F" + "0000000FFFFFFFFF", "G_ANY")
    assert r.code == ResponseCode.SYSTEM_ERROR and "look message by offset failed" in r.remark
    bad = broker.call(RemotingCommand(RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields={"group": "G"}))
    assert bad.code != ResponseCode.SUCCESS and "offset" in (bad.remark or "")
    update = RemotingCommand(RequestCode.UPDATE_BROKER_CONFIG, body=b"autoCreateSubscriptionGroup=false\n")
    assert broker.call(update).code == ResponseCode.SUCCESS
    try:
        msg_id, _ = sent(broker, b"no group")
        r = send_back(broker, msg_id, "G_NOBODY_MADE")
        assert r.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST and "G_NOBODY_MADE" in r.remark
    finally:
        update.body = b"autoCreateSubscriptionGroup=true\n"
        assert broker.call(update).code == ResponseCode.SUCCESS
    msg_id, _ = sent(broker, b"still serving")                  # the same connection goes on
    started = time.monotonic()
    assert send_back(broker, msg_id, f"G_{uniq_key()[-8:]}").code == ResponseCode.SUCCESS
    assert time.monotonic() - started < 5
