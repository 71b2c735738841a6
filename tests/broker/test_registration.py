"""Registration with an external registry (--registry): routes appear at start and go at a clean stop."""

from __future__ import annotations

import json

from tests.support.nodes import launch_node
from tests.support.broker import restart_broker, send_command
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from tests.support.waits import wait_until


def route(client, registry: str, topic: str) -> RemotingCommand:
    return client.invoke(registry, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic}))


def test_broker_registers_with_the_given_registry_and_unregisters_at_stop(start_node, tmp_path):
    registry = launch_node(tmp_path / "registry")
    try:
        addr = f"127.0.0.1:{registry.port}"
        broker = start_node({"registry": addr, "topics": "Listed:3", "broker_ip": "127.0.0.1",
                             "broker_name": "broker-x", "cluster_name": "ClusterX"})
        names = {a["name"] for a in broker.node.health()["actors"]}
        assert "registry" not in names                      # no embedded registry when one is given
        r = wait_until(lambda: (x := route(broker.client, addr, "Listed")).code == ResponseCode.SUCCESS and x)
        data = json.loads(r.body_bytes())
        assert data["brokerDatas"][0]["brokerAddrs"] == {"0": broker.addr}
        assert data["brokerDatas"][0]["cluster"] == "ClusterX"
        assert data["queueDatas"][0] == {**data["queueDatas"][0], "brokerName": "broker-x", "readQueueNums": 3}
        assert broker.call(send_command("Listed", b"x")).code == ResponseCode.SUCCESS
        assert broker.node.stop() == 0                      # clean stop: UNREGISTER_BROKER
        assert route(broker.client, addr, "Listed").code == ResponseCode.TOPIC_NOT_EXIST
        assert not (broker.node.store / "abort").exists()   # and a clean store
    finally:
        registry.reap()


def test_a_registry_back_from_a_restart_has_the_routes_within_seconds(start_node, tmp_path):
    """A registry keeps no routes: a 4.x broker is back in a restarted one only at its next
    registration (register_interval, 30 s). Here the broker sees its connection to the registry
    close, and registers with that registry alone every second until it is taken."""
    registry = launch_node(tmp_path / "registry")
    port = registry.port
    try:
        addr = f"127.0.0.1:{port}"
        broker = start_node({"registry": addr, "topics": "Back:2", "register_interval": 30.0})
        wait_until(lambda: route(broker.client, addr, "Back").code == ResponseCode.SUCCESS, message="the route")
        registry.kill()
        failed = f"registry {addr}: code 103 failed"
        wait_until(lambda: failed in broker.node.log_text(), timeout=10, message="registering while it is down")
        registry = restart_broker(registry, role="registry")       # the same port and store
        assert registry.port == port
        wait_until(lambda: route(broker.client, addr, "Back").code == ResponseCode.SUCCESS, timeout=10,
                   message="the route in the restarted registry")
        assert broker.node.log_text().count(failed) == 1             # tried every second, logged once a minute
    finally:
        registry.reap()
