"""The registry over the wire, as a Java broker, a client and an admin tool would use it."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from smartgo.net.client import RemotingClient
from smartgo.net.codes import ORDER_TOPIC_CONFIG, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.loop import run
from smartgo.registry.server import RegistryServer
from tests.support.waits import async_wait_until

from .conftest import (FakeClock, compressed_register_body, register_body, register_request,
                       strict_json)

QUEUE_FIELDS = {"brokerName", "perm", "readQueueNums", "topicSynFlag", "topicSysFlag", "writeQueueNums"}


def with_registry(tmp_path: Path, test: Callable[[RegistryServer, RemotingClient, str], Awaitable[None]],
                  **options: object) -> None:
    async def main() -> None:
        server = RegistryServer("127.0.0.1", 0, tmp_path / "namesrv", **options)  # type: ignore[arg-type]
        await server.start()
        try:
            async with RemotingClient(announce=False) as client:   # talk like a Java peer: JSON only
                await test(server, client, f"127.0.0.1:{server.port}")
        finally:
            await server.stop()
    run(main())


async def route(client: RemotingClient, addr: str, topic: str) -> RemotingCommand:
    return await client.invoke(addr, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic}))


def snapshot(server: RegistryServer) -> tuple:
    r = server.routes
    return copy.deepcopy((r.topic_queue_table, r.broker_addr_table, r.cluster_addr_table,
                          {a: (l.data_version, l.ha_server_addr) for a, l in r.broker_live_table.items()}))


def test_master_and_slave_routes(tmp_path: Path) -> None:
    async def test(server: RegistryServer, client: RemotingClient, addr: str) -> None:
        master = await client.invoke(addr, register_request("broker-a", "10.0.0.1:10911", 0,
                                                            register_body({"TopicTest": (4, 4, 6)})))
        assert master.code == ResponseCode.SUCCESS and master.body is None
        assert "masterAddr" not in (master.ext_fields or {})
        slave = await client.invoke(addr, register_request("broker-a", "10.0.0.2:10911", 1,
                                                           register_body({"TopicTest": (16, 16, 6)}),
                                                           ha_addr="10.0.0.2:10912"))
        assert slave.ext_fields == {"masterAddr": "10.0.0.1:10911", "haServerAddr": "10.0.0.1:10912"}
        reply = await route(client, addr, "TopicTest")
        assert reply.code == ResponseCode.SUCCESS
        body = strict_json(reply.body)
        assert set(body) == {"brokerDatas", "filterServerTable", "queueDatas"}
        assert body["brokerDatas"] == [{"brokerAddrs": {"0": "10.0.0.1:10911", "1": "10.0.0.2:10911"},
                                        "brokerName": "broker-a", "cluster": "DefaultCluster"}]
        (queue,) = body["queueDatas"]
        assert set(queue) == QUEUE_FIELDS and queue["readQueueNums"] == 4 and queue["topicSynFlag"] == 0
        missing = await route(client, addr, "NoSuchTopic")
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in missing.remark
        compressed = await client.invoke(addr, register_request(
            "broker-b", "10.0.0.3:10911", 0, compressed_register_body({"TopicTest": (2, 2, 6), "Other": (1, 1, 6)}),
            compressed=True))
        assert compressed.code == ResponseCode.SUCCESS
        both = strict_json((await route(client, addr, "TopicTest")).body)
        assert sorted(q["brokerName"] for q in both["queueDatas"]) == ["broker-a", "broker-b"]
    with_registry(tmp_path, test)


def test_order_topic_config_and_kv_codes(tmp_path: Path) -> None:
    async def test(server: RegistryServer, client: RemotingClient, addr: str) -> None:
        async def kv(code: int, **fields: str) -> RemotingCommand:
            return await client.invoke(addr, RemotingCommand(code, ext_fields=fields))
        ns = ORDER_TOPIC_CONFIG
        assert (await kv(RequestCode.PUT_KV_CONFIG, namespace=ns, key="Orders", value="broker-a:4")).code == 0
        assert (await kv(RequestCode.GET_KV_CONFIG, namespace=ns, key="Orders")).ext_fields == {"value": "broker-a:4"}
        absent = await kv(RequestCode.GET_KV_CONFIG, namespace=ns, key="nope")
        assert absent.code == ResponseCode.QUERY_NOT_FOUND
        assert absent.remark == f"No config item, Namespace: {ns} Key: nope"
        listing = await kv(RequestCode.GET_KVLIST_BY_NAMESPACE, namespace=ns)
        assert strict_json(listing.body) == {"table": {"Orders": "broker-a:4"}}
        assert (await kv(RequestCode.GET_KVLIST_BY_NAMESPACE, namespace="empty")).code == ResponseCode.QUERY_NOT_FOUND
        registered = await client.invoke(addr, register_request("broker-a", "10.0.0.1:10911", 0,
                                                                register_body({"Orders": (4, 4, 6)})))
        assert strict_json(registered.body) == {"table": {"Orders": "broker-a:4"}}
        body = strict_json((await route(client, addr, "Orders")).body)
        assert body["orderTopicConf"] == "broker-a:4"
        assert list(body) == ["brokerDatas", "filterServerTable", "orderTopicConf", "queueDatas"]
        assert (await kv(RequestCode.DELETE_KV_CONFIG, namespace=ns, key="Orders")).code == 0
        assert "orderTopicConf" not in strict_json((await route(client, addr, "Orders")).body)
        missing_field = await kv(RequestCode.PUT_KV_CONFIG, namespace=ns, key="k")
        assert missing_field.code == ResponseCode.SYSTEM_ERROR and missing_field.remark == "the custom field value is null"
    with_registry(tmp_path, test)


def test_namesrv_config_get_update_and_persist(tmp_path: Path) -> None:
    """GET/UPDATE_NAMESRV_CONFIG: properties text; orderMessageEnable (on here, off in 4.x) takes the
    order config out of routes and back, survives a restart; 4.x's black list, a fixed setting, an
    unknown one, a bad value and an empty body are refused and change nothing."""
    def update(text: str) -> RemotingCommand:
        return RemotingCommand(RequestCode.UPDATE_NAMESRV_CONFIG, body=text.encode())

    def config(body: bytes) -> dict[str, str]:
        return dict(line.split("=", 1) for line in body.decode().splitlines())

    async def test(server: RegistryServer, client: RemotingClient, addr: str) -> None:
        got = config((await client.invoke(addr, RemotingCommand(RequestCode.GET_NAMESRV_CONFIG))).body)
        assert got["orderMessageEnable"] == "true" and got["listenPort"] == str(server.port)
        assert got["kvConfigPath"] == str(tmp_path / "namesrv" / "kvConfig.json")
        await client.invoke(addr, RemotingCommand(RequestCode.PUT_KV_CONFIG, ext_fields={
            "namespace": ORDER_TOPIC_CONFIG, "key": "Orders", "value": "broker-a:4"}))
        await client.invoke(addr, register_request("broker-a", "10.0.0.1:10911", 0,
                                                   register_body({"Orders": (4, 4, 6)})))
        assert strict_json((await route(client, addr, "Orders")).body)["orderTopicConf"] == "broker-a:4"
        assert (await client.invoke(addr, update("orderMessageEnable=false\n"))).code == ResponseCode.SUCCESS
        assert "orderTopicConf" not in strict_json((await route(client, addr, "Orders")).body)
        for text, code, remark in [
                ("kvConfigPath=/tmp/x", ResponseCode.NO_PERMISSION, "Can not update config in black list."),
                ("listenPort=1", ResponseCode.SYSTEM_ERROR, "listenPort: only a restart changes it"),
                ("orderMessageEnable=true\nmystery=1", ResponseCode.SYSTEM_ERROR, "mystery: unknown setting"),
                ("orderMessageEnable=yes", ResponseCode.SYSTEM_ERROR, "must be true or false"),
                ("", ResponseCode.SYSTEM_ERROR, "registry config: the request has no body")]:
            refused = await client.invoke(addr, update(text))
            assert refused.code == code and remark in refused.remark, (text, refused)
        got = config((await client.invoke(addr, RemotingCommand(RequestCode.GET_NAMESRV_CONFIG))).body)
        assert got["orderMessageEnable"] == "false"

    async def restarted(server: RegistryServer, client: RemotingClient, addr: str) -> None:
        assert not server.config.order_message_enable
        assert (await client.invoke(addr, update("orderMessageEnable = TRUE"))).code == ResponseCode.SUCCESS
        assert server.config.order_message_enable
    with_registry(tmp_path, test)
    with_registry(tmp_path, restarted)


def test_cluster_topic_list_and_admin_codes(tmp_path: Path) -> None:
    async def test(server: RegistryServer, client: RemotingClient, addr: str) -> None:
        await client.invoke(addr, register_request("a", "10.0.0.1:10911", 0, register_body({"T": (4, 4, 6), "U": (1, 1, 6)}),
                                                   cluster="C1"))
        await client.invoke(addr, register_request("b", "10.0.0.2:10911", 0, register_body({"T": (4, 4, 6)}), cluster="C2"))
        info = strict_json((await client.invoke(addr, RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO))).body)
        assert set(info) == {"brokerAddrTable", "clusterAddrTable"}
        assert info["clusterAddrTable"] == {"C1": ["a"], "C2": ["b"]}
        assert set(info["brokerAddrTable"]["a"]) == {"brokerAddrs", "brokerName", "cluster"}
        topics = strict_json((await client.invoke(addr, RemotingCommand(
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))).body)
        assert set(topics) == {"topicList"} and sorted(topics["topicList"]) == ["T", "U"]
        by_cluster = strict_json((await client.invoke(addr, RemotingCommand(
            RequestCode.GET_TOPICS_BY_CLUSTER, ext_fields={"cluster": "C2"}))).body)
        assert by_cluster == {"topicList": ["T"]}
        wiped = await client.invoke(addr, RemotingCommand(RequestCode.WIPE_WRITE_PERM_OF_BROKER,
                                                          ext_fields={"brokerName": "a"}))
        assert wiped.ext_fields == {"wipeTopicCount": "2"}

        async def perms() -> dict[str, int]:
            queues = strict_json((await route(client, addr, "T")).body)["queueDatas"]
            return {q["brokerName"]: q["perm"] for q in queues}
        assert await perms() == {"a": 4, "b": 6}
        added = await client.invoke(addr, RemotingCommand(RequestCode.ADD_WRITE_PERM_OF_BROKER,
                                                          ext_fields={"brokerName": "a"}))
        assert added.ext_fields == {"addTopicCount": "2"} and await perms() == {"a": 6, "b": 6}
        await client.invoke(addr, RemotingCommand(RequestCode.DELETE_TOPIC_IN_NAMESRV, ext_fields={"topic": "U"}))
        assert (await route(client, addr, "U")).code == ResponseCode.TOPIC_NOT_EXIST
        version_body = json.dumps({"counter": 1, "timestamp": 1_700_000_000_000}).encode()
        query = RemotingCommand(RequestCode.QUERY_DATA_VERSION, ext_fields={
            "brokerName": "a", "brokerAddr": "10.0.0.1:10911", "clusterName": "C1", "brokerId": "0"}, body=version_body)
        same = await client.invoke(addr, query)
        assert same.ext_fields == {"changed": "false"}
        assert strict_json(same.body) == {"counter": 1, "timestamp": 1_700_000_000_000}
        query.body = json.dumps({"counter": 2, "timestamp": 1_700_000_000_000}).encode()
        assert (await client.invoke(addr, query)).ext_fields == {"changed": "true"}
        await client.invoke(addr, RemotingCommand(RequestCode.UNREGISTER_BROKER, ext_fields={
            "brokerName": "b", "brokerAddr": "10.0.0.2:10911", "clusterName": "C2", "brokerId": "0"}))
        names = [b["brokerName"] for b in strict_json((await route(client, addr, "T")).body)["brokerDatas"]]
        assert names == ["a"]
        for code in (RequestCode.SEND_MESSAGE, RequestCode.HEART_BEAT, 217, 9999):
            other = await client.invoke(addr, RemotingCommand(code))
            assert other.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            assert other.remark == f" request type {code} not supported"
    with_registry(tmp_path, test)


@pytest.mark.parametrize("request_factory, fragment", [
    (lambda: register_request("x", "10.9.9.9:1", 0, b"{not json"), "RegisterBrokerBody body is not JSON"),
    (lambda: register_request("x", "10.9.9.9:1", 0, b'{"topicConfigSerializeWrapper":{"topicConfigTable":'
                              b'{"T":{"readQueueNums":"4"}}}}'), "readQueueNums must be an integer"),
    (lambda: register_request("x", "10.9.9.9:1", 0, b"\x01\x02", compressed=True), "does not inflate"),
    (lambda: _corrupt_crc(register_request("x", "10.9.9.9:1", 0, register_body({"T": (1, 1, 6)})),), "crc32 not match"),
    (lambda: _without(register_request("x", "10.9.9.9:1", 0, None), "brokerAddr"), "the custom field brokerAddr is null"),
    (lambda: _with(register_request("x", "10.9.9.9:1", 0, None), brokerId="one"), "brokerId is not an integer"),
    (lambda: _with(register_request("x", "10.9.9.9:1", 0, None), brokerId="-1"), "brokerId is negative"),
    (lambda: _with(register_request("x", "10.9.9.9:1", 0, None), brokerName=""), "brokerName is empty"),
    (lambda: RemotingCommand(RequestCode.QUERY_DATA_VERSION, ext_fields={
        "brokerName": "a", "brokerAddr": "1:1", "clusterName": "C", "brokerId": "0"}), "DataVersion body is missing"),
    (lambda: RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC), "the custom field topic is null"),
])
def test_malformed_requests_change_nothing(tmp_path: Path, request_factory, fragment: str) -> None:
    async def test(server: RegistryServer, client: RemotingClient, addr: str) -> None:
        await client.invoke(addr, register_request("a", "10.0.0.1:10911", 0, register_body({"T": (4, 4, 6)})))
        before = snapshot(server)
        reply = await client.invoke(addr, request_factory())
        assert reply.code == ResponseCode.SYSTEM_ERROR and fragment in reply.remark
        assert snapshot(server) == before
        assert (await route(client, addr, "T")).code == ResponseCode.SUCCESS    # still serving
    with_registry(tmp_path, test)


def _with(cmd: RemotingCommand, **fields: str) -> RemotingCommand:
    cmd.ext_fields.update(fields)
    return cmd


def _without(cmd: RemotingCommand, name: str) -> RemotingCommand:
    del cmd.ext_fields[name]
    return cmd


def _corrupt_crc(cmd: RemotingCommand) -> RemotingCommand:
    cmd.ext_fields["bodyCrc32"] = str((int(cmd.ext_fields["bodyCrc32"]) + 1) & 0x7FFFFFFF)
    return cmd


def test_closed_connection_drops_its_broker_at_once(tmp_path: Path) -> None:
    async def test(server: RegistryServer, client: RemotingClient, addr: str) -> None:
        async with RemotingClient(announce=False) as broker:
            await broker.invoke(addr, register_request("a", "10.0.0.1:10911", 0, register_body({"T": (4, 4, 6)})))
            assert (await route(client, addr, "T")).code == ResponseCode.SUCCESS
        await async_wait_until(lambda: not server.routes.broker_live_table, timeout=5)
        assert (await route(client, addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST
    with_registry(tmp_path, test)


def test_expiry_is_driven_by_the_injected_clock(tmp_path: Path) -> None:
    clock = FakeClock()

    async def test(server: RegistryServer, client: RemotingClient, addr: str) -> None:
        broker = RemotingClient(announce=False)
        await broker.invoke(addr, register_request("a", "10.0.0.1:10911", 0, register_body({"T": (4, 4, 6)})))
        broker_conn = await broker.connection(addr)
        await client.invoke(addr, register_request("b", "10.0.0.2:10911", 0, register_body({"T": (4, 4, 6)})))
        clock.advance(119)
        await client.invoke(addr, register_request("b", "10.0.0.2:10911", 0, register_body({"T": (4, 4, 6)})))
        await asyncio.sleep(0.1)     # several scans pass with nobody expired
        assert len(server.routes.broker_live_table) == 2
        clock.advance(2)             # a is now 121 s silent, b 2 s
        await async_wait_until(lambda: len(server.routes.broker_live_table) == 1, timeout=5)
        names = [b["brokerName"] for b in strict_json((await route(client, addr, "T")).body)["brokerDatas"]]
        assert names == ["b"]
        await async_wait_until(lambda: broker_conn.closed, timeout=5)   # the expired broker's connection is closed
        await broker.close()
    with_registry(tmp_path, test, clock=clock, scan_interval=0.02, broker_expiry=120.0)
