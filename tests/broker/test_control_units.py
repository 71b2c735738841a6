"""The control plane's parts in-process: crash-safe files, offsets, groups, heartbeat parsing, the
client table and locks on an injected clock, statistics windows and files, the broker config,
and the request channel's coalesced offsets."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from tests.support.nodes import ROOT
from smartgo.broker.broker_config import FILE, RuntimeConfig, check_updates, properties_text
from smartgo.broker.channel import BrokerLink, ClientRef
from smartgo.broker.managers.clients import ClientTable, registered
from smartgo.broker.managers.groups import DEFAULT_GROUPS, SubscriptionGroups, parse_group_body
from smartgo.broker.managers.locks import RebalanceLocks
from smartgo.broker.managers.offsets import ConsumerOffsets
from smartgo.broker.stats import stats_items
from smartgo.broker.stats.stats import LatencyHistogram, NetStats, StatsBook, minute_sample_ms
from smartgo.broker.stats.stats_files import StatsFiles
from smartgo.common.bodies import BodyError
from smartgo.common.heartbeat import parse_heartbeat
from smartgo.common.persist import PersistedFile
from smartgo.common.properties import parse_properties
from smartgo.config import ConfigError, NodeConfig
from tests.support.broker import heartbeat_body
from smartgo.stats_schema import file_hour_ms, file_name

HOUR_MS = 3_600_000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---- crash-safe files ------------------------------------------------------------------------------

def test_persisted_file_keeps_a_backup_and_falls_back_to_it(tmp_path, caplog):
    f = PersistedFile(tmp_path / "config" / "x.json")
    assert f.load(json.loads, "x") is None
    f.save(b'{"n": 1}')
    f.save(b'{"n": 2}')
    assert f.load(json.loads, "x") == {"n": 2} and json.loads(f.bak.read_bytes()) == {"n": 1}
    f.path.write_bytes(b'{"n": 3')                                   # corrupt (a bad disk, a hand edit)
    assert f.load(json.loads, "x") == {"n": 1}
    assert "x.json is corrupt" in caplog.text and "loaded the backup" in caplog.text


def test_a_crash_before_the_rename_leaves_the_old_file(tmp_path, monkeypatch):
    f = PersistedFile(tmp_path / "x.json")
    f.save(b'{"n": 1}')
    real = os.replace

    def crash(src, dst):
        if Path(dst) == f.path:
            raise KeyboardInterrupt("killed between write and rename")
        real(src, dst)
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        f.save(b'{"n": 2}')
    monkeypatch.setattr(os, "replace", real)
    assert json.loads(f.path.read_bytes()) == {"n": 1}
    f.save(b'{"n": 3}')                                              # the leftover temp file is no obstacle
    assert f.load(json.loads, "x") == {"n": 3}


def test_a_full_disk_leaves_the_file_and_no_temp_file_and_the_mode_is_kept(tmp_path, monkeypatch):
    f = PersistedFile(tmp_path / "plain_acl.yml")
    f.save(b"accounts: []\n")
    f.path.chmod(0o600)                                              # secrets: the owner only

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        f.save(b"accounts: [x]\n")
    monkeypatch.undo()
    assert f.path.read_bytes() == b"accounts: []\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain_acl.yml"]
    f.save(b"accounts: [y]\n")
    assert f.path.stat().st_mode & 0o777 == 0o600 and f.path.read_bytes() == b"accounts: [y]\n"


@pytest.mark.timeout(60)
def test_kill_9_while_saving_leaves_the_old_or_the_new_file(tmp_path):
    """A writer saving as fast as it can, and saying so after each save, is killed once it has
    said a random number of them, so the kill lands anywhere in a later save; the file always
    parses and holds the last save it reported or a later one (never a mix, never missing, never
    older)."""
    path = tmp_path / "x.json"
    script = (f"from smartgo.common.persist import PersistedFile\nf = PersistedFile({str(path)!r})\n"
              "import sys\nn = int(sys.argv[1])\n"
              "while True:\n    n += 1\n    f.save(('{\"n\": %d, \"pad\": \"%s\"}' % (n, 'x' * 20000)).encode())\n"
              "    print(n, flush=True)\n")
    last = 0
    rng = random.Random(7)
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", script, str(last)], cwd=ROOT, stdout=subprocess.PIPE)
        try:
            for _ in range(rng.randint(1, 8)):
                reported = int(proc.stdout.readline())
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        n = json.loads(path.read_bytes())["n"]
        assert n >= reported > last
        last = n


# ---- offsets and groups ---------------------------------------------------------------------------------

def test_offsets_round_trip_and_accept_fastjson_integer_keys(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "consumerOffset.json").write_bytes(b'{"offsetTable":{"T@G":{0:12,1:7},"%RETRY%G@G":{0:1}}}')
    offsets = ConsumerOffsets.load(tmp_path)
    assert offsets.query("G", "T", 1) == 7 and offsets.query("G", "%RETRY%G", 0) == 1 and offsets.query("G", "T", 2) == -1
    offsets.commit("G", "T", 2, 5)
    assert offsets.persist() and not offsets.persist()              # written once, then clean
    assert json.loads((tmp_path / "config" / "consumerOffset.json").read_bytes())["offsetTable"]["T@G"] == \
        {"0": 12, "1": 7, "2": 5}
    assert offsets.topics_of("G") == ["%RETRY%G", "T"] and offsets.remove(topic="T") == 1
    assert ConsumerOffsets.load(tmp_path).query("G", "T", 0) == 12  # not persisted since


def test_subscription_groups(tmp_path):
    groups = SubscriptionGroups.load(tmp_path)
    assert set(DEFAULT_GROUPS) <= set(groups.table)
    assert groups.find_or_create("G", auto_create=False) == (None, False)
    assert groups.find_or_create("CID_RMQ_SYS_X", auto_create=False)[1] is True   # system groups always
    cfg, created = groups.find_or_create("G", auto_create=True)
    assert created and cfg.retry_max_times == 16 and groups.find_or_create("G", True) == (cfg, False)
    groups.update([parse_group_body(b'{"groupName":"H","consumeEnable":"false","retryQueueNums":3}')])
    again = SubscriptionGroups.load(tmp_path)
    assert again.get("H").consume_enable is False and again.get("H").retry_queue_nums == 3
    assert again.version == groups.version
    for body, problem in [(b'{"consumeEnable":true}', "groupName is missing"),
                          (b'{"groupName":"G","retryQueueNums":"x"}', "retryQueueNums is not an integer"),
                          (b'{"groupName":"G","retryQueueNums":0}', "retryQueueNums must be in 1..1024"),
                          (b"[1]", "the body is not an object")]:
        with pytest.raises(ValueError, match=problem):
            parse_group_body(body)


# ---- clients and locks on an injected clock ----------------------------------------------------------

def ref(conn: int, net: str = "net-0") -> ClientRef:
    return ClientRef(net, conn, f"127.0.0.1:{40000 + conn}")


def hb(client: str, subs: dict[str, str], version: int = 1, group: str = "G", model: str = "CLUSTERING"):
    return parse_heartbeat(heartbeat_body(client, {group: subs}, model=model, version=version))


def test_client_table_membership_state_and_expiry():
    clock = Clock()
    t = ClientTable(expiry=120.0, clock=clock)
    c = t.heartbeat(ref(1), hb("a", {"T": "A"}), 0, 409)
    assert c.notify == {"G"} and c.state == {"G"}                      # new group, new member
    assert not t.heartbeat(ref(1), hb("a", {"T": "A"}), 0, 409)       # the same again: nothing
    c = t.heartbeat(ref(2), hb("b", {"T": "A"}), 0, 409)
    assert c.notify == {"G"} and not c.state                          # a member joined; pulls see the same
    c = t.heartbeat(ref(2), hb("b", {"T": "B"}, version=2), 0, 409)
    assert not c.notify and c.state == {"G"}                          # a newer expression: state only
    assert t.subscription("G", "T").sub_string == "B"
    c = t.heartbeat(ref(2), hb("b", {"T": "B", "U": "*"}, version=3), 0, 409)
    assert c.notify == {"G"}                                          # a topic came
    clock.now += 100
    t.heartbeat(ref(2), hb("b", {"T": "B", "U": "*"}, version=3), 0, 409)
    clock.now += 30                                                   # a: 130 s silent, b: 30 s
    c = t.expire()
    assert c.notify == {"G"} and t.consumer_ids("G") == ["b"]
    c = t.connection_closed("net-0", 2)
    assert not c.notify and c.state == {"G"} and "G" not in t.consumers   # the last one: the group goes
    t.heartbeat(ref(3, "net-1"), hb("x", {"T": "*"}), 0, 409)
    t.heartbeat(ref(4, "net-0"), hb("y", {"T": "*"}), 0, 409)
    assert t.net_gone("net-1").notify == {"G"} and t.consumer_ids("G") == ["y"]
    assert t.unregister(ref(4), None, "G").state == {"G"} and t.counts() == (0, 0, 0)


def test_a_touched_connection_stays_and_a_close_leaves_just_its_own_groups():
    """Heartbeats a net actor answered itself arrive as touches; the connection -> groups index
    makes a close drop exactly its channels, and is empty once every connection has gone."""
    clock = Clock()
    t = ClientTable(expiry=120.0, clock=clock)
    both = parse_heartbeat(heartbeat_body("a", {"G": {"T": "*"}, "H": {"T": "*"}}, producers=("PG",)))
    t.heartbeat(ref(1), both, 0, 409)
    t.heartbeat(ref(2), hb("b", {"T": "*"}), 0, 409)
    t.heartbeat(ref(3, "net-1"), hb("c", {"T": "*"}), 0, 409)
    clock.now += 100
    t.touch("net-0", [1, 99])                        # 99: a connection the table does not know
    t.touch("net-1", [3])
    clock.now += 30
    assert t.expire().notify == {"G"}                # b, silent for 130 s, leaves; a and c were touched
    assert t.consumer_ids("G") == ["a", "c"] and t.consumer_ids("H") == ["a"] and t.producer_ref("a") == ref(1)
    assert t.unregister(ref(1), None, "H").state == {"H"}
    assert t.connection_closed("net-0", 1).notify == {"G"}          # a's G and PG go, c stays
    assert t.consumer_ids("G") == ["c"] and t.producer_ref("a") is None and "H" not in t.consumers
    assert not t.connection_closed("net-0", 1)                       # twice: nothing left to drop
    t.connection_closed("net-1", 3)
    assert t.counts() == (0, 0, 0) and t._groups_of == {}


def test_heartbeat_parsing_accepts_what_clients_send():
    body = (b'{"clientID":"c@1","consumerDataSet":[{"groupName":"G","messageModel":"Clustering",'
            b'"subscriptionDataSet":[{"topic":"T","subString":"A","codeSet":["65"],"subVersion":"7"}]}],'
            b'"producerDataSet":[{"groupName":"PG"}]}')
    data = parse_heartbeat(body)
    sub = data.consumers[0].subscriptions[0]
    assert data.consumers[0].message_model == "CLUSTERING" and sub.code_set == [65] and sub.sub_version == 7
    assert registered(sub).codes == frozenset({65}) and data.producers == ["PG"]
    assert registered(parse_heartbeat(heartbeat_body("c", {"G": {"T": "*"}})).consumers[0].subscriptions[0]).codes is None
    with pytest.raises(BodyError, match=r"producerDataSet\[0\].groupName is missing"):
        parse_heartbeat(b'{"clientID":"c","producerDataSet":[{}]}')


def test_heartbeat_of_the_cpp_client_with_enum_ordinals():
    """What rocketmq-client-cpp 1.2 (PyPI rocketmq 0.4.4) sends, byte for byte: the enums as
    ordinals, subVersion as a string, no tagsSet or codeSet, a trailing newline."""
    body = (b'{"clientID":"4250-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,'
            b'"groupName":"CG_CPP","messageModel":1,"subscriptionDataSet":[{"subString":"*","subVersion":'
            b'"1795443288430","topic":"%RETRY%CG_CPP"},{"subString":"*","subVersion":"1795443288430",'
            b'"topic":"CppTopic"}]}]}\n')
    (c,) = parse_heartbeat(body).consumers
    assert (c.group, c.consume_type, c.message_model, c.consume_from_where) == (
        "CG_CPP", "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")
    assert [s.topic for s in c.subscriptions] == ["%RETRY%CG_CPP", "CppTopic"]
    assert c.subscriptions[1].sub_version == 1795443288430 and registered(c.subscriptions[1]).codes is None
    broadcasting = parse_heartbeat(body.replace(b'"messageModel":1', b'"messageModel":0')
                                   .replace(b'"consumeFromWhere":0', b'"consumeFromWhere":4'))
    assert broadcasting.consumers[0].message_model == "BROADCASTING"
    assert broadcasting.consumers[0].consume_from_where == "CONSUME_FROM_FIRST_OFFSET"


@pytest.mark.parametrize("model", [b"2", b"-1", b"true", b"1.0", b'"SOMETIMES"'])
def test_heartbeat_enum_out_of_range_is_named(model):
    body = b'{"clientID":"c","consumerDataSet":[{"groupName":"G","messageModel":' + model + b'}]}'
    with pytest.raises(BodyError, match=r"consumerDataSet\[0\]\.messageModel must be one of BROADCASTING, "
                                        r"CLUSTERING \(or its ordinal\)"):
        parse_heartbeat(body)


def test_queue_locks_expire_after_the_lease():
    clock = Clock()
    locks = RebalanceLocks(lease=60.0, clock=clock)
    q = [("T", "b", 0), ("T", "b", 1)]
    assert locks.try_lock("G", q, "a") == q
    assert locks.try_lock("G", q, "b") == []
    clock.now += 59
    assert locks.try_lock("G", q[:1], "a") == q[:1]                   # a renews queue 0 only
    clock.now += 2
    assert locks.try_lock("G", q, "b") == q[1:]                       # queue 1's lease ran out
    locks.unlock("G", q, "a")
    assert locks.try_lock("G", q, "b") == q


# ---- statistics -------------------------------------------------------------------------------------------

def test_latency_histogram_buckets_and_percentiles():
    h = LatencyHistogram()
    for ms in [0.1] * 50 + [0.3] * 40 + [2.0] * 9 + [6000.0]:
        h.observe(ms)
    rec = h.record_json()
    counts = dict((b, n) for b, n in rec["buckets"])
    assert counts[0.1] == 50 and counts[0.5] == 40 and counts[2.5] == 9 and counts[None] == 1
    assert rec["count"] == 100 and rec["max_ms"] == 6000.0
    assert 0.1 <= rec["p50_ms"] <= 0.105 and 0.3 <= rec["p90_ms"] <= 0.315 and 2.0 <= rec["p99_ms"] <= 2.1
    merged = LatencyHistogram()
    merged.add_wire(h.to_wire())
    merged.add_wire(h.to_wire())
    assert merged.count == 200 and merged.record_json()["p50_ms"] == rec["p50_ms"]


def test_stats_book_windows_totals_and_late_deltas():
    w = 60_000
    t0 = 1_795_000_020_000 // w * w
    book = StatsBook(60, t0 + 1000)
    net = NetStats()
    net.stored("T", 3, 300)
    net.pulled("G", "T", 2, 200)
    net.pulled("G", "T", 0, 0)
    book.add(t0 + w, net.take())                        # stamped exactly on the window's end: that window
    assert net.take() is None
    net.stored("T", 1, 100)
    book.add(t0 + w + 1000, net.take())                 # the next window
    assert book.due(t0 + w + 1000, 1500) == [] and book.due(t0 + w + 1500, 1500) == [t0 + w]
    rec = book.close(t0 + w).record(60, {"broker": "b"}, [])
    assert rec["ts"] == t0 + w and rec["totals"]["put_msgs"] == 3 and rec["totals"]["get_msgs"] == 2
    assert rec["topics"] == [{"topic": "T", "put_msgs": 3, "put_bytes": 300, "put_tps": 0.05}]
    net.stored("T", 5, 500)
    book.add(t0 + w, net.take())                        # late for its window (written): the open one takes it
    assert book.close(t0 + 2 * w).record(60, {}, [])["totals"]["put_msgs"] == 6
    assert book.totals["put_msgs"] == 9 and book.totals["pulls_found"] == 1 and book.totals["pulls_missed"] == 1
    restarted = StatsBook(60, t0 + w + 5, not_before_ms=t0 + 2 * w)   # the last record written ended there
    assert restarted.open_end(t0 + w + 5) == t0 + 3 * w


def test_stats_rates():
    book = StatsBook(60, 0)
    for second in range(20):
        book.totals["put_msgs"] += 10
        book.sample(float(second), second * 1000)
    assert book.tps("put_msgs", 10, 19.0) == pytest.approx(10.0)
    assert book.tps("put_msgs", 3600, 19.0) == pytest.approx(190 / 19)      # since the oldest sample


def test_stats_items_follow_4x_statsitem_arithmetic():
    """BrokerStatsManager's items from the net actors' deltas: value and request counts per topic,
    topic@group and cluster; snapshots every 10 s (7 kept), 10 min and 1 h, each list seeded with
    a zero one interval before its first sample; sum/tps/avgpt between the first and last."""
    book = StatsBook(60, 0, cluster="C", now=0.0)
    net = NetStats()

    def second(t: int, puts: int, batch: int = 1) -> None:
        for _ in range(puts):
            net.stored("T", batch, 100 * batch)
        net.pulled("G", "T", 2 * puts, 10)
        book.add(t * 1000, net.take() or {"put": [], "get": [], "send": LatencyHistogram().to_wire(),
                                          "pull": LatencyHistogram().to_wire(), "found": 0, "missed": 0})
        book.sample(float(t), t * 1000)

    second(0, 5)                                        # every list samples at start
    items = book.items
    put = items.get(stats_items.TOPIC_PUT_NUMS, "T")
    assert put.stats_data() == {"statsDay": {"avgpt": 1.0, "sum": 5, "tps": 5 / 3600},
                                "statsHour": {"avgpt": 1.0, "sum": 5, "tps": 5 / 600},
                                "statsMinute": {"avgpt": 1.0, "sum": 5, "tps": 0.5}}
    for t in range(1, 100):                             # 3 batches of 4 a second
        second(t, 3, batch=4)
    minute = put.figures(0)                             # the 7 samples at 30..90 s: the last minute only
    assert minute == {"avgpt": 4.0, "sum": 12 * 60, "tps": 12.0}
    assert items.get(stats_items.TOPIC_PUT_SIZE, "T").figures(0)["avgpt"] == 400.0
    gets = items.get(stats_items.GROUP_GET_NUMS, "T@G")
    assert gets.figures(0) == {"avgpt": 6.0, "sum": 6 * 60, "tps": 6.0}
    assert book.group_tps("G", "T") == 6.0
    assert items.get(stats_items.BROKER_PUT_NUMS, "C").figures(0) == {"avgpt": 0.0, "sum": 720, "tps": 12.0}
    assert items.get(stats_items.GROUP_GET_NUMS, "T@other") is None and book.group_tps("other", "T") == 0.0
    assert items.get("NO_SUCH_NAME", "T") is None


def test_a_young_items_hour_and_day_sums_hold_its_counts_until_they_expire():
    """An item born between samples (5 min after the start's): its counts are in the hour's and
    the day's sums from the next minute-list sample on, and stay there while the minute list rolls
    over, until they are older than the hour (the hour list's 7th sample after) or the day (the
    day list's 25th). 4.x showed 0 for the day until its next hourly sample, 0 for the hour until
    the next 10-minute one."""
    book = StatsBook(60, 0, now=0.0)
    born_s, step_s = 300, 10
    seen: dict[int, tuple[int, int, int]] = {}
    for t in range(0, 25 * 3600 + step_s, step_s):
        if t == born_s:
            for _ in range(5):
                book.items.add(stats_items.TOPIC_PUT_NUMS, "U", 1, 1)
        book.sample(float(t), t * 1000)
        item = book.items.get(stats_items.TOPIC_PUT_NUMS, "U")
        if item is not None:
            seen[t] = tuple(item.figures(r)["sum"] for r in (2, 1, 0))
    assert seen[born_s] == (5, 5, 5)                  # sampled on the tick that counted them
    assert seen[born_s + 60] == (5, 5, 0)             # the minute rolled over, the hour and day hold them
    assert all(s == (5, 5, 0) for t, s in seen.items() if born_s + 60 <= t < 4200)
    assert all(s == (5, 0, 0) for t, s in seen.items() if 4200 <= t < 25 * 3600)   # the hour list from 600 s
    assert seen[25 * 3600] == (0, 0, 0)               # the day list from 3600 s: 24 h without them
    expired = book.items.get(stats_items.TOPIC_PUT_NUMS, "U").figures(2)
    assert expired["tps"] == 0.0 and expired["avgpt"] == 0.0
    book = StatsBook(60, 0, now=0.0)                  # tps and avgpt over the same span as the sum
    book.sample(0.0, 0)
    for _ in range(4):
        book.items.add(stats_items.TOPIC_PUT_NUMS, "V", 2, 1)
    assert book.items.get(stats_items.TOPIC_PUT_NUMS, "V").figures(2) == {"avgpt": 0.0, "sum": 0, "tps": 0.0}
    book.sample(10.0, 10_000)
    assert book.items.get(stats_items.TOPIC_PUT_NUMS, "V").stats_data() == {
        "statsDay": {"avgpt": 2.0, "sum": 8, "tps": 0.8}, "statsHour": {"avgpt": 2.0, "sum": 8, "tps": 0.8},
        "statsMinute": {"avgpt": 2.0, "sum": 8, "tps": 0.8}}


def test_a_shorter_minute_sample_interval_and_its_check():
    """stats_sample_interval moves only the minute list (its seed and its spacing)."""
    book = StatsBook(60, 0, now=0.0, minute_sample_ms=2000)
    for t in range(0, 20):
        book.items.add(stats_items.TOPIC_PUT_NUMS, "T", 10, 1)
        book.sample(float(t), t * 1000)
    put = book.items.get(stats_items.TOPIC_PUT_NUMS, "T")
    assert [ts for ts, _, _ in put.snapshots[0]] == list(range(6000, 19000, 2000))   # 7 kept, 2 s apart
    assert put.figures(0) == {"avgpt": 10.0, "sum": 120, "tps": 10.0}
    assert [ts for ts, _, _ in put.snapshots[1]] == [-600_000, 0]
    with pytest.raises(ConfigError, match="stats_sample_interval must be above 0"):
        minute_sample_ms(NodeConfig(stats_sample_interval=0))
    assert minute_sample_ms(NodeConfig()) == 10_000


def test_stats_files_hour_boundary_rotation_and_restart(tmp_path):
    hour = 1_795_000_000_000 // HOUR_MS * HOUR_MS
    assert file_name(hour) == file_name(hour - 60_000) != file_name(hour + 60_000)   # 14:00 closes the 13 file
    assert file_hour_ms(file_name(hour)) == hour - HOUR_MS
    files = StatsFiles(tmp_path, max_bytes=2_000)
    for i in range(1, 5):
        files.append({"ts": hour + i * HOUR_MS, "pad": "x" * 700})
    assert [file_hour_ms(p.name) for p in files.files()] == [hour + 2 * HOUR_MS, hour + 3 * HOUR_MS]
    assert files.last_ts() == hour + 4 * HOUR_MS
    with open(files.files()[-1], "a") as f:
        f.write('{"ts": 17950')                             # torn by a crash
    assert files.last_ts() == hour + 4 * HOUR_MS


# ---- broker config --------------------------------------------------------------------------------------

def test_broker_config_properties():
    props = parse_properties(b"# comment\n! also\nbrokerPermission = 4\nauto_create_topic: false\n\n")
    assert props == {"brokerPermission": "4", "auto_create_topic": "false"}
    assert check_updates(props) == {"broker_permission": 4, "auto_create_topic": False}
    with pytest.raises(BodyError, match="listen_port cannot change"):
        check_updates({"listen_port": "1"})


def test_broker_config_flags_are_bools_spelt_true_false_on_the_wire_and_on_disk(tmp_path):
    """UPDATE_BROKER_CONFIG's true/false (any case) become bools; GET_BROKER_CONFIG's text and
    brokerConfig.json spell them true/false as they always have; anything else is refused."""
    assert check_updates({"autoCreateTopicEnable": " TRUE ", "auto_create_subscription_group": "False"}) == {
        "auto_create_topic": True, "auto_create_subscription_group": False}
    with pytest.raises(BodyError, match="autoCreateTopicEnable='yes': must be true or false"):
        check_updates({"autoCreateTopicEnable": "yes"})
    lines = properties_text(NodeConfig(role="master")).splitlines()
    assert {"auto_create_topic=true", "acl_enable=false", "tls_enable=false", "timer_wheel_enable=true",
            "failover_enable=false", "broker_permission=6"} <= set(lines)
    (tmp_path / FILE).parent.mkdir()
    (tmp_path / FILE).write_text('{"auto_create_subscription_group": "false", "broker_permission": 4}')
    runtime = RuntimeConfig(NodeConfig(role="master"), tmp_path)        # a file an older broker wrote
    assert (runtime.config.auto_create_subscription_group, runtime.config.broker_permission) == (False, 4)
    assert runtime.update(check_updates({"autoCreateTopicEnable": "false"})) == {"auto_create_topic": False}
    assert runtime.config.auto_create_topic is False
    assert "auto_create_topic=false" in properties_text(runtime.config).splitlines()
    assert json.loads((tmp_path / FILE).read_bytes()) == {"auto_create_subscription_group": "false",
                                                          "auto_create_topic": "false", "broker_permission": 4}
    assert RuntimeConfig(NodeConfig(role="master"), tmp_path).config == runtime.config     # a restart reads it back


# ---- the request channel -------------------------------------------------------------------------------

class FakeRing:
    def __init__(self) -> None:
        self.batches: list[list[bytes]] = []
        self.path = Path("fake.ring")

    def try_write(self, batch: list[bytes]) -> int:
        self.batches.append(list(batch))
        return len(batch)


async def no_invoke(conn: int, cmd, timeout: float):
    raise AssertionError("no invocation expected")


def test_offset_commits_coalesce_into_one_record_ahead_of_later_records():
    async def main() -> list[list[dict]]:
        ring = FakeRing()
        link = BrokerLink(ring, lambda conn, cmd: None, no_invoke)  # type: ignore[arg-type]
        for offset in range(1000):
            link.commit_offset("G", "T", offset % 2, offset)
        link.event("conn_closed", conn=1, addr="a")
        link.commit_offset("G", "T", 0, 5000)
        await asyncio.sleep(0)
        return [[msgpack.unpackb(r) for r in batch] for batch in ring.batches]
    batches = asyncio.run(main())
    assert len(batches) == 1
    first, closed, last = batches[0]
    assert first["op"] == "offsets" and sorted(map(tuple, first["a"]["o"])) == [("G", "T", 0, 998), ("G", "T", 1, 999)]
    assert closed["op"] == "conn_closed" and last["a"]["o"] == [["G", "T", 0, 5000]]
