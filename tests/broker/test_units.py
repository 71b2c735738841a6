"""In-process tests of the broker's pure parts: cleanup policy, topics, properties, filters, the channel."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime
from pathlib import Path

import pytest

from smartgo.actors.ring import CONSUMER, PRODUCER, Doorbell, Ring
from smartgo.broker.channel import BrokerLink, ChannelError, ChannelServer, ClientRef, InvokeError
from smartgo.broker.actors.cleanup_actor import CleanupPolicy, Decision, clean
from smartgo.broker.processor.message_filter import EVERYTHING, FilterError, Filters, tag_codes
from smartgo.filter import compile_selector
from smartgo.broker.processor.send_processor import stored_properties
from smartgo.broker.managers.topics import (DEFAULT_TOPIC, TopicConfig, TopicSnapshot, auto_created, default_topics,
                                            parse_static_topics, read_snapshot, write_snapshot)
from smartgo.config import ConfigError, NodeConfig
from smartgo.net.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store import StoreConfig
from smartgo.store.java_hash import java_hash
from smartgo.store.mapped_file import create_segment, segment_name, segment_starts

HOUR_MS = 3_600_000


def at_hour(hour: int) -> int:
    return int(datetime(2024, 5, 6, hour, 30).timestamp() * 1000)


def policy(usage: float, hour: int, **settings) -> CleanupPolicy:
    return CleanupPolicy(NodeConfig(role="master", **settings), lambda: at_hour(hour), lambda _: usage)


@pytest.mark.parametrize("usage, hour, full, delete, force", [
    (0.50, 3, False, False, False),     # nothing to do
    (0.50, 4, False, True, False),      # deleteWhen: expired files go at 04:xx
    (0.76, 3, False, True, False),      # over 75 %: expired files go at any hour
    (0.86, 3, False, True, True),       # over 85 %: the oldest go even unexpired
    (0.90, 3, True, True, True),        # 90 %: sends refused
])
def test_cleanup_watermarks_and_hour(usage, hour, full, delete, force):
    d = policy(usage, hour).decide("/store")
    assert (d.disk_full, d.delete, d.force) == (full, delete, force)


def test_disk_full_flag_has_hysteresis_down_to_the_force_clean_mark():
    level = [0.95]
    p = CleanupPolicy(NodeConfig(role="master"), lambda: at_hour(12), lambda _: level[0])
    assert p.decide("/s").disk_full
    level[0] = 0.87
    assert p.decide("/s").disk_full                      # still above 85 %
    level[0] = 0.85
    assert not p.decide("/s").disk_full


def test_delete_when_lists_several_hours():
    assert policy(0.1, 5, delete_when="04;05").decide("/s").delete
    assert not policy(0.1, 6, delete_when="04;05").decide("/s").delete


def _commitlog(tmp: Path, ages_h: list[float], now_ms: int) -> StoreConfig:
    cfg = StoreConfig(store_path=str(tmp), commitlog_file_size=4096, file_reserved_time_hours=72)
    cfg.commitlog_dir.mkdir(parents=True)
    for i, age in enumerate(ages_h):
        path = cfg.commitlog_dir / segment_name(i * 4096)
        create_segment(path, 4096)
        t = (now_ms - age * HOUR_MS) / 1000
        os.utime(path, (t, t))
    return cfg


def test_clean_keeps_unexpired_files_and_never_the_newest(tmp_path):
    now = at_hour(4)
    cfg = _commitlog(tmp_path, [100, 90, 80, 10, 200], now)     # the newest file is old too
    minimum = clean(cfg, Decision(0.5, False, True, False), now, max_files=10)
    assert segment_starts(cfg.commitlog_dir) == [3 * 4096, 4 * 4096] and minimum == 3 * 4096


def test_clean_at_most_max_files_a_pass_and_forced_ignores_age(tmp_path):
    now = at_hour(12)
    cfg = _commitlog(tmp_path, [1, 1, 1, 1, 1], now)
    assert clean(cfg, Decision(0.5, False, True, False), now, max_files=10) == 0      # young: kept
    assert clean(cfg, Decision(0.9, True, True, True), now, max_files=2) == 2 * 4096
    assert clean(cfg, Decision(0.9, True, True, True), now, max_files=10) == 4 * 4096  # never the last
    assert clean(cfg, Decision(0.9, True, False, True), now, max_files=10) == 4 * 4096


def test_static_topics_and_defaults():
    assert parse_static_topics("A:4; B:2:4 ,C") == [TopicConfig("A", 4, 4), TopicConfig("B", 2, 2, 4),
                                                     TopicConfig("C", 8, 8)]
    for bad in ("A:x", "A:0", "A:1:2:3", ":3"):
        with pytest.raises(ConfigError):
            parse_static_topics(bad)
    names = {t.name: t for t in default_topics(NodeConfig(role="master", topics="Mine:3"))}
    assert names[DEFAULT_TOPIC].perm == 7 and names[DEFAULT_TOPIC].write_queues == 8
    assert names["Mine"].read_queues == 3 and "SELF_TEST_TOPIC" in names and "DefaultCluster" in names
    assert DEFAULT_TOPIC not in {t.name for t in default_topics(NodeConfig(role="master", auto_create_topic=False))}


def test_auto_created_topic_takes_the_smaller_queue_count_and_drops_inherit():
    tpl = TopicConfig(DEFAULT_TOPIC, 8, 8, 7)
    assert auto_created("New", tpl, 4) == TopicConfig("New", 4, 4, 6)
    assert auto_created("New", tpl, 64).write_queues == 8


def test_snapshot_round_trip_is_the_topic_config_wrapper(tmp_path):
    snap = TopicSnapshot(3, 1700000000000, {"T": TopicConfig("T", 2, 2)})
    write_snapshot(tmp_path, snap)
    assert read_snapshot(tmp_path) == snap
    raw = (tmp_path / "config" / "topics.json").read_text()
    assert '"dataVersion":{"counter":3' in raw and '"topicConfigTable":{"T":{"order":false,"perm":6' in raw
    assert snap.with_topics([TopicConfig("U")]).version == 4
    assert read_snapshot(tmp_path / "none") is None


def test_stored_properties_drop_wait_and_add_cluster():
    assert stored_properties("TAGS\x01a\x02WAIT\x01true", "CLUSTER\x01C") == (b"TAGS\x01a\x02CLUSTER\x01C", True)
    assert stored_properties("WAIT\x01false\x02KEYS\x01k\x02", "CLUSTER\x01C") == (b"KEYS\x01k\x02CLUSTER\x01C", False)
    assert stored_properties("TAGS\x01a\x02", "CLUSTER\x01C") == (b"TAGS\x01a\x02CLUSTER\x01C", True)
    assert stored_properties("", "CLUSTER\x01C") == (b"CLUSTER\x01C", True)


def test_tag_filters_are_java_hash_codes():
    assert tag_codes("*") is None and tag_codes(None) is None and tag_codes("  ") is None
    assert tag_codes("TagA || TagB ||") == frozenset({java_hash("TagA"), java_hash("TagB")})


def test_filters_compile_once_and_remember_failures(monkeypatch):
    filters = Filters(property_filter=True)
    assert filters.get("TAG", "*") is EVERYTHING and filters.get("", None) is EVERYTHING   # no type is TAG
    assert filters.get("TAG", "A || B").codes == frozenset({java_hash("A"), java_hash("B")})
    sql = filters.get("SQL92", "a > 1")
    assert sql is filters.get("SQL92", "a > 1") and sql.codes is None
    assert sql.match(b"a\x012\x02b\x01x") is True and sql.match(b"a\x011") is False and sql.match(b"") is False
    compiled = []

    def counting(expression):
        compiled.append(expression)
        return compile_selector(expression)
    monkeypatch.setattr("smartgo.broker.processor.message_filter.compile_selector", counting)
    raised = []
    for _ in range(3):                                  # a failure is kept too: no recompiling per pull
        with pytest.raises(FilterError, match="invalid SQL92 expression 'a >'") as failure:
            filters.get("SQL92", "a >")
        raised.append(failure.value)
    assert compiled == ["a >"]
    assert len({id(e) for e in raised}) == 3            # a fresh exception each time: no traceback chain grows
    with pytest.raises(FilterError, match="unknown expression type 'JS'"):
        filters.get("JS", "true")


def test_filters_keep_compiled_expressions_within_a_text_budget():
    filters = Filters(property_filter=True, budget=3 * (100 + 20))
    texts = [f"a = '{i:014d}'" for i in range(4)]                # 20 characters each
    first = [filters.get("SQL92", t) for t in texts]
    assert all(filters.get("SQL92", texts[i]) is first[i] for i in (3, 2, 1))   # kept: no recompiling
    assert filters.get("SQL92", texts[0]) is not first[0]        # the oldest was dropped, and recompiles
    huge = "a IN (" + ",".join(f"'{i}'" for i in range(10_000)) + ")"
    assert filters.get("SQL92", huge[:60_000].rsplit(",", 1)[0] + ")").match(b"a\x017") is True
    assert len(filters._cache) == 1                              # over budget alone: only the newest stays
    assert Filters(property_filter=False).unsupported("SQL92").endswith("filter message by SQL92")
    assert Filters(property_filter=False).unsupported("TAG") is None


# ---- the request channel, in one process ---------------------------------------------------------------

async def _channel(tmp_path: Path):
    bells = {n: Doorbell(tmp_path / f"{n}.bell") for n in ("net", "broker")}
    net_out = Ring.attach(tmp_path / "ctl.ring", PRODUCER, 1 << 16, bells["net"])
    broker_in = Ring.attach(tmp_path / "ctl.ring", CONSUMER, 1 << 16, bells["broker"])
    broker_out = Ring.attach(tmp_path / "ctlr.ring", PRODUCER, 1 << 16, bells["broker"])
    net_in = Ring.attach(tmp_path / "ctlr.ring", CONSUMER, 1 << 16, bells["net"])
    pushed: list = []

    async def invoke(conn: int, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """A stand-in for the net actor's client connections 7 (answers), 8 (times out), 9
        (closed) and 10 (never answers at all)."""
        if conn == 8:
            raise InvokeError(f"no answer within {timeout}", timeout=True)
        if conn == 9:
            raise InvokeError("the client's connection is closed")
        if conn == 10:
            await asyncio.sleep(60)
        return RemotingCommand(ResponseCode.SUCCESS, remark=f"conn {conn} got {cmd.code} ({timeout})", body=cmd.body)
    link = BrokerLink(net_out, lambda conn, cmd: pushed.append((conn, cmd)), invoke)
    server = ChannelServer({"net-0": broker_in}, {"net-0": broker_out})
    events: list = []
    server.events["conn_closed"] = lambda net, args: events.append((net, args))

    async def create(net: str, args: dict) -> dict:
        return {"made": args["topic"], "by": net}

    async def table(client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        server.push(client, RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, flag=FLAG_ONEWAY,
                                            ext_fields={"consumerGroup": "G"}))
        return request.make_response(ResponseCode.SUCCESS, f"for {client.addr}", body=b"table")

    server.calls["create_topic"] = create
    server.processors[RequestCode.GET_ALL_TOPIC_CONFIG] = table
    serve = asyncio.get_running_loop().create_task(server.run(bells["broker"]))

    async def pump():
        while True:
            records = net_in.read()
            if records:
                link.on_records(records)
                net_in.release()
            await asyncio.sleep(0.001)
    pumping = asyncio.get_running_loop().create_task(pump())
    return link, pushed, events, [serve, pumping], server


def test_channel_calls_forwards_pushes_and_events(tmp_path):
    async def main():
        link, pushed, events, tasks, _ = await _channel(tmp_path)
        try:
            assert await link.call("create_topic", topic="T") == {"made": "T", "by": "net-0"}
            with pytest.raises(ChannelError, match="unknown broker call"):
                await link.call("nope")
            request = RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG, opaque=41, ext_fields={"x": "1"})
            raw = await link.forward(ClientRef("net-0", 7, "10.0.0.1:5555"), request)
            assert raw[0] == ResponseCode.SUCCESS and raw[5] == "for 10.0.0.1:5555" and raw[7] == b"table"
            assert pushed and pushed[0][0] == 7 and pushed[0][1].code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
            with pytest.raises(ChannelError, match="no processor for code 12"):
                await link.forward(ClientRef("net-0", 7, "a"), RemotingCommand(RequestCode.QUERY_MESSAGE))
            link.event("conn_closed", conn=7, addr="10.0.0.1:5555")
            deadline = time.monotonic() + 2
            while not events and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert events == [("net-0", {"conn": 7, "addr": "10.0.0.1:5555"})]
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.run(main())


def test_channel_invocations_bring_the_client_response_or_the_reason_back(tmp_path):
    async def main():
        _, _, _, tasks, server = await _channel(tmp_path)
        try:
            ask = RemotingCommand(RequestCode.GET_CONSUMER_RUNNING_INFO, ext_fields={"clientId": "c"}, body=b"q")
            got = await server.invoke(ClientRef("net-0", 7, "a:1"), ask, 2.0)
            assert (got.code, got.remark, got.body_bytes()) == (ResponseCode.SUCCESS, "conn 7 got 307 (2.0)", b"q")
            failures = []
            for conn, timeout in ((8, 2.0), (9, 2.0), (10, 0.1)):
                with pytest.raises(InvokeError) as caught:
                    await server.invoke(ClientRef("net-0", conn, "a:1"), ask, timeout)
                failures.append((caught.value.timeout, str(caught.value)))
            assert failures == [(True, "no answer within 2.0"), (False, "the client's connection is closed"),
                                (True, "no response from a:1 through net-0 within 0.1s")]
            with pytest.raises(InvokeError, match="no net actor net-9"):
                await server.invoke(ClientRef("net-9", 7, "a:1"), ask, 2.0)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.run(main())


def test_a_call_nobody_answers_times_out(tmp_path):
    async def main():
        ring = Ring.attach(tmp_path / "lonely.ring", PRODUCER, 1 << 16, Doorbell(tmp_path / "b.bell"))

        async def invoke(conn: int, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
            raise InvokeError("not here")
        link = BrokerLink(ring, lambda conn, cmd: None, invoke)
        with pytest.raises(ChannelError, match="did not answer create_topic"):
            await link.call("create_topic", timeout=0.1, topic="T")
    asyncio.run(main())


def test_a_stopping_link_settles_the_requests_it_forwarded(tmp_path):
    """The answer to a forwarded request the broker actor is still working on (a role change that
    restarts the node) goes out before the net actor closes its connections; one that never comes
    holds the stop at most the timeout."""
    async def main():
        link, _, _, tasks, server = await _channel(tmp_path)
        release = asyncio.Event()

        async def slow(client: ClientRef, request: RemotingCommand) -> RemotingCommand:
            await release.wait()
            return request.make_response(ResponseCode.SUCCESS, "changed")

        server.processors[RequestCode.NOTIFY_BROKER_ROLE_CHANGED] = slow
        try:
            await link.settle(5)                                 # nothing in flight: at once
            forwarded = asyncio.get_running_loop().create_task(
                link.forward(ClientRef("net-0", 7, "a"), RemotingCommand(RequestCode.NOTIFY_BROKER_ROLE_CHANGED)))
            await asyncio.sleep(0)                               # it is handed over
            began = time.monotonic()
            await link.settle(0.1)                               # no answer yet: bounded
            assert 0.09 <= time.monotonic() - began < 2 and not forwarded.done()
            asyncio.get_running_loop().call_later(0.05, release.set)
            await link.settle(5)
            assert forwarded.done() and forwarded.result()[5] == "changed"
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.run(main())
