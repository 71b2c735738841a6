"""kvConfig.json: atomic persistence, reload, a corrupt file, and a real process restart."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.registry.kv_config import FILE_NAME, KVConfigManager

from .conftest import register_body, register_request, strict_json


def test_every_change_is_persisted_and_reloaded(tmp_path: Path) -> None:
    kv = KVConfigManager(tmp_path)
    kv.load()                               # no file yet: empty
    kv.put("ORDER_TOPIC_CONFIG", "T", "broker-a:4;broker-b:4")
    kv.put("ns", "k", "v")
    kv.delete("ns", "k")
    kv.delete("ns", "missing")
    on_disk = json.loads((tmp_path / FILE_NAME).read_text())
    assert on_disk == {"configTable": {"ORDER_TOPIC_CONFIG": {"T": "broker-a:4;broker-b:4"}}}
    assert not (tmp_path / f"{FILE_NAME}.tmp").exists()
    again = KVConfigManager(tmp_path)
    again.load()
    assert again.get("ORDER_TOPIC_CONFIG", "T") == "broker-a:4;broker-b:4" and again.namespace("ns") is None


@pytest.mark.parametrize("content", [b"{torn", b'{"configTable":{"ns":["not","a","map"]}}', b"[]"])
def test_a_corrupt_file_is_moved_aside(tmp_path: Path, content: bytes) -> None:
    (tmp_path / FILE_NAME).write_bytes(content)
    kv = KVConfigManager(tmp_path)
    kv.load()
    assert kv.table == {}
    aside = list(tmp_path.glob(f"{FILE_NAME}.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content
    kv.put("ns", "k", "v")
    assert json.loads((tmp_path / FILE_NAME).read_text())["configTable"] == {"ns": {"k": "v"}}


@pytest.mark.timeout(60)
def test_kv_config_survives_a_process_restart(registry_process) -> None:
    addr = f"127.0.0.1:{registry_process['port']}"
    first = registry_process["start"]()
    with BlockingRemotingClient(announce=False) as client:
        put = RemotingCommand(RequestCode.PUT_KV_CONFIG, ext_fields={
            "namespace": "ORDER_TOPIC_CONFIG", "key": "Orders", "value": "broker-a:8"})
        assert client.invoke(addr, put).code == ResponseCode.SUCCESS
        reply = client.invoke(addr, register_request("broker-a", "10.0.0.1:10911", 0, register_body({"Orders": (8, 8, 6)})))
        assert reply.code == ResponseCode.SUCCESS
    first.send_signal(signal.SIGTERM)
    assert first.wait(15) == 0                       # clean shutdown on SIGTERM
    registry_process["start"]()
    with BlockingRemotingClient(announce=False) as client:
        get = RemotingCommand(RequestCode.GET_KV_CONFIG, ext_fields={"namespace": "ORDER_TOPIC_CONFIG", "key": "Orders"})
        assert client.invoke(addr, get).ext_fields == {"value": "broker-a:8"}
        # routes are memory only: they come back when the broker registers again
        route = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "Orders"})
        assert client.invoke(addr, route).code == ResponseCode.TOPIC_NOT_EXIST
        client.invoke(addr, register_request("broker-a", "10.0.0.1:10911", 0, register_body({"Orders": (8, 8, 6)})))
        assert strict_json(client.invoke(addr, route).body)["orderTopicConf"] == "broker-a:8"
    assert json.loads((registry_process["store"] / FILE_NAME).read_text())["configTable"] == \
        {"ORDER_TOPIC_CONFIG": {"Orders": "broker-a:8"}}
