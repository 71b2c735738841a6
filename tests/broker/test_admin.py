"""Consumer offsets, topic admin, consume stats, runtime info and the broker config against a real
node; the registry sees a new topic at once; bad config bodies get a clear error."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from tests.support.nodes import ROOT
from tests.support.broker import group_command, pull_command, send_command, update_offset_command
from smartgo.client.bodies import parse_consume_stats, parse_topic_stats
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from tests.support.waits import wait_until

NODE_SETTINGS = {"offset_persist_interval": 0.2, "stats_sample_interval": 2}   # consumeTps within 2 s, not 10


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def query_offset(broker, group: str, topic: str, queue_id: int) -> int | RemotingCommand:
    r = broker.call(group_command(RequestCode.QUERY_CONSUMER_OFFSET, group, topic=topic, queueId=queue_id))
    return int(r.ext_fields["offset"]) if r.code == ResponseCode.SUCCESS else r


def create_topic(topic: str, queues: int, perm: int = 6) -> RemotingCommand:
    return RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields={
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues), "writeQueueNums": str(queues),
        "perm": str(perm), "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})


def route(broker, topic: str) -> RemotingCommand:
    return broker.client.invoke(broker.registry, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                                 ext_fields={"topic": topic}))


def test_offsets_update_query_oneway_and_inside_pulls(broker):
    group, topic = uid("G"), uid("T")
    assert query_offset(broker, group, topic, 0) == 0              # a new group on an empty queue starts at 0
    assert broker.call(update_offset_command(group, topic, 0, 7)).code == ResponseCode.SUCCESS
    assert query_offset(broker, group, topic, 0) == 7
    for offset in range(100, 200):                                 # oneway: no answers, the last one wins
        broker.client.invoke_oneway(broker.addr, update_offset_command(group, topic, 1, offset, oneway=True))
    wait_until(lambda: query_offset(broker, group, topic, 1) == 199, message="the last oneway offset")
    assert broker.call(send_command(topic, b"x", queue_id=2)).code == 0
    assert query_offset(broker, group, topic, 2) == 0              # message 0 is there and in memory
    r = broker.call(pull_command(topic, 2, 0, group=group, commit_offset=1))
    assert r.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND)
    assert query_offset(broker, group, topic, 2) == 1              # committed by the pull
    every = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_CONSUMER_OFFSET)).body_bytes())
    assert every["offsetTable"][f"{topic}@{group}"] == {"0": 7, "1": 199, "2": 1}


def test_consume_stats_report_lag_per_queue(broker):
    group, topic = uid("G"), uid("T")
    assert broker.call(create_topic(topic, 2)).code == 0
    for i in range(5):
        assert broker.call(send_command(topic, b"m%d" % i, queue_id=i % 2)).code == 0
    assert broker.call(update_offset_command(group, topic, 0, 1)).code == 0
    wait_until(lambda: broker.call(pull_command(topic, 0, 1, group=group)).code == 0, message="a dispatched pull")

    def stats():
        r = broker.call(group_command(RequestCode.GET_CONSUME_STATS, group, topic=topic))
        return parse_consume_stats(r.body_bytes())

    def lags(s) -> dict:
        return {q.queue.queue_id: (q.broker_offset, q.consumer_offset, q.lag) for q in s.queues}
    s = wait_until(lambda: (x := stats()).consume_tps > 0 and lags(x) == {0: (3, 1, 2), 1: (2, 0, 2)} and x,
                   message="consumeTps from the pull and the lag of both queues")
    assert s.queues[0].last_timestamp > 0 and s.queues[1].last_timestamp == 0
    every_topic = parse_consume_stats(broker.call(group_command(RequestCode.GET_CONSUME_STATS, group)).body_bytes())
    assert {q.queue.topic for q in every_topic.queues} == {topic}   # the topics the group has offsets for


def test_topic_admin_and_the_registry_sees_a_new_topic_at_once(broker):
    topic = uid("T")
    start = time.monotonic()
    assert broker.call(create_topic(topic, 3)).code == ResponseCode.SUCCESS
    assert route(broker, topic).code == ResponseCode.SUCCESS        # answered once the registry has it
    assert time.monotonic() - start < 1.0
    table = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG)).body_bytes())
    assert table["topicConfigTable"][topic]["readQueueNums"] == 3 and table["dataVersion"]["counter"] > 0
    assert broker.call(send_command(topic, b"s", queue_id=1)).code == 0

    def topic_stats() -> RemotingCommand:
        return broker.call(RemotingCommand(RequestCode.GET_TOPIC_STATS_INFO, ext_fields={"topic": topic}))
    r = wait_until(lambda: (x := topic_stats()) and b'"maxOffset":1' in x.body_bytes() and x, message="dispatched")
    assert r.body_bytes().startswith(b'{"offsetTable":{{"brokerName":')          # fastjson's object keys
    status = {s.queue.queue_id: (s.min_offset, s.max_offset) for s in parse_topic_stats(r.body_bytes())}
    assert status == {0: (0, 0), 1: (0, 1), 2: (0, 0)}
    assert [s.last_update_timestamp > 0 for s in parse_topic_stats(r.body_bytes())] == [False, True, False]
    assert broker.call(RemotingCommand(RequestCode.GET_TOPIC_STATS_INFO, ext_fields={"topic": "Nope"})).code == \
        ResponseCode.TOPIC_NOT_EXIST
    assert broker.call(RemotingCommand(RequestCode.DELETE_TOPIC_IN_BROKER, ext_fields={"topic": topic})).code == 0
    table = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG)).body_bytes())
    assert topic not in table["topicConfigTable"]
    assert broker.call(pull_command(topic, 0, 0)).code == ResponseCode.TOPIC_NOT_EXIST
    refused = broker.call(RemotingCommand(RequestCode.DELETE_TOPIC_IN_BROKER, ext_fields={"topic": "SELF_TEST_TOPIC"}))
    assert refused.code == ResponseCode.SYSTEM_ERROR and "system topic" in refused.remark


def test_runtime_info(broker):
    before = int(runtime(broker)["msgPutTotalTodayNow"])
    for _ in range(3):
        assert broker.call(send_command("SELF_TEST_TOPIC", b"r")).code == 0
    info = wait_until(lambda: (x := runtime(broker)) and int(x["msgPutTotalTodayNow"]) >= before + 3 and x,
                      message="the sends counted")
    assert info["brokerVersion"] == "409" and info["brokerVersionDesc"] == "V4_9_8"
    assert len(info["putTps"].split()) == 3 and float(info["putTps"].split()[0]) > 0
    assert int(info["commitLogMaxOffset"]) > int(info["commitLogMinOffset"]) >= 0
    health = json.loads(info["smartgoHealth"])
    assert health["healthy"] is True and info["smartgoHealthy"] == "true"
    assert {"broker", "dispatch", "net-0"} <= {a["name"] for a in health["actors"]}


def runtime(broker) -> dict[str, str]:
    r = broker.call(RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO))
    assert r.code == ResponseCode.SUCCESS
    return json.loads(r.body_bytes())["table"]


def set_config(broker, text: bytes) -> RemotingCommand:
    return broker.call(RemotingCommand(RequestCode.UPDATE_BROKER_CONFIG, body=text))


def test_broker_config_and_runtime_permission(broker):
    r = broker.call(RemotingCommand(RequestCode.GET_BROKER_CONFIG))
    props = dict(line.split("=", 1) for line in r.body_bytes().decode().splitlines())
    assert props["broker_permission"] == "6" and props["broker_name"] == "broker-a"
    assert json.loads(r.ext_fields["version"])["counter"] >= 0
    assert set_config(broker, b"# drain this broker\nbrokerPermission=4\n").code == ResponseCode.SUCCESS
    try:
        refused = wait_until(lambda: (x := broker.call(send_command("SELF_TEST_TOPIC", b"w"))).code
                             == ResponseCode.NO_PERMISSION and x, message="sends refused")
        assert "sending message is forbidden" in refused.remark
        assert broker.call(pull_command("SELF_TEST_TOPIC", 0, 0)).code != ResponseCode.NO_PERMISSION
        wait_until(lambda: json.loads(route(broker, "SELF_TEST_TOPIC").body_bytes())["queueDatas"][0]["perm"] == 4,
                   message="the registry's route with the broker's permission")
        props = broker.call(RemotingCommand(RequestCode.GET_BROKER_CONFIG)).body_bytes().decode()
        assert "broker_permission=4" in props.splitlines()
    finally:
        assert set_config(broker, b"broker_permission=6").code == ResponseCode.SUCCESS
    wait_until(lambda: broker.call(send_command("SELF_TEST_TOPIC", b"w")).code == 0, message="sends again")


@pytest.mark.parametrize("body, remark", [
    (b"flush=sync", "flush cannot change while the broker runs"),
    (b"noSuchSetting=1", "unknown setting 'noSuchSetting'"),
    (b"brokerPermission=9", "brokerPermission='9': a permission is 0..7"),
    (b"autoCreateTopicEnable=maybe", "must be true or false"),
    (b"just garbage", "line 2 is not key=value"),
    (b"\xff\xfe", "not UTF-8"),
    (None, "the request has no body"),
])
def test_bad_config_updates_are_refused_whole(broker, body, remark):
    r = set_config(broker, body if body is None else b"brokerPermission=2\n" + body)   # a good line first
    assert r.code == ResponseCode.SYSTEM_ERROR and remark in r.remark, r.remark
    assert runtime(broker)["brokerPermission"] == "6"               # nothing of it applied


def test_flag_settings_over_the_wire_read_and_change_as_true_false(broker):
    """GET_BROKER_CONFIG spells boolean settings true/false; UPDATE takes RocketMQ's name with any
    case and the net actors apply it: no auto-created topic while it is off, one again once on."""
    def shown() -> tuple[str, str, str]:
        text = broker.call(RemotingCommand(RequestCode.GET_BROKER_CONFIG)).body_bytes().decode()
        props = dict(line.split("=", 1) for line in text.splitlines())
        return props["auto_create_topic"], props["auto_create_subscription_group"], props["acl_enable"]

    assert shown() == ("true", "true", "false")
    assert set_config(broker, b"autoCreateTopicEnable=FALSE").code == ResponseCode.SUCCESS
    try:
        assert shown() == ("false", "true", "false")
        wait_until(lambda: broker.call(send_command(uid("Off"), b"w")).code == ResponseCode.TOPIC_NOT_EXIST,
                   message="no auto-created topic while autoCreateTopicEnable is false")
    finally:
        assert set_config(broker, b"auto_create_topic=true").code == ResponseCode.SUCCESS
    assert shown() == ("true", "true", "false")
    wait_until(lambda: broker.call(send_command(uid("On"), b"w")).code == ResponseCode.SUCCESS,
               message="topics auto-created again")


def test_health_from_the_broker_over_the_wire(broker):
    cmd = [sys.executable, "-m", "smartgo.cli", "health", "--broker", broker.addr]
    out = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["healthy"] and {"broker", "net-0"} <= {a["name"] for a in report["actors"]}
    table = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert table.returncode == 0 and "ACTOR" in table.stdout and table.stdout.strip().endswith("healthy")
    down = subprocess.run([sys.executable, "-m", "smartgo.cli", "health", "--broker", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert down.returncode == 1 and down.stderr.count("\n") == 1 and "127.0.0.1:1" in down.stderr


def test_acl_admin_requests_on_a_broker_without_acl(broker):
    """4.x answers 50/51/53 with a null remark and never answers 52/54; here each says why."""
    for code, expected in ((RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED),
                           (RequestCode.DELETE_ACL_CONFIG, ResponseCode.DELETE_ACL_CONFIG_FAILED),
                           (RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
                            ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED),
                           (RequestCode.GET_BROKER_CLUSTER_ACL_INFO, ResponseCode.SYSTEM_ERROR),
                           (RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, ResponseCode.SYSTEM_ERROR)):
        r = broker.call(RemotingCommand(code, ext_fields={"accessKey": "some-access", "secretKey": "some-secret",
                                                          "globalWhiteAddrs": "*"}))
        assert (r.code, r.remark) == (expected, "ACL is off on this broker (acl_enable=false), so it keeps no ACL "
                                                "file to change or read")
    assert not (broker.node.store / "plain_acl.yml").exists()

