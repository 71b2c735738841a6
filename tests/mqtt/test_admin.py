"""The MQTT actor's admin channel (smartgo/mqtt/admin.py) over a real engine fed real packets, over its
UNIX socket, and the broker actor's side that asks every MQTT actor of the node (mqtt_processor.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from smartgo.broker.channel import ClientRef
from smartgo.broker.processor.mqtt_processor import MqttProcessor
from smartgo.config import NodeConfig
from smartgo.mqtt import codec as c
from smartgo.mqtt.admin import (AdminError, AdminServer, answer, ask, ask_blocking, handle_line, merge_stats,
                                socket_path)
from smartgo.mqtt.auth import Authenticator
from smartgo.mqtt.local import connected
from smartgo.mqtt.engine import Engine, Limits
from smartgo.mqtt.stats import MqttStats
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from tests.support.engine import Store, connect


@pytest.fixture
def engine() -> Engine:
    e = Engine(Limits(), Store(), Authenticator())
    connect(e, "dev-b", 5001, filters=("devices/b/#", "alarms/+"))
    connect(e, "dev-a", 5002, version=4, filters=("devices/a/cmd",))
    conn, _ = connect(e, "away-1", 5003, expiry=600, filters=("devices/#",))
    conn.connection_lost(None)
    return e


def test_clients_lists_the_connected_ones_with_their_connection(engine: Engine) -> None:
    got = answer(engine, {"op": "clients"})
    assert got["total"] == 2
    assert got["items"] == [
        {"client_id": "dev-a", "peer": "127.0.0.1:5002", "listener": "tcp", "version": 4, "keep_alive": 30,
         "subscriptions": 1, "inflight": 0, "queued": 0},
        {"client_id": "dev-b", "peer": "127.0.0.1:5001", "listener": "tcp", "version": 5, "keep_alive": 30,
         "subscriptions": 2, "inflight": 0, "queued": 0}]


def test_sessions_include_the_away_ones_with_their_expiry(engine: Engine) -> None:
    got = answer(engine, {"op": "sessions"}, now=lambda: engine.sessions["away-1"].ended_at + 100)
    rows = {r["client_id"]: r for r in got["items"]}
    assert set(rows) == {"away-1", "dev-a", "dev-b"}
    assert rows["away-1"]["connected"] is False and rows["away-1"]["expiry"] == 600
    assert rows["away-1"]["expires_in"] == 500
    assert rows["dev-a"]["connected"] is True and rows["dev-a"]["expiry"] == 0 and rows["dev-a"]["expires_in"] is None


def test_subscriptions_with_options_and_prefixes(engine: Engine) -> None:
    got = answer(engine, {"op": "subscriptions"})
    assert [(r["client_id"], r["filter"]) for r in got["items"]] == [
        ("away-1", "devices/#"), ("dev-a", "devices/a/cmd"), ("dev-b", "alarms/+"), ("dev-b", "devices/b/#")]
    assert got["items"][3] == {"client_id": "dev-b", "filter": "devices/b/#", "qos": 1, "no_local": True,
                               "retain_as_published": False, "retain_handling": 0, "identifier": 0}
    only = answer(engine, {"op": "subscriptions", "client": "dev-", "filter": "devices/"})
    assert [(r["client_id"], r["filter"]) for r in only["items"]] == [("dev-a", "devices/a/cmd"),
                                                                     ("dev-b", "devices/b/#")]


def test_limit_cuts_the_list_but_total_counts_every_match(engine: Engine) -> None:
    got = answer(engine, {"op": "sessions", "limit": 1})
    assert got["total"] == 3 and [r["client_id"] for r in got["items"]] == ["away-1"]
    assert answer(engine, {"op": "clients", "client": "dev-b"})["total"] == 1


def test_kick_disconnects_with_administrative_action(engine: Engine) -> None:
    conn = engine.sessions["dev-b"].connection
    wire = conn.transport
    sent = len(wire.out)
    assert answer(engine, {"op": "kick", "client": "dev-b"}) == {"ok": True, "kicked": True}
    assert wire.closed
    decoder = c.Decoder(server=False)
    decoder.version = 5
    packets = decoder.feed(bytes(wire.out[sent:]))
    assert [type(p) for p in packets] == [c.Disconnect] and packets[0].reason == c.ADMINISTRATIVE_ACTION
    assert answer(engine, {"op": "kick", "client": "dev-b"})["kicked"] is False       # gone already
    assert answer(engine, {"op": "kick", "client": "away-1"})["kicked"] is False      # not connected
    assert engine.stats.connections == 1


def test_stats_and_their_sum(engine: Engine) -> None:
    stats = answer(engine, {"op": "stats"})["stats"]
    assert stats["connections"] == 2 and stats["sessions"] == 3 and stats["subscriptions"] == 4
    total = merge_stats([stats, stats])
    assert total["sessions"] == 6 and total["messages_in"] == [2 * n for n in stats["messages_in"]]


@pytest.mark.parametrize("request_, error", [
    ({"op": "nope"}, "unknown op"), ([1], "JSON object"), ({"op": "clients", "limit": -1}, "limit"),
    ({"op": "clients", "limit": "9"}, "limit"), ({"op": "kick"}, "client id"), ({"op": "clients", "client": 3},
                                                                                "string")])
def test_bad_requests_get_an_error(engine: Engine, request_: object, error: str) -> None:
    with pytest.raises(AdminError, match=error):
        answer(engine, request_)
    reply = json.loads(handle_line(engine, json.dumps(request_).encode()))
    assert reply["ok"] is False and error in reply["error"]


def test_the_socket_answers_line_by_line(engine: Engine, tmp_path: Path) -> None:
    path = socket_path(tmp_path, "mqtt-0")       # an abstract name: nothing on disk, no path-length limit

    async def scenario() -> None:
        server = AdminServer(engine, path)
        assert await server.start()
        try:
            got = await ask(path, {"op": "clients", "limit": 1})
            assert got["total"] == 2 and got["items"][0]["client_id"] == "dev-a"
            with pytest.raises(AdminError, match="unknown op"):
                await ask(path, {"op": "nope"})
            reader, writer = await asyncio.open_unix_connection(sock=connected(path, 3.0))
            writer.write(b"not json\n" + json.dumps({"op": "stats"}).encode() + b"\n")
            first, second = json.loads(await reader.readline()), json.loads(await reader.readline())
            assert first["ok"] is False and second["stats"]["connections"] == 2
            writer.close()
            blocking = await asyncio.to_thread(ask_blocking, path, {"op": "sessions"})
            assert blocking["total"] == 3
        finally:
            await server.close()
        with pytest.raises(OSError):
            await ask(path, {"op": "stats"})
    asyncio.run(scenario())


def test_the_broker_actor_merges_its_mqtt_actors(engine: Engine, tmp_path: Path) -> None:
    """MqttProcessor (smartgo/broker/processor/mqtt_processor.py) over two actors' sockets: lists
    merged and cut, a kick where the client is, an actor that does not answer named, counters
    that only grow (an actor restarted from zero adds its new counts)."""
    cfg = NodeConfig(role="master", store_dir=str(tmp_path), mqtt_actors=2, mqtt_port=1883, mqtt_ws_port=0)
    other = Engine(Limits(), Store(), Authenticator())
    connect(other, "dev-c", 5004, filters=("devices/c/#",))
    engine.stats.messages_in[1], other.stats.messages_in[1] = 7, 4
    cfg.run_path.mkdir()
    servers = [AdminServer(e, socket_path(cfg.run_path, name)) for e, name in ((engine, "mqtt-0"), (other, "mqtt-1"))]
    processor = MqttProcessor(cast(Any, SimpleNamespace(config=cfg, log=logging.getLogger("test"))))
    client = ClientRef("net-0", 1, "127.0.0.1:40000")

    async def admin(**request: object) -> tuple[int, dict]:
        got = await processor.mqtt_admin(client, RemotingCommand(RequestCode.MQTT_ADMIN,
                                                                 body=json.dumps(request).encode()))
        return got.code, json.loads(got.body_bytes()) if got.code == ResponseCode.SUCCESS else {"remark": got.remark}

    async def scenario() -> None:
        for server in servers:
            assert await server.start()
        code, got = await admin(op="clients")
        assert code == ResponseCode.SUCCESS and got["actors"] == ["mqtt-0", "mqtt-1"] and got["errors"] == {}
        assert [i["client_id"] for i in got["items"]] == ["dev-a", "dev-b", "dev-c"] and got["total"] == 3
        code, got = await admin(op="subscriptions", filter="devices/", limit=2)
        assert [(i["client_id"], i["filter"]) for i in got["items"]] == [("away-1", "devices/#"),
                                                                         ("dev-a", "devices/a/cmd")]
        assert got["total"] == 4
        assert (await admin(op="clients", limit="x"))[1]["remark"].startswith("MQTT_ADMIN: limit must be")
        assert (await admin(op="drop"))[0] == ResponseCode.SYSTEM_ERROR
        assert (await admin(op="kick"))[1]["remark"] == "MQTT_ADMIN: kick needs a client id"

        await processor.poll()
        assert processor.totals["messages_in"] == [0, 11, 0]
        assert processor.summary()["connections"] == 3 and processor.summary()["sessions"] == 4
        assert (await admin(op="kick", client="dev-c"))[1]["kicked"] is True
        other.stats = MqttStats(messages_in=[0, 2, 0])       # mqtt-1 restarted: its counters from zero
        engine.stats.messages_in[1] = 9
        await processor.poll()
        assert processor.totals["messages_in"] == [0, 15, 0]          # +2 of mqtt-0, +2 of the new mqtt-1
        window = processor.take_window()
        assert window["messages_in"] == [0, 15, 0] and window["connections"] == 2 and window["dropped"] == 0
        assert processor.take_window()["messages_in"] == [0, 0, 0]      # the next window starts empty

        await servers[1].close()
        code, got = await admin(op="sessions")
        assert code == ResponseCode.SUCCESS and list(got["errors"]) == ["mqtt-1"]
        assert [i["client_id"] for i in got["items"]] == ["away-1", "dev-a", "dev-b"]
        await servers[0].close()
    asyncio.run(scenario())


def test_a_broker_without_mqtt_actors_answers_empty(tmp_path: Path) -> None:
    cfg = NodeConfig(role="master", store_dir=str(tmp_path), mqtt_port=0, mqtt_ws_port=0)
    processor = MqttProcessor(cast(Any, SimpleNamespace(config=cfg, log=logging.getLogger("test"))))

    async def admin(**request: object) -> RemotingCommand:
        return await processor.mqtt_admin(ClientRef("net-0", 1, "127.0.0.1:40000"),
                                          RemotingCommand(RequestCode.MQTT_ADMIN, body=json.dumps(request).encode()))
    got = asyncio.run(admin(op="clients"))
    assert json.loads(got.body_bytes()) == {"actors": [], "errors": {}, "total": 0, "items": []}
    assert asyncio.run(admin(op="clients", limit="x")).remark == \
        "MQTT_ADMIN: limit must be a whole number >= 0, not 'x'"     # checked here too: no actor does
    assert processor.summary() is None and processor.take_window() is None
    slave = NodeConfig(role="slave", broker_id=1, store_dir=str(tmp_path), mqtt_port=1883, mqtt_actors=2)
    assert MqttProcessor(cast(Any, SimpleNamespace(config=slave))).actors == ["mqtt-0", "mqtt-1"]   # devices too


def test_the_channels_of_a_node_deep_in_the_file_system_are_served(engine: Engine, tmp_path: Path) -> None:
    """A run dir past the 108 bytes of a UNIX socket path (a benchmark's store deep in a test's temporary
    directory): the admin and peer channels are abstract names, so they are served all the same."""
    from smartgo.mqtt.peers import PeerServer, peer_path
    from smartgo.mqtt.peers import ask as ask_peer
    run = tmp_path / ("deep-" * 30) / "run"

    async def scenario() -> None:
        admin = AdminServer(engine, socket_path(run, "mqtt-0"))
        peer = PeerServer(peer_path(run, "mqtt-1"), lambda request: {"found": False, "op": request["op"]})
        assert await admin.start()
        await peer.start()
        try:
            assert (await ask(socket_path(run, "mqtt-0"), {"op": "stats"}))["stats"]["connections"] == 2
            assert await ask_peer(peer_path(run, "mqtt-1"), {"op": "take"}) == {"found": False, "op": "take"}
        finally:
            await admin.close()
            await peer.close()
    asyncio.run(scenario())
