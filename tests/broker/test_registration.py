"""Registration with an external registry (--registry): routes appear at start and go at a clean stop."""

from __future__ import annotations

import json

from smartgo.actors.testing import launch_node
from smartgo.broker.testing import send_command
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.testing import wait_until


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
