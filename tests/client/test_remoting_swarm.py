"""The RocketMQ client-connections load generator (smartgo/client/swarm.py): a real node accepts its
heartbeats (SUCCESS, again at every interval) and lists its clients in their consumer groups; what it
sends is a Java client's HEART_BEAT; and a refused connection, a connection the peer closes, a refused
heartbeat and a connection lost after it was set up are each counted as such, not silently left out."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from smartgo.client import api
from smartgo.client.swarm import ClientSwarm, ClientSwarmConfig
from smartgo.common.heartbeat import parse_heartbeat
from smartgo.mqtt.swarm import SwarmConfig
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import FLAG_RESPONSE, LanguageCode, RequestCode, ResponseCode, SerializeType
from smartgo.net.command import RemotingCommand
from smartgo.net.frame import FrameDecoder, encode_frame
from tests.support.broker import start_broker
from tests.support.nodes import Node
from tests.support.waits import LOOPBACK, free_port, wait_until

CLIENTS = 1200
GROUPS = 6
INTERVAL = 2.0              # seconds between a client's heartbeats


def _config(port: int, **options: object) -> ClientSwarmConfig:
    """Sources 127.0.0.40 and up, 500 clients each; workers of 700 clients (2 for CLIENTS)."""
    net = SwarmConfig(LOOPBACK, port, per_worker=700, per_source=500, first_source=40, connect_timeout=60)
    return ClientSwarmConfig(net, **{"heartbeat_interval": INTERVAL, "groups": GROUPS, **options})  # type: ignore[arg-type]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    node = start_broker(tmp_path / "node", {"mqtt_port": 0, "mqtt_ws_port": 0, "log_level": "WARNING"})
    try:
        node.wait_healthy(timeout=60)
        yield node
    finally:
        node.reap()


def _members(port: int, group: str) -> set[str]:
    client = BlockingRemotingClient()
    try:
        resp = client.invoke(f"{LOOPBACK}:{port}", api.consumer_list_request(group), timeout=30)
        return set(api.decode_consumer_list(resp, f"{LOOPBACK}:{port}"))
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_node_accepts_the_heartbeats_and_lists_the_clients(node: Node) -> None:
    with ClientSwarm(_config(node.port)) as swarm:
        opened = swarm.grow(CLIENTS)
        assert opened.failures == {} and opened.subscribed == CLIENTS, opened
        assert opened.rate > 0 and opened.accept_rate > 0 and len(swarm.pids()) == 2
        counts = swarm.counts()
        assert counts["tcp"] == counts["subscribed"] == counts["open"] == CLIENTS, counts

        swarm.beats()
        # every client heartbeats again within an interval: twice over is plenty, however loaded the machine
        wait_until(lambda: swarm.counts()["answered"] - swarm.last["answered"] >= 2 * CLIENTS, timeout=60,
                   message="two heartbeats from every client")
        beats = swarm.beats()
        assert beats.refused == 0 and beats.failures == {} and beats.answered >= 2 * CLIENTS, beats
        p50, p99 = beats.percentile(50), beats.percentile(99)
        assert len(beats.rtts_ms) == beats.answered and p50 is not None and p99 is not None and 0 < p50 <= p99
        # the groups' members are told of the joins (the node's default): requests from the broker, counted
        assert set(beats.pushed) == {RequestCode.NOTIFY_CONSUMER_IDS_CHANGED} and swarm.counts()["pushed"] > 0

        for n in (0, GROUPS - 1):
            group = swarm.client.group(n)
            expected = swarm.client_ids(group)
            assert len(expected) == CLIENTS // GROUPS
            assert _members(node.port, group) == expected

        node.stop(timeout=60)          # the node goes: every connection is lost, and counted so
        wait_until(lambda: swarm.counts()["lost"] == CLIENTS, timeout=60, message="every connection lost")
        failures = swarm.beats().failures
        assert sum(failures.values()) == CLIENTS and all(r.startswith("lost: ") for r in failures), failures
        assert swarm.counts()["open"] == 0


@pytest.mark.timeout(60)
def test_refused_connections_are_counted() -> None:
    with ClientSwarm(_config(free_port())) as swarm:       # nobody listens there
        opened = swarm.grow(50)
    assert opened.subscribed == 0 and opened.failures == {"refused": 50}, opened


class _Peer(threading.Thread):
    """A listener that reads each connection's first frame and then answers it with `code` (its opaque
    plus `skew`), or, when `code` is None, closes the connection."""

    def __init__(self, code: int | None, skew: int = 0) -> None:
        super().__init__(daemon=True)
        self.code = code
        self.skew = skew
        self.server = socket.create_server((LOOPBACK, 0))
        self.port = self.server.getsockname()[1]
        self.requests: list[RemotingCommand] = []

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return                                  # closed: the test is over
            with conn:
                decoder = FrameDecoder()
                got: list[RemotingCommand] = []
                while not got and (data := conn.recv(65536)):
                    got = decoder.feed(data)
                self.requests += got
                if self.code is not None and got:
                    response = got[0].make_response(self.code, "not today")
                    response.opaque += self.skew
                    conn.sendall(encode_frame(response))
                    conn.recv(1)                        # until the client closes

    def __enter__(self) -> _Peer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()


@pytest.mark.timeout(60)
def test_a_java_heartbeat_and_its_refusal_are_counted() -> None:
    with _Peer(ResponseCode.SYSTEM_ERROR) as peer, ClientSwarm(_config(peer.port)) as swarm:
        opened = swarm.grow(3)
    assert opened.subscribed == 0 and opened.failures == {"HEART_BEAT 1: not today": 3}, opened
    assert len(peer.requests) == 3
    cfg = swarm.client
    for n, request in enumerate(sorted(peer.requests, key=lambda r: parse_heartbeat(r.body_bytes()).client_id)):
        assert (request.code, request.language, request.version) == (RequestCode.HEART_BEAT, LanguageCode.JAVA, 409)
        assert request.serialize_type == SerializeType.JSON and request.opaque > 0
        assert not request.flag & FLAG_RESPONSE and request.ext_fields is None
        hb = parse_heartbeat(request.body_bytes())
        assert hb.client_id == cfg.client_id(n) == f"127.0.0.40@{cfg.tag}#{n}"
        assert hb.producers == [api.CLIENT_INNER_PRODUCER_GROUP]
        [consumer] = hb.consumers
        assert (consumer.group, consumer.message_model, consumer.consume_type) == \
            (cfg.group(n), "CLUSTERING", "CONSUME_PASSIVELY")
        assert [(s.topic, s.sub_string, s.sub_version) for s in consumer.subscriptions] == \
            [(cfg.topic, "*", cfg.sub_version)]


@pytest.mark.timeout(60)
def test_a_connection_the_peer_closes_is_counted() -> None:
    with _Peer(None) as peer, ClientSwarm(_config(peer.port)) as swarm:
        opened = swarm.grow(20)
    assert opened.subscribed == 0 and opened.failures == {"closed by the broker": 20}, opened


@pytest.mark.timeout(60)
def test_a_response_to_another_request_is_counted() -> None:
    with _Peer(ResponseCode.SUCCESS, skew=1) as peer, ClientSwarm(_config(peer.port)) as swarm:
        opened = swarm.grow(5)
    assert opened.subscribed == 0 and opened.failures == {"a response to no heartbeat in flight (opaque)": 5}, opened
