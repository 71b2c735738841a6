"""Restarts: the node keeps topics, groups and offsets; a restarted broker actor gets every live
client back (the net actors replay their last heartbeats); a broker actor killed again and
again while it persists never leaves a half-written file."""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest

from tests.support.broker import (ClientStub, group_command, heartbeat_body, pull_command, restart_broker,
                                    send_command, update_offset_command)
from smartgo.net.codes import LanguageCode, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.frame import FrameDecoder, encode_frame
from tests.support.waits import wait_until

from .test_admin import create_topic, query_offset

FAST_PERSIST = {"offset_persist_interval": 0.05}


def config_files(store) -> dict[str, dict]:
    """Every persisted control-plane file there is, parsed (a half-written one fails here; one
    not written yet - an actor killed before its first save - is absent)."""
    folder = store / "config"
    return {name: json.loads((folder / name).read_bytes())
            for name in ("topics.json", "consumerOffset.json", "subscriptionGroup.json") if (folder / name).exists()}


@pytest.mark.timeout(120)
def test_restart_keeps_topics_groups_and_offsets(start_node):
    broker = start_node(FAST_PERSIST)
    assert broker.call(create_topic("Kept", 3)).code == 0
    body = json.dumps({"groupName": "KeptGroup", "retryMaxTimes": 5}).encode()
    assert broker.call(RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)).code == 0
    assert broker.call(update_offset_command("KeptGroup", "Kept", 2, 42)).code == 0
    assert broker.call(send_command("AutoMade", b"x", default_queues=3)).code == 0       # through TBW102
    assert broker.node.stop() == 0                                                       # a clean stop
    node = restart_broker(broker.node)
    broker.node = node
    topics = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG)).body_bytes())["topicConfigTable"]
    assert topics["Kept"]["readQueueNums"] == 3 and topics["AutoMade"]["writeQueueNums"] == 3
    groups = json.loads(broker.call(RemotingCommand(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body_bytes())
    assert groups["subscriptionGroupTable"]["KeptGroup"]["retryMaxTimes"] == 5
    assert query_offset(broker, "KeptGroup", "Kept", 2) == 42
    # a kill -9 of the whole node after the offsets' persist interval loses none of them either
    assert broker.call(update_offset_command("KeptGroup", "Kept", 1, 7)).code == 0
    wait_until(lambda: config_files(node.store).get("consumerOffset.json", {}).get("offsetTable", {}).get("Kept@KeptGroup", {})
               .get("1") == 7, message="the offset persisted")
    node.stop(signal.SIGKILL)
    node.reap()
    broker.node = restart_broker(node)
    assert query_offset(broker, "KeptGroup", "Kept", 1) == 7 and query_offset(broker, "KeptGroup", "Kept", 2) == 42
    assert (node.store / "config" / "topics.json.bak").exists()


@pytest.mark.timeout(120)
def test_a_restarted_broker_actor_gets_the_clients_back(start_node):
    broker = start_node()
    assert broker.call(send_command("Replay", b"r", tags="A")).code == 0
    c = ClientStub(broker.addr, "replayed@1")
    try:
        assert c.heartbeat({"RG": {"Replay": "A"}}).code == 0
        before = broker.node.actor("broker")
        os.kill(before["pid"], signal.SIGKILL)
        wait_until(lambda: (a := broker.node.actor("broker"))["pid"] != before["pid"] and a["state"] == "running",
                   timeout=20, message="the broker actor restarted")
        r = wait_until(lambda: (x := broker.call(group_command(RequestCode.GET_CONSUMER_LIST_BY_GROUP, "RG"))).code
                       == 0 and x, message="the client registered again without a new heartbeat")
        assert json.loads(r.body_bytes())["consumerIdList"] == ["replayed@1"]
        pulled = broker.call(pull_command("Replay", 0, 0, subscription=None, group="RG"))
        assert pulled.code == ResponseCode.SUCCESS
        base = c.notifications("RG")
        other = ClientStub(broker.addr, "joiner@2")                 # and notifications reach it
        try:
            other.heartbeat({"RG": {"Replay": "A"}})
            wait_until(lambda: c.notifications("RG") > base, message="notified by the new broker actor")
        finally:
            other.close()
    finally:
        c.close()


@pytest.mark.timeout(120)
def test_killing_the_broker_actor_while_it_persists_never_leaves_a_torn_file(start_node):
    broker = start_node({**FAST_PERSIST, "max_restarts": 100})
    store = broker.node.store
    committed = 0
    for round_ in range(6):
        for i in range(20):                      # topic writes and offset writes in flight...
            assert broker.call(create_topic(f"Churn{round_}_{i}", 1), timeout=10).code == ResponseCode.SUCCESS
            committed += 1
            broker.client.invoke_oneway(broker.addr, update_offset_command("Churn", "T", 0, committed, oneway=True))
        pid = broker.node.actor("broker")["pid"]
        os.kill(pid, signal.SIGKILL)             # ... when it dies
        files = config_files(store)              # old or new, never torn
        assert "Churn0_0" in files["topics.json"]["topicConfigTable"] or round_ == 0
        wait_until(lambda: (a := broker.node.actor("broker"))["pid"] != pid and a["state"] == "running",
                   timeout=20, message="the broker actor back")
    assert broker.call(update_offset_command("Churn", "T", 0, 10_000)).code == 0
    wait_until(lambda: config_files(store).get("consumerOffset.json", {}).get("offsetTable", {}).get("T@Churn", {})
               .get("0") == 10_000, message="offsets persisted after all that")
    topics = config_files(store)["topics.json"]["topicConfigTable"]
    assert all(f"Churn{r}_{i}" in topics for r in range(6) for i in range(20))   # every acknowledged creation


def _heartbeat_all(socks: list, bodies: list[bytes]) -> list[int]:
    """Each socket sends its heartbeat; the response codes, in order."""
    for opaque, (sock, body) in enumerate(zip(socks, bodies), 1):
        sock.sendall(encode_frame(RemotingCommand(RequestCode.HEART_BEAT, LanguageCode.JAVA, 409, opaque=opaque,
                                                  body=body)))
    codes = []
    for sock in socks:
        decoder = FrameDecoder()
        answers: list = []
        while not answers:                      # NOTIFY_CONSUMER_IDS_CHANGED requests may come first
            data = sock.recv(65536)
            assert data, "the broker closed a client connection"
            answers = [cmd for cmd in decoder.feed(data) if cmd.is_response]
        codes.append(answers[0].code)
    return codes


@pytest.mark.timeout(180)
def test_every_client_is_back_after_a_restart_even_when_the_replay_overflows_the_ring(start_node):
    """240 clients with 24 KB heartbeats (200 topics each): their replay to a restarted broker actor
    is 5.8 MB, more than the 4 MiB request ring holds at once. Every client is registered again: the
    replay goes a slice at a time, and each client's next unchanged heartbeat goes to the broker actor
    in full rather than being answered by the net actor (which had left 3,000 of 17,000 clients out of
    their groups for good)."""
    broker = start_node()
    clients = 240
    bodies = [heartbeat_body(f"127.0.0.2@1#{i}", {"BigGroup": {f"T{t}": "*" for t in range(200)}}, version=1)
              for i in range(clients)]
    assert len(bodies[0]) * clients > 5 << 20                # more than the ring holds
    socks = [socket.create_connection(("127.0.0.1", broker.node.port), timeout=30) for _ in range(clients)]
    try:
        # 5.8 MB of heartbeats at once: some may get SYSTEM_BUSY and are accepted the next round
        wait_until(lambda: _heartbeat_all(socks, bodies) == [ResponseCode.SUCCESS] * clients, timeout=60,
                   message="every client registered")

        def members() -> int:
            r = broker.call(group_command(RequestCode.GET_CONSUMER_CONNECTION_LIST, "BigGroup"), timeout=30)
            return len(json.loads(r.body_bytes())["connectionSet"]) if r.code == 0 else 0
        assert members() == clients
        before = broker.node.actor("broker")
        os.kill(before["pid"], signal.SIGKILL)
        wait_until(lambda: (a := broker.node.actor("broker"))["pid"] != before["pid"] and a["state"] == "running",
                   timeout=30, message="the broker actor restarted")

        def back() -> bool:
            if members() == clients:
                return True
            _heartbeat_all(socks, bodies)       # they heartbeat on (SYSTEM_BUSY while the replay is taken in)
            return False
        wait_until(back, timeout=60, interval=1.0, message="every client registered again")
    finally:
        for sock in socks:
            sock.close()
