"""Delayed delivery against a real node: timing (levels 1 s and 5 s), what the copy keeps, the send
reply, refusals, delayOffset.json and GET_ALL_DELAY_OFFSET, a custom level table."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.schedule import delayed_command, max_offset, pull_all, view
from tests.support.broker import batch_command, message_properties, pull_command, send_command, uniq_key
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import SCHEDULE_TOPIC, TRANSACTION_PREPARED_TYPE, decode_records
from tests.support.waits import wait_until

NODE_SETTINGS = {"topics": "Delayed:4;Capped:2;Offsets:1;Refused:1"}
LEVELS_MS = {1: 1000, 2: 5000}


def send_ok(broker, cmd: RemotingCommand) -> RemotingCommand:
    r = broker.call(cmd)
    assert r.code == ResponseCode.SUCCESS, r.remark
    return r


@pytest.mark.timeout(60)
def test_delayed_messages_appear_after_their_delay_not_before_and_keep_everything_but_delay(broker):
    sent = {}                                                   # queue -> (level, key, reply, command)
    for queue, level in ((0, 2), (1, 1), (2, 2), (3, 1)):
        key = uniq_key()
        cmd = delayed_command("Delayed", f"body-{queue}".encode(), level, queue_id=queue, uniq=key,
                              tags="TagA", keys=f"order-{queue} other", extra={"own": "value"})
        cmd.ext_fields["h"] = "5"                               # flag
        cmd.ext_fields["j"] = "2"                               # reconsumeTimes
        sent[queue] = (level, key, send_ok(broker, cmd), cmd)
    originals = {q: view(broker.call, reply.ext_fields["msgId"]) for q, (_, _, reply, _) in sent.items()}
    for q, (level, _, reply, _) in sent.items():
        o = originals[q]
        assert (o.topic, o.queue_id, o.properties["DELAY"]) == (SCHEDULE_TOPIC, level - 1, str(level))
        assert (o.properties["REAL_TOPIC"], o.properties["REAL_QID"]) == ("Delayed", str(q))
        assert reply.ext_fields["queueId"] == str(q)            # the real queue, with the schedule queue's offset
        assert int(reply.ext_fields["queueOffset"]) == o.queue_offset

    seen: dict[int, float] = {}

    def all_seen() -> bool:
        now = time.time() * 1000
        for q in set(sent) - set(seen):
            if max_offset(broker.call, "Delayed", q):
                seen[q] = now
            else:
                assert now <= originals[q].store_timestamp + LEVELS_MS[sent[q][0]] + 3000, f"queue {q} is late"
        return len(seen) == len(sent)
    wait_until(all_seen, timeout=20, interval=0.02, message="every delayed message")

    for q, (level, key, _, cmd) in sent.items():
        o = originals[q]
        due = o.store_timestamp + LEVELS_MS[level]
        assert seen[q] >= due - 5, f"visible {due - seen[q]:.0f} ms early"     # (5 ms: the poll's clock reading)
        [copy] = pull_all(broker.call, "Delayed", q)
        lateness = copy.store_timestamp - due
        assert 0 <= lateness < 1000, lateness
        assert copy.topic == "Delayed" and copy.queue_id == q and copy.queue_offset == 0
        assert copy.properties == {k: v for k, v in o.properties.items() if k != "DELAY"}
        assert copy.uniq_key == key and copy.keys == [f"order-{q}", "other"] and copy.properties["own"] == "value"
        for name in ("body", "flag", "sys_flag", "born_timestamp", "born_host", "store_host", "reconsume_times"):
            assert getattr(copy, name) == getattr(o, name), name
        assert (copy.flag, copy.reconsume_times, copy.body) == (5, 2, f"body-{q}".encode())
        # the tag hash is the real topic's (the schedule entry's was the delivery time)
        tagged = broker.call(pull_command("Delayed", q, 0, subscription="TagA"))
        assert [m.uniq_key for m in decode_records(tagged.body_bytes())] == [key]
        assert broker.call(pull_command("Delayed", q, 0, subscription="TagB")).code == \
            ResponseCode.PULL_RETRY_IMMEDIATELY
        found = broker.call(RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields={
            "topic": "Delayed", "key": f"order-{q}", "maxNum": "8", "beginTimestamp": "0",
            "endTimestamp": str(2 ** 62)}))
        assert [m.uniq_key for m in decode_records(found.body_bytes())] == [key]


def test_the_level_is_capped_and_the_reply_names_the_real_queue(broker):
    before = max_offset(broker.call, SCHEDULE_TOPIC, 17)
    replies = [send_ok(broker, delayed_command("Capped", b"x", level, queue_id=1)) for level in (18, 99)]
    assert [r.ext_fields["queueId"] for r in replies] == ["1", "1"]
    assert [int(r.ext_fields["queueOffset"]) for r in replies] == [before, before + 1]
    stored = [view(broker.call, r.ext_fields["msgId"]) for r in replies]
    assert [(m.topic, m.queue_id, m.properties["DELAY"]) for m in stored] == [(SCHEDULE_TOPIC, 17, "18")] * 2
    wait_until(lambda: max_offset(broker.call, SCHEDULE_TOPIC, 17) == before + 2)
    assert max_offset(broker.call, "Capped", 1) == 0            # two hours away


def test_refusals_and_what_is_not_delayed(broker):
    r = broker.call(batch_command("Refused", [(b"a", message_properties(uniq=uniq_key()))]))
    assert r.code == ResponseCode.SUCCESS                       # a plain batch still works
    batch = batch_command("Refused", [(b"b", message_properties(uniq=uniq_key()))])
    batch.ext_fields["i"] = "DELAY\x012"
    r = broker.call(batch)
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "batch" in r.remark
    r = broker.call(delayed_command("Refused", b"c", "soon"))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "DELAY" in r.remark
    zero = send_ok(broker, delayed_command("Refused", b"d", 0))     # level 0: stored as sent, at once
    assert view(broker.call, zero.ext_fields["msgId"]).topic == "Refused"
    schedule_before = max_offset(broker.call, SCHEDULE_TOPIC, 0)
    prepared = delayed_command("Refused", b"e", 1)
    prepared.ext_fields["f"] = str(TRANSACTION_PREPARED_TYPE)       # half messages are not delayed
    assert view(broker.call, send_ok(broker, prepared).ext_fields["msgId"]).topic == "Refused"
    wait_until(lambda: max_offset(broker.call, "Refused", 0) == 2)  # the batch and level 0 (not the half message)
    assert max_offset(broker.call, SCHEDULE_TOPIC, 0) == schedule_before
    r = broker.call(send_command(SCHEDULE_TOPIC, b"f"))               # no direct sends to the schedule topic
    assert r.code == ResponseCode.NO_PERMISSION


@pytest.mark.timeout(30)
def test_delay_offset_json_and_get_all_delay_offset(broker):
    key = uniq_key()
    send_ok(broker, delayed_command("Offsets", b"o", 18))               # a level with entries, none due
    send_ok(broker, delayed_command("Offsets", b"o", 1, uniq=key))
    wait_until(lambda: [m.uniq_key for m in pull_all(broker.call, "Offsets", 0)] == [key], timeout=10)
    path = broker.node.store / "config" / "delayOffset.json"
    level1 = max_offset(broker.call, SCHEDULE_TOPIC, 0)

    def saved():
        return json.loads(path.read_bytes())["offsetTable"].get("1") == level1
    wait_until(saved, timeout=5, message="delayOffset.json to count the delivery")
    on_disk = json.loads(path.read_bytes())
    assert set(on_disk) == {"offsetTable", "scanFrom"} and on_disk["scanFrom"] > 0
    assert on_disk["offsetTable"]["18"] == 0                      # a level with entries none of which is due
    r = broker.call(RemotingCommand(RequestCode.GET_ALL_DELAY_OFFSET))
    assert r.code == ResponseCode.SUCCESS
    assert json.loads(r.body) == {"offsetTable": on_disk["offsetTable"]}


@pytest.mark.timeout(60)
def test_a_custom_level_table_from_the_config_under_sync_flush(start_node):
    """Levels "2s 1s": 1 -> 2 s, 2 -> 1 s, 9 -> capped to 2. Under sync flush the copies' completions
    reach the schedule actor through the flush actor's doorbell (schedule.flush_wait), without which
    each batch would wait for its safety timeout (the 400 ms bound below catches that)."""
    broker = start_node({"message_delay_level": "2s 1s", "topics": "Custom:3", "flush": "sync"})
    sent = []                                                   # (queue, level, stored record)
    for q, level in [(0, 1), (2, 9)] + [(1, 2)] * 5:
        reply = send_ok(broker, delayed_command("Custom", b"c", level, queue_id=q))
        sent.append((q, level, view(broker.call, reply.ext_fields["msgId"])))
        time.sleep(0.05)
    assert [(m.queue_id, m.properties["DELAY"]) for _, _, m in sent[:3]] == [(0, "1"), (1, "2"), (1, "2")]
    wait_until(lambda: [max_offset(broker.call, "Custom", q) for q in range(3)] == [1, 5, 1], timeout=10)
    copies = {m.uniq_key: m for q in range(3) for m in pull_all(broker.call, "Custom", q)}
    for q, level, stored in sent:
        due = stored.store_timestamp + (2000 if level == 1 else 1000)
        lateness = copies[stored.uniq_key].store_timestamp - due
        assert 0 <= lateness < 400, (level, lateness)        # a missed doorbell costs a 500 ms safety sleep


@pytest.mark.timeout(60)
def test_deliveries_pause_while_the_disk_is_full_and_resume_after(start_node, tmp_path):
    usage = tmp_path / "usage"
    usage.write_text("0.5")
    broker = start_node({"disk_usage_file": str(usage), "message_delay_level": "1s", "topics": "Full:1"})
    key = uniq_key()
    stored = view(broker.call, send_ok(broker, delayed_command("Full", b"f", 1, uniq=key)).ext_fields["msgId"])
    usage.write_text("0.95")
    wait_until(lambda: broker.board("flag.disk_full") == 1, timeout=5)
    wait_until(lambda: time.time() * 1000 > stored.store_timestamp + 1500, timeout=5)
    assert max_offset(broker.call, "Full", 0) == 0                  # due, held back
    usage.write_text("0.5")
    wait_until(lambda: [m.uniq_key for m in pull_all(broker.call, "Full", 0)] == [key], timeout=10)
