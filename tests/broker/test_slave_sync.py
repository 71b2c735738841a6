"""SlaveSynchronize (smartgo.broker.ha.slave_sync): fetching a real master's four tables, applying them
to a slave's files and managers (counter rules, nothing rewritten when equal, a failed write),
and a master that answers garbage or errors."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from smartgo.broker.actors.broker_actor import BrokerActor
from smartgo.broker.managers.groups import GroupConfig, GroupSnapshot, SubscriptionGroups, parse_group_snapshot
from smartgo.broker.managers.offsets import ConsumerOffsets
from smartgo.broker.schedule.schedule_offsets import DELAY_OFFSET_FILE, DelayOffsetFile, DelayState
from tests.support.schedule import delayed_command, max_offset
from smartgo.broker.ha.slave_sync import (Changed, MasterState, SlaveSyncError, apply_state, fetch_master_state,
                                          next_topics, run_slave_sync)
from tests.support.broker import update_offset_command
from smartgo.broker.managers.topics import SNAPSHOT, TopicConfig, TopicSnapshot, read_snapshot, write_snapshot
from smartgo.net import fastjson
from smartgo.net.client import RemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.server import RemotingServer
from tests.support.waits import async_wait_until, free_port, wait_until

HOST = "127.0.0.1"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
GROUPS_FILE = Path("config") / "subscriptionGroup.json"
OFFSETS_FILE = Path("config") / "consumerOffset.json"


# ---- against a real master ----------------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_fetch_from_a_real_master_and_apply_to_a_fresh_slave(start_node, tmp_path):
    master = start_node()
    topic, group = "SyncedTopic", "SyncedGroup"
    r = master.call(RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields={
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "3", "writeQueueNums": "3", "perm": "6",
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}))
    assert r.code == ResponseCode.SUCCESS
    cfg = GroupConfig(group, consume_broadcast_enable=False, retry_queue_nums=2, retry_max_times=5)
    r = master.call(RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                    body=fastjson.dumps(cfg.to_json())))
    assert r.code == ResponseCode.SUCCESS
    for queue_id, offset in ((0, 7), (2, 3)):
        assert master.call(update_offset_command(group, topic, queue_id, offset)).code == ResponseCode.SUCCESS
    assert master.call(delayed_command(topic, b"later", 1)).code == ResponseCode.SUCCESS
    delay_file = master.node.store / DELAY_OFFSET_FILE
    wait_until(lambda: max_offset(master.call, SCHEDULE_TOPIC, 0) == 1
               and delay_file.exists() and json.loads(delay_file.read_bytes())["offsetTable"].get("1") == 1,
               timeout=15, message="the delayed message delivered and counted in delayOffset.json")

    async def fetch() -> MasterState:
        async with RemotingClient() as client:
            return await fetch_master_state(client, master.addr, 5.0)
    state = asyncio.run(fetch())

    assert state.topics == read_snapshot(master.node.store)             # table and dataVersion, as on its disk
    assert state.topics.topics[topic] == TopicConfig(topic, 3, 3, 6) and state.topics.version > 1
    assert state.offsets == {(topic, group): {0: 7, 2: 3}}
    assert state.groups == parse_group_snapshot((master.node.store / GROUPS_FILE).read_bytes())
    assert state.groups.table[group] == cfg
    saved_delay = {int(k): v for k, v in json.loads(delay_file.read_bytes())["offsetTable"].items()}
    assert state.delay == DelayState(saved_delay, None) and state.delay.offsets[1] == 1

    slave = tmp_path / "slave"
    groups, offsets = SubscriptionGroups.load(slave), ConsumerOffsets.load(slave)
    changed = apply_state(slave, TopicSnapshot(0, 0, {}), groups, offsets, state)
    assert changed.topics == state.topics and topic in changed.topic_names and changed.offsets == 1
    assert read_snapshot(slave) == read_snapshot(master.node.store)
    assert ConsumerOffsets.load(slave).table == {(topic, group): {0: 7, 2: 3}}
    assert (slave / GROUPS_FILE).read_bytes() == (master.node.store / GROUPS_FILE).read_bytes()
    assert DelayOffsetFile(slave).load() == DelayState(saved_delay, None)


# ---- applying, without a node -------------------------------------------------------------------------------
def _slave(store: Path) -> tuple[TopicSnapshot, SubscriptionGroups, ConsumerOffsets]:
    """A slave's tables as a first start leaves them, plus offsets of its own."""
    snapshot = TopicSnapshot(1, 1_000, {"SELF_TEST_TOPIC": TopicConfig("SELF_TEST_TOPIC", 1, 1),
                                        "OnlyOnSlave": TopicConfig("OnlyOnSlave", 2, 2)})
    write_snapshot(store, snapshot)
    groups = SubscriptionGroups.load(store)
    offsets = ConsumerOffsets.load(store)
    offsets.commit("G1", "T1", 0, 1)                   # the master has a newer one
    offsets.commit("G9", "OnlyOnSlave", 0, 5)          # the master has none: putAll keeps it
    offsets.persist()
    return snapshot, groups, offsets


def _master(groups: SubscriptionGroups) -> MasterState:
    topics = {"SELF_TEST_TOPIC": TopicConfig("SELF_TEST_TOPIC", 1, 1), "T1": TopicConfig("T1", 4, 4)}
    table = {**groups.table, "G1": GroupConfig("G1", consume_enable=False)}
    return MasterState(TopicSnapshot(5, 2_000, topics), {("T1", "G1"): {0: 12, 1: 7}},
                       GroupSnapshot(groups.version + 3, 3_000, table), DelayState({1: 4, 2: 0}, None))


def _inodes(store: Path) -> dict[Path, int]:
    """Every persisted file is replaced by a rename, so a new inode means it was written."""
    return {p: os.stat(store / p).st_ino for p in (SNAPSHOT, OFFSETS_FILE, GROUPS_FILE, DELAY_OFFSET_FILE)}


@pytest.mark.timeout(10)
def test_apply_takes_the_masters_tables_once(tmp_path, caplog):
    snapshot, groups, offsets = _slave(tmp_path)
    state = _master(groups)
    with caplog.at_level(logging.INFO, logger="smartgo.broker.ha.slave_sync"):
        changed = apply_state(tmp_path, snapshot, groups, offsets, state)
    assert changed.topics == state.topics == read_snapshot(tmp_path)       # the master's dataVersion adopted
    assert changed.topic_names == {"T1", "OnlyOnSlave"}
    assert ConsumerOffsets.load(tmp_path).table == {("T1", "G1"): {0: 12, 1: 7}, ("OnlyOnSlave", "G9"): {0: 5}}
    assert changed.offsets == 1 and offsets.table[("T1", "G1")] == {0: 12, 1: 7}
    assert parse_group_snapshot((tmp_path / GROUPS_FILE).read_bytes()) == state.groups == groups.snapshot()
    assert changed.groups == state.groups and changed.group_names == {"G1"}
    assert DelayOffsetFile(tmp_path).load() == DelayState({1: 4, 2: 0}, None) and changed.delay
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "topics version 5 (2 added/changed/removed)" in caplog.records[0].getMessage()

    caplog.clear()
    before = _inodes(tmp_path)
    with caplog.at_level(logging.INFO, logger="smartgo.broker.ha.slave_sync"):
        again = apply_state(tmp_path, changed.topics, groups, offsets, state)
    assert not again and again == Changed()
    assert _inodes(tmp_path) == before                                     # nothing rewritten
    assert caplog.records == []


@pytest.mark.timeout(10)
def test_the_topic_counter_never_goes_down():
    a, b = {"A": TopicConfig("A")}, {"B": TopicConfig("B")}
    ours = TopicSnapshot(5, 100, a)
    assert next_topics(ours, TopicSnapshot(6, 200, b)) == TopicSnapshot(6, 200, b)      # ahead: taken as is
    assert next_topics(ours, TopicSnapshot(5, 200, a)) == TopicSnapshot(5, 200, a)      # same table: its timestamp
    assert next_topics(ours, TopicSnapshot(5, 100, a)) is None
    assert next_topics(ours, TopicSnapshot(5, 200, b)) == TopicSnapshot(6, 200, b)      # the board word must move
    assert next_topics(ours, TopicSnapshot(3, 200, b)) == TopicSnapshot(6, 200, b)
    assert next_topics(ours, TopicSnapshot(3, 200, a)) is None


@pytest.mark.timeout(10)
def test_a_failed_write_leaves_that_table_and_the_others_go_on(tmp_path, caplog):
    snapshot, groups, offsets = _slave(tmp_path)
    state = _master(groups)
    (tmp_path / "config" / f".topics.json.{os.getpid()}.tmp").mkdir()    # the snapshot's temp file cannot be made
    with caplog.at_level(logging.ERROR, logger="smartgo.broker.ha.slave_sync"):
        changed = apply_state(tmp_path, snapshot, groups, offsets, state)
    assert changed.topics is None and read_snapshot(tmp_path) == snapshot
    assert "topic table not written" in caplog.text
    assert changed.offsets == 1 and changed.delay and changed.groups == state.groups
    assert DelayOffsetFile(tmp_path).load() == state.delay


@pytest.mark.timeout(10)
def test_the_broker_actor_publishes_what_changed(tmp_path):
    snapshot, groups, offsets = _slave(tmp_path)
    state = _master(groups)
    synced: list[set[str]] = []
    board_word = SimpleNamespace(value=snapshot.version)
    broker = SimpleNamespace(config=SimpleNamespace(store_path=tmp_path), snapshot=snapshot, groups=groups,
                             offsets=offsets, version=SimpleNamespace(set=lambda v: setattr(board_word, "value", v)),
                             sync_groups=synced.append)
    BrokerActor.apply_master_state(broker, state)
    assert broker.snapshot == state.topics and board_word.value == 5
    assert synced == [{"G1"}]


# ---- a master that answers badly ------------------------------------------------------------------------------
TOPICS = (b'{"dataVersion":{"counter":7,"timestamp":1700000000000},"topicConfigTable":{"T1":{"order":false,'
          b'"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"T1","topicSysFlag":0,'
          b'"writeQueueNums":4}}}')
OFFSETS = b'{"offsetTable":{"T1@G1":{0:12,1:7}}}'                  # fastjson's bare keys, as Java writes them
DELAY = b'{"offsetTable":{1:12,2:0}}'
GROUPS = (b'{"dataVersion":{"counter":3,"timestamp":1700000000001},"subscriptionGroupTable":{"G1":{"brokerId":0,'
          b'"consumeBroadcastEnable":true,"consumeEnable":false,"consumeFromMinEnable":true,"groupName":"G1",'
          b'"notifyConsumerIdsChangedEnable":true,"retryMaxTimes":5,"retryQueueNums":1,'
          b'"whichBrokerWhenConsumeSlowly":1}}}')
GOOD = {RequestCode.GET_ALL_TOPIC_CONFIG: TOPICS, RequestCode.GET_ALL_CONSUMER_OFFSET: OFFSETS,
        RequestCode.GET_ALL_DELAY_OFFSET: DELAY, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: GROUPS}
EXPECTED = MasterState(TopicSnapshot(7, 1700000000000, {"T1": TopicConfig("T1", 4, 4, 6)}),
                       {("T1", "G1"): {0: 12, 1: 7}},
                       GroupSnapshot(3, 1700000000001, {"G1": GroupConfig("G1", consume_enable=False,
                                                                           retry_max_times=5)}),
                       DelayState({1: 12, 2: 0}, None))


class FakeMaster:
    """Answers the four codes with `bodies`, except what `bad` says: {code: body} or {code:
    (response code, remark)}; `requests` records every code asked."""

    def __init__(self, bad: dict | None = None) -> None:
        self.bad = dict(bad or {})
        self.requests: list[int] = []
        self.server = RemotingServer(HOST, [0], {code: self.answer for code in GOOD})

    async def answer(self, conn, request: RemotingCommand) -> RemotingCommand:
        self.requests.append(request.code)
        bad = self.bad.get(request.code)
        if isinstance(bad, tuple):
            return request.make_response(bad[0], bad[1])
        return request.make_response(ResponseCode.SUCCESS, body=GOOD[request.code] if bad is None else bad)

    @property
    def addr(self) -> str:
        return f"{HOST}:{self.server.port}"


async def _fetch_from(bad: dict | None) -> MasterState:
    master = FakeMaster(bad)
    async with master.server, RemotingClient() as client:
        return await fetch_master_state(client, master.addr, 2.0)


@pytest.mark.timeout(10)
def test_rocketmq_shaped_bodies_parse_exactly():
    assert asyncio.run(_fetch_from(None)) == EXPECTED


@pytest.mark.timeout(10)
@pytest.mark.parametrize("bad, names", [
    ({RequestCode.GET_ALL_TOPIC_CONFIG: b"<html>"}, ["GET_ALL_TOPIC_CONFIG (21)", "malformed body"]),
    ({RequestCode.GET_ALL_TOPIC_CONFIG: b'{"topicConfigTable":{"T":[]}}'}, ["GET_ALL_TOPIC_CONFIG", "malformed"]),
    ({RequestCode.GET_ALL_CONSUMER_OFFSET: b'{"offsetTable":{"no-at-sign":{0:1}}}'},
     ["GET_ALL_CONSUMER_OFFSET (43)", "malformed body", "topic@group"]),
    ({RequestCode.GET_ALL_DELAY_OFFSET: b'{"offsetTable":[1,2]}'}, ["GET_ALL_DELAY_OFFSET (45)", "malformed"]),
    ({RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: b'{"subscriptionGroupTable":{"G":{"groupName":"G",'
                                                    b'"retryQueueNums":"many"}}}'},
     ["GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201)", "retryQueueNums"]),
    ({RequestCode.GET_ALL_DELAY_OFFSET: (ResponseCode.SYSTEM_ERROR, "schedule file gone")},
     ["GET_ALL_DELAY_OFFSET (45)", "SYSTEM_ERROR (1)", "schedule file gone"]),
])
def test_a_bad_answer_is_an_error_naming_the_request(bad, names):
    with pytest.raises(SlaveSyncError) as err:
        asyncio.run(_fetch_from(bad))
    for name in names:
        assert name in str(err.value)


@pytest.mark.timeout(10)
def test_no_master_listening_is_an_error_naming_the_request():
    async def main() -> None:
        async with RemotingClient(connect_timeout=1.0) as client:
            await fetch_master_state(client, f"{HOST}:{free_port()}", 1.0)
    with pytest.raises(SlaveSyncError, match=r"GET_ALL_TOPIC_CONFIG \(21\) to master .* failed: connect"):
        asyncio.run(main())


@pytest.mark.timeout(10)
def test_the_loop_warns_goes_on_and_applies_once_the_master_answers(caplog):
    master = FakeMaster({RequestCode.GET_ALL_CONSUMER_OFFSET: b"garbled"})
    applied: list[MasterState] = []
    asked = []                                     # master_addr_of's calls; the first round has no master yet

    def master_addr() -> str | None:
        asked.append(len(master.requests))
        return None if len(asked) == 1 else master.addr

    async def main() -> None:
        async with master.server:
            task = asyncio.create_task(run_slave_sync(SimpleNamespace(apply_master_state=applied.append),
                                                      master_addr, 0.02, RemotingClient(), timeout=2.0))
            def retried() -> bool:
                return task.done() or master.requests.count(RequestCode.GET_ALL_CONSUMER_OFFSET) >= 2
            await async_wait_until(retried, timeout=5, message="a second attempt after a garbled answer")
            assert not task.done() and applied == []
            del master.bad[RequestCode.GET_ALL_CONSUMER_OFFSET]
            await async_wait_until(lambda: applied, timeout=5, message="a round with good answers applied")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    with caplog.at_level(logging.WARNING, logger="smartgo.broker.ha.slave_sync"):
        asyncio.run(main())
    assert applied[0] == EXPECTED
    assert master.requests[0] == RequestCode.GET_ALL_TOPIC_CONFIG and asked[1] == 0   # nothing asked while None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # two failed rounds or more, one line: the same failure is written once a minute
    assert len(warnings) == 1 and "GET_ALL_CONSUMER_OFFSET (43)" in warnings[0] and "malformed" in warnings[0]
