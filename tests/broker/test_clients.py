"""Client connections against a real node: heartbeats register groups and subscriptions, consumers
of a group are notified when it changes (join, unregister, socket closed, process killed,
expiry), pulls are checked against registered subscriptions, queue locks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.support.nodes import ROOT
from tests.support.broker import (ClientStub, group_command, heartbeat_body, offset_command, pull_command,
                                  send_command, update_offset_command)
from smartgo.client import Admin
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.java_hash import java_hash
from smartgo.store.record import decode_records
from tests.support.waits import wait_until


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def stubs(broker):
    made: list[ClientStub] = []

    def make(name: str | None = None) -> ClientStub:
        stub = ClientStub(broker.addr, name or uid("127.0.0.1@c"))
        made.append(stub)
        return stub
    yield make
    for s in made:
        s.close()


def tags(r: RemotingCommand) -> list[str]:
    assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    return [m.properties["TAGS"] for m in decode_records(r.body_bytes())]


def consumer_ids(broker, group: str) -> list[str] | int:
    r = broker.call(group_command(RequestCode.GET_CONSUMER_LIST_BY_GROUP, group))
    return sorted(json.loads(r.body_bytes())["consumerIdList"]) if r.code == 0 else r.code


def test_heartbeat_registers_consumers_group_and_retry_topic(broker, stubs):
    group, topic = uid("G"), uid("T")
    c = stubs()
    assert c.heartbeat({group: {topic: "A || B"}}, producers=("PG",)).code == ResponseCode.SUCCESS
    assert consumer_ids(broker, group) == [c.client_id]
    conn = json.loads(broker.call(group_command(RequestCode.GET_CONSUMER_CONNECTION_LIST, group)).body_bytes())
    assert conn["messageModel"] == "CLUSTERING" and conn["subscriptionTable"][topic]["subString"] == "A || B"
    assert [x["clientId"] for x in conn["connectionSet"]] == [c.client_id]
    groups = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body_bytes())
    assert groups["subscriptionGroupTable"][group]["retryQueueNums"] == 1
    topics = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG)).body_bytes())
    assert topics["topicConfigTable"][f"%RETRY%{group}"]["writeQueueNums"] == 1
    missing = broker.call(group_command(RequestCode.GET_CONSUMER_LIST_BY_GROUP, "NoSuchGroup"))
    assert (missing.code, missing.remark) == (ResponseCode.SYSTEM_ERROR, "no consumer for this group, NoSuchGroup")
    assert broker.call(group_command(RequestCode.GET_CONSUMER_CONNECTION_LIST, "NoSuchGroup")).code == \
        ResponseCode.CONSUMER_NOT_ONLINE


def test_members_are_notified_when_one_joins_leaves_or_closes(broker, stubs):
    group, topic = uid("G"), uid("T")
    a, b = stubs(), stubs()
    a.heartbeat({group: {topic: "*"}})
    b.heartbeat({group: {topic: "*"}})
    wait_until(lambda: a.notifications(group) >= 1, message="a told of b joining")
    base_a, base_b = a.notifications(group), b.notifications(group)
    a.heartbeat({group: {topic: "*"}})                       # a steady heartbeat changes nothing
    c = stubs()
    c.heartbeat({group: {topic: "*"}})                       # a third joins
    wait_until(lambda: a.notifications(group) > base_a and b.notifications(group) > base_b, message="join notices")
    assert consumer_ids(broker, group) == sorted([a.client_id, b.client_id, c.client_id])
    base_a, base_b = a.notifications(group), b.notifications(group)
    assert c.unregister(group).code == ResponseCode.SUCCESS  # one leaves
    wait_until(lambda: a.notifications(group) > base_a and b.notifications(group) > base_b, message="leave notices")
    assert consumer_ids(broker, group) == sorted([a.client_id, b.client_id])
    base_a = a.notifications(group)
    b.close()                                                # one closes its socket
    wait_until(lambda: a.notifications(group) > base_a, message="close notice")
    assert consumer_ids(broker, group) == [a.client_id]


def test_a_killed_client_process_leaves_its_group(broker, stubs):
    group, topic = uid("G"), uid("T")
    a = stubs()
    a.heartbeat({group: {topic: "*"}})
    script = ("import signal\nfrom tests.support.broker import ClientStub\n"
              f"c = ClientStub({broker.addr!r}, 'killed@1')\n"
              f"assert c.heartbeat({{{group!r}: {{{topic!r}: '*'}}}}).code == 0\n"
              "print('ready', flush=True)\nsignal.pause()\n")          # until the test kills it
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        assert consumer_ids(broker, group) == sorted([a.client_id, "killed@1"])
        base = a.notifications(group)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: a.notifications(group) > base, message="notice of the killed client")
        assert consumer_ids(broker, group) == [a.client_id]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_pulls_use_the_registered_subscription(broker, stubs):
    group, topic = uid("G"), uid("T")
    for tag in ("TagA", "TagB", "TagA"):
        assert broker.call(send_command(topic, tag.encode(), tags=tag)).code == 0
    # all three dispatched (a round may take only the first: dispatch paces rounds 10 ms apart
    # while no consumer follows the head)
    wait_until(lambda: broker.call(offset_command(RequestCode.GET_MAX_OFFSET, topic, 0)).ext_fields["offset"] == "3",
               message="dispatched")
    r = broker.call(pull_command(topic, 0, 0, subscription=None, group=group))
    assert r.code == ResponseCode.SUBSCRIPTION_NOT_EXIST and "group info not exist" in r.remark
    c = stubs()
    c.heartbeat({group: {topic: "TagA"}}, version=1000)
    assert tags(broker.call(pull_command(topic, 0, 0, subscription=None, group=group, sub_version=1000))) == \
        ["TagA", "TagA"]
    newer = broker.call(pull_command(topic, 0, 0, subscription=None, group=group, sub_version=2000))
    assert newer.code == ResponseCode.SUBSCRIPTION_NOT_LATEST
    other = broker.call(pull_command("SELF_TEST_TOPIC", 0, 0, subscription=None, group=group))
    assert other.code == ResponseCode.SUBSCRIPTION_NOT_EXIST and "subscription not exist" in other.remark
    c.heartbeat({group: {topic: "TagB"}}, version=3000)      # a newer subscription replaces it
    assert tags(broker.call(pull_command(topic, 0, 0, subscription=None, group=group, sub_version=3000))) == ["TagB"]


def test_group_permissions_are_respected_by_pulls(broker, stubs):
    group, bgroup = uid("G"), uid("B")
    body = json.dumps({"groupName": group, "consumeEnable": False}).encode()
    assert broker.call(RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)).code == 0
    r = wait_until(lambda: (x := broker.call(pull_command("SELF_TEST_TOPIC", 0, 0, group=group))).code
                   == ResponseCode.NO_PERMISSION and x, message="consumeEnable=false")
    assert r.remark == f"subscription group no permission, {group}"
    body = json.dumps({"groupName": bgroup, "consumeBroadcastEnable": False}).encode()
    assert broker.call(RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)).code == 0
    stubs().heartbeat({bgroup: {"SELF_TEST_TOPIC": "*"}}, model="BROADCASTING")
    r = broker.call(pull_command("SELF_TEST_TOPIC", 0, 0, subscription=None, group=bgroup))
    assert r.code == ResponseCode.NO_PERMISSION and "broadcast" in r.remark
    assert broker.call(group_command(RequestCode.DELETE_SUBSCRIPTIONGROUP, "", groupName=group)).code == 0
    wait_until(lambda: broker.call(pull_command("SELF_TEST_TOPIC", 0, 0, group=group)).code != ResponseCode.NO_PERMISSION,
               message="the deleted group's restriction gone")


def test_the_cli_deletes_a_group_its_offsets_and_its_retry_and_dead_letter_topics(broker, stubs):
    group = uid("Gone")
    stubs().heartbeat({group: {"SELF_TEST_TOPIC": "*"}})              # the broker creates %RETRY%<group>
    assert broker.call(update_offset_command(group, "SELF_TEST_TOPIC", 0, 5)).code == ResponseCode.SUCCESS
    retry, dlq = f"%RETRY%{group}", f"%DLQ%{group}"
    assert broker.call(RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields={
        "topic": dlq, "defaultTopic": "TBW102", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"})).code == 0
    with Admin(broker.registry) as admin:
        wait_until(lambda: {retry, dlq} <= set(admin.topic_list()), timeout=10, message="both topics registered")
        done = subprocess.run([sys.executable, "-m", "smartgo.cli", "admin", "group-delete", "-n", broker.registry,
                               "--group", group, "--remove-offsets", "--json"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"group": group, "brokers": [broker.addr]}
        assert not {retry, dlq} & set(admin.topic_list())
    groups = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body_bytes())
    topics = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG)).body_bytes())
    assert group not in groups["subscriptionGroupTable"] and not {retry, dlq} & set(topics["topicConfigTable"])
    offset = broker.call(group_command(RequestCode.QUERY_CONSUMER_OFFSET, group, topic="SELF_TEST_TOPIC", queueId=0))
    assert (offset.code, offset.ext_fields) == (ResponseCode.SUCCESS, {"offset": "0"})     # 5 forgotten: 4.x's
    # answer for a group without an offset in a queue that starts at 0


def test_unknown_group_without_auto_creation(broker):
    set_config = RemotingCommand(RequestCode.UPDATE_BROKER_CONFIG, body=b"autoCreateSubscriptionGroup=false\n")
    assert broker.call(set_config).code == 0
    try:
        group = uid("NoAuto")
        r = wait_until(lambda: (x := broker.call(pull_command("SELF_TEST_TOPIC", 0, 0, group=group))).code
                       == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST and x, message="group not exist")
        assert group in r.remark
    finally:
        set_config.body = b"auto_create_subscription_group=true"
        assert broker.call(set_config).code == 0
    wait_until(lambda: broker.call(pull_command("SELF_TEST_TOPIC", 0, 0, group=uid("Auto"))).code
               == ResponseCode.PULL_NOT_FOUND, message="auto-created groups again")


def test_queue_locks(broker, stubs):
    group = uid("G")

    def lock(client: str, code: int = RequestCode.LOCK_BATCH_MQ, queues=(0, 1)) -> RemotingCommand:
        body = json.dumps({"clientId": client, "consumerGroup": group,
                           "mqSet": [{"brokerName": "broker-a", "queueId": q, "topic": "T"} for q in queues]})
        return broker.call(RemotingCommand(code, body=body.encode()))

    def locked(r: RemotingCommand) -> list[int]:
        return sorted(m["queueId"] for m in json.loads(r.body_bytes())["lockOKMQSet"])
    assert locked(lock("a")) == [0, 1]
    assert locked(lock("b", queues=(1, 2))) == [2]           # 1 is a's
    assert locked(lock("a")) == [0, 1]                      # renewed
    assert lock("a", RequestCode.UNLOCK_BATCH_MQ, queues=(1,)).code == 0
    assert locked(lock("b", queues=(1, 2))) == [1, 2]


@pytest.mark.parametrize("body, remark", [
    (b"not json", "HeartbeatData: not JSON"),
    (b'{"consumerDataSet":[]}', "HeartbeatData: clientID is missing"),
    (b'{"clientID":"x","consumerDataSet":[{"groupName":"G","subscriptionDataSet":[{"topic":"T","codeSet":["z"]}]}]}',
     "HeartbeatData: consumerDataSet[0].subscriptionDataSet[0].codeSet[0] is not an integer"),
    (b'{"clientID":"x","consumerDataSet":[{"groupName":"G","messageModel":"SOMETIMES"}]}',
     "messageModel must be one of BROADCASTING, CLUSTERING"),
    (b'{"clientID":"x","consumerDataSet":{"groupName":"G"}}', "consumerDataSet is not an array"),
    (None, "HeartbeatData: the request has no body"),
])
def test_malformed_heartbeats_get_a_clear_error_and_the_connection_goes_on(broker, stubs, body, remark):
    c = stubs()
    r = c.call(RemotingCommand(RequestCode.HEART_BEAT, body=body))
    assert r.code == ResponseCode.SYSTEM_ERROR and remark in r.remark, r.remark
    assert c.heartbeat({uid("G"): {"T": "*"}}).code == ResponseCode.SUCCESS    # the same connection works


def test_go_client_heartbeat_with_string_codes(broker, stubs):
    group, topic = uid("G"), uid("T")
    code = java_hash("TagA")
    body = heartbeat_body("go@1", {group: {topic: "TagA"}}, version=5)
    body = body.replace(f"[{code}]".encode(), f'["{code}"]'.encode())   # the Go client may quote codeSet items
    assert f'"{code}"'.encode() in body
    assert stubs().call(RemotingCommand(RequestCode.HEART_BEAT, body=body)).code == 0
    sub = json.loads(broker.call(group_command(RequestCode.GET_CONSUMER_CONNECTION_LIST, group)).body_bytes())
    assert sub["subscriptionTable"][topic]["codeSet"] == [code]


def test_silent_clients_expire_and_the_rest_are_notified(start_node):
    """client_expiry and client_scan_interval stand in for 120 s / 10 s (ClientTable's clock is
    injected in the unit tests); a client that keeps heartbeating stays."""
    broker = start_node({"client_expiry": 1.5, "client_scan_interval": 0.1})
    group = uid("G")
    live, silent = ClientStub(broker.addr, "live@1"), ClientStub(broker.addr, "silent@2")
    try:
        live.heartbeat({group: {"T": "*"}})
        silent.heartbeat({group: {"T": "*"}})
        assert consumer_ids(broker, group) == ["live@1", "silent@2"]
        base = live.notifications(group)

        def silent_gone() -> bool:
            live.heartbeat({group: {"T": "*"}})                   # the live one keeps heartbeating
            return consumer_ids(broker, group) == ["live@1"]
        wait_until(silent_gone, timeout=10, interval=0.3, message="the silent client expired")
        assert live.notifications(group) > base
        broker.node.logged("client connections expired")
    finally:
        live.close()
        silent.close()


def test_query_topic_consume_by_who_lists_online_subscribers_and_offset_holders(broker, stubs):
    topic, online, committed, elsewhere = uid("T"), uid("G_ON"), uid("G_OFF"), uid("G_ELSE")
    c = stubs()
    c.heartbeat({online: {topic: "*"}, elsewhere: {uid("Other"): "*"}})
    assert broker.call(update_offset_command(committed, topic, 0, 3)).code == ResponseCode.SUCCESS

    def groups():
        r = broker.call(RemotingCommand(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, ext_fields={"topic": topic}))
        assert r.code == ResponseCode.SUCCESS
        return json.loads(r.body_bytes())["groupList"]
    wait_until(lambda: groups() == sorted([online, committed]), message="both groups listed")
    c.unregister(online)
    wait_until(lambda: groups() == [committed], message="the departed consumer's group gone")


@pytest.mark.timeout(120)
def test_an_unchanged_heartbeat_is_answered_by_the_net_actor_itself(start_node):
    """100,000 clients heartbeat 3,300 times a second: one the same as the connection's last
    accepted heartbeat is answered without the broker actor (here stopped), which keeps the client
    from the touches; a changed one still goes to the broker actor."""
    broker = start_node({"client_expiry": 3.0, "client_scan_interval": 0.2})
    group = uid("G")
    c = ClientStub(broker.addr, "steady@1")
    stopped = None
    try:
        assert c.heartbeat({group: {"T": "*"}}, version=1).code == ResponseCode.SUCCESS
        stopped = next(a["pid"] for a in broker.node.health()["actors"] if a["name"] == "broker")
        os.kill(stopped, signal.SIGSTOP)
        assert c.heartbeat({group: {"T": "*"}}, version=1).code == ResponseCode.SUCCESS
        changed = c.heartbeat({group: {"T": "*", "U": "*"}}, version=1)
        assert changed.code == ResponseCode.SYSTEM_BUSY and "broker actor unavailable" in changed.remark
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        seen = c.heartbeat({group: {"T": "*", "U": "*"}}, version=1)      # forwarded in full: it was not accepted
        assert seen.code == ResponseCode.SUCCESS
        conn = json.loads(broker.call(group_command(RequestCode.GET_CONSUMER_CONNECTION_LIST, group)).body_bytes())
        assert sorted(conn["subscriptionTable"]) == ["T", "U"]
        past_expiry = time.monotonic() + 8

        def kept_past_expiry() -> bool:
            assert c.heartbeat({group: {"T": "*", "U": "*"}}, version=1).code == ResponseCode.SUCCESS
            assert consumer_ids(broker, group) == ["steady@1"]  # the touches keep it
            return time.monotonic() >= past_expiry
        wait_until(kept_past_expiry, timeout=30, interval=0.5, message="8 s of heartbeats, well past client_expiry")
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        c.close()


@pytest.mark.timeout(120)
def test_a_burst_of_joins_is_told_to_the_members_in_a_few_notices(broker, stubs):
    """RocketMQ tells every member at each join: 24 joins in a burst would cost the first member
    23 notices. Coalesced (broker/managers/notices.py) it gets a few, and the last one comes after
    the last join, so every member ends up told of the whole group."""
    group = uid("G")
    members = [stubs() for _ in range(24)]
    for m in members:
        assert m.heartbeat({group: {"T": "*"}}, version=1).code == ResponseCode.SUCCESS
    everyone = sorted(m.client_id for m in members)
    assert consumer_ids(broker, group) == everyone
    # the second last is told of the last join only by the notice at the end of the window
    wait_until(lambda: members[-2].notifications(group) >= 1, message="the window's notice")
    assert 1 <= members[0].notifications(group) <= 8, members[0].notifications(group)
