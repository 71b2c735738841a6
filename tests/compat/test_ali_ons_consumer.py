"""ali-ons' push Consumer (and the requests it makes) against SmartGo.

Broadcasting needs only the data path. Clustering needs the broker's control plane; each test
names the request codes it needs:
  HEART_BEAT (34)                 the consumer registers its group and subscription
  GET_CONSUMER_LIST_BY_GROUP (38) rebalancing; ali-ons fails to start when it is missing
  QUERY_CONSUMER_OFFSET (14)      where a queue starts (QUERY_NOT_FOUND for a new group is fine)
  UPDATE_CONSUMER_OFFSET (15)     oneway offset commits, every second and at close
  UNREGISTER_CLIENT (35)          at close; ali-ons' close() throws when it fails
"""

from __future__ import annotations

import base64
import re

import pytest

from smartgo.client import AsyncPullConsumer, MessageQueue
from smartgo.net.codes import PullSysFlag, RequestCode
from tests.support.waits import wait_until

from .conftest import OnsError, arun, create_topic, ons, python_send, summary, topic_name

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("ali_ons")]

#: Errors ali-ons reports against Apache RocketMQ too: a new group has no stored offset
#: (QUERY_NOT_FOUND), and its %RETRY% topic has no route until the broker made it at the first
#: heartbeat (ali-ons asks the registry before it sends that heartbeat).
EXPECTED_ERRORS = re.compile(r"readOffset failed, .* READ_FROM_STORE|No topic route info in name server for the "
                             r"topic: %RETRY%")


def consume(cluster, group: str, topic: str, expect: int, **spec) -> dict:
    return ons("consumer", {"nameSrv": cluster.registry, "group": group, "topic": topic, "expect": expect,
                            "timeoutMs": 20000, **spec})


def check_clean(result: dict) -> None:
    unexpected = [e for e in result["errors"] if not EXPECTED_ERRORS.search(e)]
    assert not unexpected, (unexpected, summary(result))
    assert result["closeError"] is None, (result["closeError"], summary(result))
    assert not result["timedOut"], summary(result)


def last_commits(result: dict, topic: str) -> dict[int, int]:
    """queueId -> the last offset ali-ons committed with UPDATE_CONSUMER_OFFSET."""
    out = {}
    for c in result["calls"]:
        if c["code"] == RequestCode.UPDATE_CONSUMER_OFFSET and c["ext"]["topic"] == topic:
            out[int(c["ext"]["queueId"])] = int(c["ext"]["commitOffset"])
    return out


def broker_offsets(cluster, group: str, topic: str, queues: list[int]) -> dict[int, int]:
    async def main():
        async with AsyncPullConsumer(group, cluster.registry) as pc:
            qs = await pc.fetch_queues(topic)
            broker = qs[0].broker_name
            return {q: await pc.fetch_consume_offset(MessageQueue(topic, broker, q)) for q in queues}
    return arun(main())


def test_broadcast_consumer_receives_python_messages(cluster):
    """Data path only: a broadcasting ali-ons consumer keeps offsets itself."""
    topic = topic_name("ONS_BCAST")
    create_topic(cluster, topic, queues=2)
    sent = python_send(cluster, topic, 12, big_every=5)
    got = consume(cluster, "CG_ONS_BCAST", topic, 8, expression="A || B", isBroadcast=True, settleMs=1000)
    assert not got["timedOut"], summary(got)
    wanted = {r.msg_id: msg for msg, r in sent if msg.tags in ("A", "B")}
    uniq = [m["properties"]["UNIQ_KEY"] for m in got["messages"]]
    assert sorted(uniq) == sorted(wanted)                 # all of A and B, once each, nothing of C
    for m in got["messages"]:
        msg = wanted[m["properties"]["UNIQ_KEY"]]
        assert base64.b64decode(m["body"]) == msg.body and m["tags"] == msg.tags and m["keys"] == msg.keys[0]
    assert any(m["sysFlag"] & 0x1 for m in got["messages"])      # a compressed one came through inflated


def test_clustering_consumer_tag_filter_and_commits(cluster):
    """Needs 34, 38, 14, 15, 35."""
    topic, group = topic_name("ONS_CLUSTER"), "CG_ONS_CLUSTER"
    create_topic(cluster, topic, queues=4)
    sent = python_send(cluster, topic, 30, big_every=10)
    got = consume(cluster, group, topic, 20, expression="A || B", settleMs=1500)
    check_clean(got)
    wanted = {r.msg_id: msg for msg, r in sent if msg.tags in ("A", "B")}
    uniq = [m["properties"]["UNIQ_KEY"] for m in got["messages"]]
    assert sorted(uniq) == sorted(wanted), summary(got)
    for m in got["messages"]:
        assert base64.b64decode(m["body"]) == wanted[m["properties"]["UNIQ_KEY"]].body
    # the offsets ali-ons committed (oneway) are the broker's
    commits = last_commits(got, topic)
    assert sorted(commits) == [0, 1, 2, 3]
    for q in commits:
        consumed = [m["queueOffset"] for m in got["messages"] if m["queueId"] == q]
        assert commits[q] >= max(consumed, default=-1) + 1
    wait_until(lambda: broker_offsets(cluster, group, topic, list(commits)) == commits, timeout=10, interval=0.2,
               message=f"the broker to hold the committed offsets {commits}")


def test_clustering_consumer_resumes_from_committed_offsets(cluster):
    """A second run of the group starts where the first committed. Needs 34, 38, 14, 15, 35."""
    topic, group = topic_name("ONS_RESUME"), "CG_ONS_RESUME"
    create_topic(cluster, topic, queues=2)
    first = python_send(cluster, topic, 6)
    got = consume(cluster, group, topic, 6, settleMs=500)
    check_clean(got)
    assert sorted(m["properties"]["UNIQ_KEY"] for m in got["messages"]) == sorted(r.msg_id for _, r in first)
    second = python_send(cluster, topic, 4)
    again = consume(cluster, group, topic, 4, settleMs=1500)
    check_clean(again)
    assert sorted(m["properties"]["UNIQ_KEY"] for m in again["messages"]) == sorted(r.msg_id for _, r in second)
    # this time every queue had an offset at the broker
    reads = [c for c in again["calls"] if c["code"] == RequestCode.QUERY_CONSUMER_OFFSET]
    assert reads and all(c["resp"] == 0 for c in reads), summary(again)


def test_sql92_subscription_filters_at_the_broker(cluster):
    """ali-ons' SQL92 subscription ({expressionType, subString}), which it sends with every pull
    (postSubscriptionWhenPull); the broker evaluates it on each message. Needs 34, 38, 14, 15, 35."""
    topic, group = topic_name("ONS_SQL"), "CG_ONS_SQL"
    create_topic(cluster, topic, queues=2)
    sent = python_send(cluster, topic, 30)
    expression = {"expressionType": "SQL92", "subString": "idx >= 6 AND idx < 18 AND TAGS <> 'C'"}
    got = consume(cluster, group, topic, 8, expression=expression, settleMs=1500)
    check_clean(got)
    wanted = {r.msg_id for i, (msg, r) in enumerate(sent) if 6 <= i < 18 and msg.tags != "C"}
    assert len(wanted) == 8
    assert sorted(m["properties"]["UNIQ_KEY"] for m in got["messages"]) == sorted(wanted), summary(got)
    pulls = [c for c in got["calls"] if c["code"] == RequestCode.PULL_MESSAGE and c["ext"]["topic"] == topic]
    assert pulls and all(c["ext"]["expressionType"] == "SQL92" and c["ext"]["subscription"] == expression["subString"]
                         and int(c["ext"]["sysFlag"]) & PullSysFlag.SUBSCRIPTION for c in pulls)


def test_ali_ons_producer_to_ali_ons_consumer(cluster):
    """Both ends ali-ons, with ONS credential fields on every request. Needs 34, 38, 14, 15, 35."""
    topic, group = topic_name("ONS_LOOP"), "CG_ONS_LOOP"
    create_topic(cluster, topic, queues=2)
    messages = [{"topic": topic, "tags": f"T{i % 2}", "keys": [f"loop-{i}"], "body": f"loop {i}" * (1 + 700 * (i == 3)),
                 "properties": {"i": str(i)}} for i in range(8)]
    sent = ons("producer", {"nameSrv": cluster.registry, "group": "PG_ONS_LOOP", "credentials": True,
                            "messages": messages})["results"]
    got = consume(cluster, group, topic, 4, expression="T1", credentials=True, settleMs=1000)
    check_clean(got)
    wanted = {r["msgId"]: m for r, m in zip(sent, messages) if m["tags"] == "T1"}
    assert sorted(m["msgId"] for m in got["messages"]) == sorted(wanted)
    for m in got["messages"]:
        assert base64.b64decode(m["body"]).decode() == wanted[m["msgId"]]["body"]
        assert m["properties"]["i"] == wanted[m["msgId"]]["properties"]["i"]


def test_heartbeat_consumer_list_and_unregister(cluster):
    """The heartbeat body ali-ons builds (codeSet as JSON numbers, no expressionType), the group's
    member list (one client per connection, as in Java's ConsumerGroupInfo), and unregistering."""
    topic, group = topic_name("ONS_HB"), "CG_ONS_HB"
    create_topic(cluster, topic, queues=1)
    beat = {"op": "heartbeat", "broker": cluster.broker, "group": group, "topic": topic, "expression": "TagA || TagB"}
    out = ons("api", {"nameSrv": cluster.registry, "ops": [
        {**beat, "clientId": "127.0.0.1@ons-one"},
        {**beat, "clientId": "127.0.0.1@ons-two", "conn": 1},
        {"op": "consumerList", "broker": cluster.broker, "group": group,
         "until": ["127.0.0.1@ons-one", "127.0.0.1@ons-two"]},
        {"op": "unregisterClient", "broker": cluster.broker, "clientId": "127.0.0.1@ons-one", "consumerGroup": group},
        {"op": "consumerList", "broker": cluster.broker, "group": group, "until": ["127.0.0.1@ons-two"]}]})
    one, two, both, gone, left = out["results"]
    assert one["ok"] and two["ok"], summary(out)
    assert one["value"]["codeSet"] == [2598919, 2598920]     # Java String.hashCode of TagA, TagB
    assert sorted(both.get("value") or []) == ["127.0.0.1@ons-one", "127.0.0.1@ons-two"], (both, summary(out))
    assert gone["ok"], (gone, summary(out))
    assert left.get("value") == ["127.0.0.1@ons-two"], (left, summary(out))


def test_consumer_offset_requests(cluster):
    """ali-ons' oneway UPDATE_CONSUMER_OFFSET and its QUERY_CONSUMER_OFFSET, and the Python
    client's view of the same offsets. Needs 14, 15."""
    topic, group = topic_name("ONS_OFFSETS"), "CG_ONS_OFFSETS"
    create_topic(cluster, topic, queues=2)
    python_send(cluster, topic, 10)
    ops = [{"op": "updateConsumerOffset", "broker": cluster.broker, "group": group, "topic": topic, "queueId": q,
            "offset": 3 + q} for q in (0, 1)]
    ops += [{"op": "queryConsumerOffset", "broker": cluster.broker, "group": group, "topic": topic, "queueId": q,
             "until": 3 + q} for q in (0, 1)]
    out = ons("api", {"nameSrv": cluster.registry, "ops": ops})
    assert [r.get("value") for r in out["results"][2:]] == [3, 4], summary(out)
    assert broker_offsets(cluster, group, topic, [0, 1]) == {0: 3, 1: 4}


@pytest.mark.timeout(120)
def test_retry_later_redelivers_through_the_retry_topic(cluster):
    """ACTION_RETRY: ali-ons sends the message back (CONSUMER_SEND_MSG_BACK, delayLevel 0, so the
    broker picks level 3: 3 s on this cluster), then consumes the copy from %RETRY%<group>. Needs 34, 38, 14,
    15, 35, 36 (with the %RETRY% topic) and the delay service. Without 36, ali-ons re-sends the
    message to %RETRY%<group> itself, with no delay: the error and the store time catch that."""
    topic, group = topic_name("ONS_RETRY"), "CG_ONS_RETRY"
    create_topic(cluster, topic, queues=1)
    ((msg, sent),) = python_send(cluster, topic, 1)
    got = consume(cluster, group, topic, 1, retryOnce=True, pollRouteMs=1000, rebalanceMs=1000, timeoutMs=40000,
                  settleMs=500, deadlineMs=55000)
    check_clean(got)
    backs = [c for c in got["calls"] if c["code"] == RequestCode.CONSUMER_SEND_MSG_BACK]
    assert [c["resp"] for c in backs] == [0], summary(got)
    assert backs[0]["ext"]["originMsgId"] == sent.offset_msg_id and backs[0]["ext"]["delayLevel"] == 0
    (m,) = got["messages"]
    assert m["reconsumeTimes"] == 1 and m["topic"] == topic           # ali-ons restores the original topic
    assert base64.b64decode(m["body"]) == msg.body
    assert m["properties"]["UNIQ_KEY"] == sent.msg_id
    assert m["properties"]["RETRY_TOPIC"] == topic and m["properties"]["ORIGIN_MESSAGE_ID"] == sent.offset_msg_id
    assert m["storeTimestamp"] - m["bornTimestamp"] >= 2900         # level 3 of COMPAT_DELAY_LEVELS


ONS_ACL = """
accounts:
  - accessKey: compat-access-key
    secretKey: compat-secret-key
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - ONS_ACL=PUB|SUB
      - ONS_ACL_NO=SUB
"""


def test_signed_requests_pass_an_acl_enabled_broker(tmp_path):
    """ali-ons signs as AclClientRPCHook does (plus its OnsChannel field): its producer and
    consumer work against a broker with acl_enable; a wrong secret, or a topic the account may
    only read, is refused with 4.x's reason."""
    from tests.support.broker import start_broker
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ONS_ACL)
    node = start_broker(tmp_path / "node", {"acl_enable": "true", "acl_file": str(acl),
                                            "topics": "ONS_ACL:2;ONS_ACL_NO:1"})
    try:
        registry = f"127.0.0.1:{node.registry_port}"
        messages = [{"topic": "ONS_ACL", "tags": "T", "body": f"acl {i}"} for i in range(4)]
        sent = ons("producer", {"nameSrv": registry, "group": "PG_ONS_ACL", "credentials": True,
                                "messages": messages})["results"]
        assert [r["sendStatus"] for r in sent] == ["SEND_OK"] * 4
        got = ons("consumer", {"nameSrv": registry, "group": "CG_ONS_ACL", "topic": "ONS_ACL", "expect": 4,
                               "credentials": True, "timeoutMs": 20000, "settleMs": 500})
        check_clean(got)
        assert sorted(m["msgId"] for m in got["messages"]) == sorted(r["msgId"] for r in sent)
        with pytest.raises(OnsError, match="Check signature failed for accessKey=compat-access-key"):
            ons("producer", {"nameSrv": registry, "group": "PG_ONS_ACL", "credentials": True,
                             "secretKey": "another-secret", "messages": messages[:1]})
        with pytest.raises(OnsError, match="No default permission for topic:ONS_ACL_NO"):
            ons("producer", {"nameSrv": registry, "group": "PG_ONS_ACL", "credentials": True,
                             "messages": [{"topic": "ONS_ACL_NO", "body": "x"}]})
    finally:
        node.reap()
