"""A restarted node answers for the consumer group members it had (members.py): the consumer id
list and the registered subscriptions serve at once, before the clients' next heartbeat (every
30 s), until presumed_member_ttl; a member that does not come back then leaves and the others are
notified. A kill -9 and a clean stop alike."""

from __future__ import annotations

import json

import pytest

from smartgo.broker.managers.members import FILE
from tests.support.broker import ClientStub, group_command, pull_command, restart_broker, send_command
from smartgo.net.codes import RequestCode, ResponseCode
from tests.support.waits import wait_until

from .test_clients import consumer_ids, tags

TTL = 8.0                   # presumed_member_ttl: long enough to look around a loaded host first


def saved_ids(broker, group: str) -> list[str]:
    """The member ids the node has persisted for group."""
    try:
        groups = json.loads((broker.node.store / FILE).read_bytes())["consumerGroups"]
    except FileNotFoundError:
        return []
    return sorted(groups.get(group, {}).get("clientIds", []))


def registered(broker, group: str, topic: str, *ids: str) -> list[ClientStub]:
    """Stubs heartbeating `ids` in group (subscribing topic by tag A), once the node persisted them."""
    stubs = [ClientStub(broker.addr, cid) for cid in ids]
    for s in stubs:
        assert s.heartbeat({group: {topic: "A"}}).code == ResponseCode.SUCCESS
    wait_until(lambda: saved_ids(broker, group) == sorted(ids), message="the members persisted")
    return stubs


@pytest.mark.timeout(120)
def test_a_killed_node_serves_its_members_until_they_heartbeat(start_node):
    broker = start_node({"presumed_member_ttl": TTL})
    group, topic = "KeptMembers", "KeptMembersTopic"
    assert broker.call(send_command(topic, b"a", tags="A")).code == 0
    assert broker.call(send_command(topic, b"b", tags="B")).code == 0
    for s in registered(broker, group, topic, "back@1", "gone@2"):
        s.close()
    broker.node.kill()
    broker.node.reap()
    broker.node = restart_broker(broker.node)
    # at once: both ids, and a pull that relies on the registered subscription (as Java's and the
    # C++ client's do) gets the group's tag-A message instead of SUBSCRIPTION_NOT_EXIST
    assert consumer_ids(broker, group) == ["back@1", "gone@2"]
    assert tags(broker.call(pull_command(topic, 0, 0, subscription=None, group=group))) == ["A"]
    # presumed members are no connections: admin queries do not list them
    assert broker.call(group_command(RequestCode.GET_CONSUMER_CONNECTION_LIST, group)).code == \
        ResponseCode.CONSUMER_NOT_ONLINE
    back = ClientStub(broker.addr, "back@1")
    try:
        assert back.heartbeat({group: {topic: "A"}}).code == ResponseCode.SUCCESS
        conn = json.loads(broker.call(group_command(RequestCode.GET_CONSUMER_CONNECTION_LIST, group)).body_bytes())
        assert [c["clientId"] for c in conn["connectionSet"]] == ["back@1"]
        assert consumer_ids(broker, group) == ["back@1", "gone@2"]          # the list did not change
        # gone@2 sends no heartbeat: it leaves at the TTL, and back@1 is told
        wait_until(lambda: consumer_ids(broker, group) == ["back@1"], timeout=TTL + 20, message="gone@2 left")
        wait_until(lambda: back.notifications(group) >= 1, message="back@1 notified")
        assert broker.node.logged("1 presumed members did not heartbeat within 8s of the restart")
        wait_until(lambda: saved_ids(broker, group) == ["back@1"], message="the table persisted again")
    finally:
        back.close()


@pytest.mark.timeout(120)
def test_a_cleanly_stopped_node_keeps_its_members(start_node):
    """A stop closes every client connection before the broker actor stops; the file keeps the
    members as they were before the stop."""
    broker = start_node()
    group, topic = "StoppedMembers", "StoppedMembersTopic"
    assert broker.call(send_command(topic, b"a", tags="A")).code == 0
    stubs = registered(broker, group, topic, "kept@1")
    assert broker.node.stop() == 0
    for s in stubs:
        s.close()
    assert saved_ids(broker, group) == ["kept@1"]
    broker.node = restart_broker(broker.node)
    assert consumer_ids(broker, group) == ["kept@1"]
    assert tags(broker.call(pull_command(topic, 0, 0, subscription=None, group=group))) == ["A"]
