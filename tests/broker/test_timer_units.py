"""Timer messages without processes: the send rewrite, the hop chain the schedule actor walks,
the copies a restarted actor looks for, the schedule table with its timer hops, and a delayed or
timed transaction's commit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartgo.broker.schedule.schedule_message import (HALF_TOPIC, TimerSettings, copy_signature, delayed_commit,
                                                      end_transaction_record, is_copy_candidate, republish,
                                                      timer_copies, timer_rewrite, timer_step)
from smartgo.broker.settings import delay_levels, timer_settings
from smartgo.config import ConfigError, NodeConfig
from smartgo.store.config import TIMER_FIRST_LEVEL, StoreConfig, schedule_levels, timer_hops
from smartgo.store.errors import MessageIllegalError
from smartgo.store.record import (SCHEDULE_TOPIC, TRANSACTION_COMMIT_TYPE, decode_properties, decode_record,
                                  encode_properties, encode_record)

NOW = 1_800_000_000_000
TIMER = TimerSettings(True, 3 * 86_400_000, timer_hops(1000, 3 * 86_400_000))


def props(**kv: str) -> str:
    return encode_properties(kv).decode()


def stored(properties: str, store_ts: int, queue_id: int = 0) -> bytes:
    """The record of a SCHEDULE_TOPIC_XXXX entry as the commit actor stores it."""
    return encode_record(SCHEDULE_TOPIC, queue_id, b"payload", properties.encode(), born_timestamp=NOW - 5,
                         store_timestamp=store_ts, queue_offset=3, physical_offset=8192)


# ---- the schedule table --------------------------------------------------------------------------------------

def test_the_hops_are_powers_of_two_of_the_precision_up_to_the_maximum_delay():
    assert timer_hops(1000, 3 * 86_400_000) == tuple(1000 << k for k in range(18))     # 1 s .. 36.4 h
    assert timer_hops(100, 1000) == (100, 200, 400, 800)
    assert timer_hops(5000, 1000) == (5000,)                                          # always one
    table = StoreConfig(message_delay_level="1s 5s 2h").delay_levels_ms
    assert table[:3] == (1000, 5000, 7_200_000) and table[3:TIMER_FIRST_LEVEL - 1] == (7_200_000,) * 29
    assert table[TIMER_FIRST_LEVEL - 1:] == timer_hops(1000, 3 * 86_400_000)
    assert schedule_levels((1000,), (7,))[TIMER_FIRST_LEVEL - 1] == 7


def test_timer_settings_and_their_checks():
    cfg = NodeConfig(role="master", timer_precision_ms=250, timer_max_delay_sec=2, timer_wheel_enable=False)
    assert timer_settings(cfg) == TimerSettings(False, 2000, (250, 500, 1000, 2000))
    for bad in ({"timer_precision_ms": 0}, {"timer_max_delay_sec": 0},
                {"message_delay_level": " ".join(["1s"] * TIMER_FIRST_LEVEL)}):
        with pytest.raises(ConfigError):
            delay_levels(NodeConfig(role="master", **bad))
    assert len(delay_levels(NodeConfig(role="master", message_delay_level=" ".join(["1s"] * 32)))) == 32


def test_hop_level_is_the_longest_hop_within_what_is_left():
    assert TIMER.hop_level(1) == TIMER.hop_level(999) == TIMER.hop_level(1000) == TIMER_FIRST_LEVEL
    assert TIMER.hop_level(1999) == TIMER_FIRST_LEVEL and TIMER.hop_level(2000) == TIMER_FIRST_LEVEL + 1
    assert TIMER.hop_level(3 * 86_400_000) == TIMER_FIRST_LEVEL + 17


# ---- the send rewrite -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("asked, deliver", [
    ({"TIMER_DELAY_SEC": "5"}, NOW + 5000),
    ({"TIMER_DELAY_MS": "5000"}, NOW + 5000),
    ({"TIMER_DELIVER_MS": str(NOW + 5000)}, NOW + 5000),
    ({"TIMER_DELAY_SEC": "2", "TIMER_DELAY_MS": "9", "TIMER_DELIVER_MS": "1"}, NOW + 2000),   # 5.x's precedence
    ({"TIMER_DELAY_MS": "9000", "TIMER_DELIVER_MS": "1"}, NOW + 9000),
    ({"__STARTDELIVERTIME": str(NOW + 7000)}, NOW + 7000),                                # ali-ons (Aliyun ONS)
    ({"TIMER_DELIVER_MS": str(NOW + 3000), "__STARTDELIVERTIME": "1"}, NOW + 3000),
])
def test_a_timer_message_goes_to_its_first_hop(asked, deliver):
    topic, queue, rewritten = timer_rewrite(props(TAGS="A", **asked), "Orders", 3, NOW, TIMER)
    level = TIMER.hop_level(deliver - NOW)
    assert (topic, queue) == (SCHEDULE_TOPIC, level - 1)
    assert decode_properties(rewritten) == {"TAGS": "A", **asked, "REAL_TOPIC": "Orders", "REAL_QID": "3",
                                            "DELAY": str(level), "TIMER_OUT_MS": str(deliver)}


def test_what_a_producer_sent_in_the_broker_s_own_properties_is_replaced():
    _, _, rewritten = timer_rewrite(props(TIMER_DELAY_MS="1500", REAL_TOPIC="X", REAL_QID="9", DELAY="0",
                                          TIMER_ROLL_TIMES="4"), "Orders", 1, NOW, TIMER)
    assert decode_properties(rewritten) == {"TIMER_DELAY_MS": "1500", "REAL_TOPIC": "Orders", "REAL_QID": "1",
                                            "DELAY": str(TIMER_FIRST_LEVEL), "TIMER_OUT_MS": str(NOW + 1500)}


@pytest.mark.parametrize("asked", [
    {}, {"TAGS": "A"},
    {"TIMER_DELIVER_MS": str(NOW)}, {"TIMER_DELIVER_MS": "0"}, {"TIMER_DELAY_SEC": "-3"},    # due: sent at once
    {"TIMER_DELAY_MS": "5000", "TIMER_OUT_MS": str(NOW + 5)},      # delivered already (5.x's double check)
])
def test_no_timer_or_one_due_by_now_is_stored_as_sent(asked):
    assert timer_rewrite(props(**asked), "Orders", 0, NOW, TIMER) is None


@pytest.mark.parametrize("asked, settings_, remark", [
    ({"TIMER_DELAY_SEC": "soon"}, TIMER, "TIMER_DELAY_SEC 'soon' is not an integer"),
    ({"TIMER_DELIVER_MS": "1.5e12"}, TIMER, "TIMER_DELIVER_MS '1.5e12' is not an integer"),
    ({"TIMER_DELAY_SEC": str(3 * 86_400 + 1)}, TIMER, "bigger than the max delay 259200000ms"),
    ({"TIMER_DELAY_MS": "10"}, TimerSettings(False, 1000, (1000,)), "timer_wheel_enable is false"),
])
def test_a_bad_timer_is_illegal(asked, settings_, remark):
    with pytest.raises(MessageIllegalError) as err:
        timer_rewrite(props(**asked), "Orders", 0, NOW, settings_)
    assert remark in err.value.reason


# ---- the hop chain ----------------------------------------------------------------------------------------------

def walk(delay_ms: int, timer: TimerSettings = TIMER, late_ms: int = 0) -> tuple[int, list[int], dict]:
    """Follow a timer message from its send at NOW to its delivery as the schedule actor would,
    each entry taken late_ms after its due time: (delivery time, the hop levels, its properties)."""
    _, queue, properties = timer_rewrite(props(TIMER_DELAY_MS=str(delay_ms), UNIQ_KEY="U1"), "Orders", 2, NOW, timer)
    rec, store_ts, levels = stored(properties, NOW, queue), NOW, [queue + 1]
    while True:
        due = store_ts + timer.hops[levels[-1] - TIMER_FIRST_LEVEL]       # dispatch's tag code
        now = due + late_ms
        step = timer_step(rec, due, now, timer)
        assert step.data in timer_copies(rec, due, timer)                  # a restart would recognise it
        if step.topic != SCHEDULE_TOPIC:
            return now, levels, decode_record(step.data).properties
        levels.append(step.queue_id + 1)
        rec, store_ts = stored(decode_properties_bytes(step.data), now, step.queue_id), now
        assert len(levels) <= len(timer.hops) + 1


def decode_properties_bytes(data: bytes) -> str:
    return encode_properties(decode_record(data).properties).decode()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3 * 86_400_000))
def test_delivery_is_never_early_and_at_most_one_precision_late(delay_ms):
    delivered, levels, properties = walk(delay_ms)
    assert NOW + delay_ms <= delivered < NOW + delay_ms + 1000
    assert len(levels) <= len(TIMER.hops) + 1
    assert properties["TIMER_OUT_MS"] == str(NOW + delay_ms) and "DELAY" not in properties
    assert properties.get("TIMER_ROLL_TIMES", "0") == str(len(levels) - 1)
    assert (properties["REAL_TOPIC"], properties["UNIQ_KEY"]) == ("Orders", "U1")


def test_a_late_actor_delivers_at_once_what_is_due_by_the_clock():
    delivered, levels, _ = walk(20_000, late_ms=60_000)          # the first hop (16 s) was taken a minute late
    assert delivered == NOW + 16_000 + 60_000 and len(levels) == 1


def test_an_entry_taken_before_its_due_time_is_never_delivered_early():
    """The schedule actor takes an entry whose tag code lies further ahead than its level's delay
    at once (correctDeliverTimestamp: a clock gone back, a shorter hop table since): a timer with
    time left hops again, for what is left from now."""
    _, queue, properties = timer_rewrite(props(TIMER_DELAY_MS="10000"), "Orders", 2, NOW, TIMER)
    rec = stored(properties, NOW, queue)
    step = timer_step(rec, NOW + 60_000, NOW + 5000, TIMER)            # tag code a minute ahead, taken at +5 s
    assert step.topic == SCHEDULE_TOPIC and step.queue_id + 1 == TIMER.hop_level(5000)


def test_round_delays_take_few_hops():
    assert len(walk(1000)[1]) == 1 and len(walk(60_000)[1]) == 4            # 32 + 16 + 8 + 4 s
    assert len(walk(86_400_000)[1]) == 5                                   # one day: 5 bits set in 86,400


def test_the_delivered_message_is_the_one_sent_with_the_broker_s_properties():
    _, queue, properties = timer_rewrite(props(TIMER_DELAY_MS="1000", KEYS="k1"), "Orders", 2, NOW, TIMER)
    rec = stored(properties, NOW, queue)
    final = timer_step(rec, NOW + 1000, NOW + 1000, TIMER)
    assert final == republish(rec) and (final.topic, final.queue_id) == ("Orders", 2)
    msg = decode_record(final.data, check_crc=True)
    assert (msg.topic, msg.body, msg.born_timestamp) == ("Orders", b"payload", NOW - 5)


def test_only_a_hop_copy_is_a_copy_candidate_in_the_schedule_topic():
    _, queue, properties = timer_rewrite(props(TIMER_DELAY_MS="5000"), "Orders", 2, NOW, TIMER)
    sent = stored(properties, NOW, queue)
    hop = timer_step(sent, NOW + 4000, NOW + 4000, TIMER)
    assert hop.topic == SCHEDULE_TOPIC and decode_record(hop.data).properties["TIMER_ROLL_TIMES"] == "1"
    sent_props = encode_properties(decode_record(sent).properties)
    hop_props = encode_properties(decode_record(hop.data).properties)
    assert not is_copy_candidate(SCHEDULE_TOPIC.encode(), sent_props)
    assert is_copy_candidate(SCHEDULE_TOPIC.encode(), hop_props)
    both = timer_copies(sent, NOW + 4000, TIMER)
    assert copy_signature(hop.data) in {copy_signature(c) for c in both} and copy_signature(sent) not in {
        copy_signature(c) for c in both}


# ---- a transaction's commit ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("asked, queue", [({"DELAY": "2"}, 1), ({"TIMER_DELAY_MS": "5000"}, TIMER_FIRST_LEVEL + 1),
                                          ({"DELAY": "40"}, 17)])           # capped at the table's 18 levels
def test_a_commit_that_asks_for_a_delay_or_a_timer_is_scheduled_as_a_send_would_be(asked, queue):
    half = encode_record(HALF_TOPIC, 0, b"order", props(TAGS="T", TRAN_MSG="true", REAL_TOPIC="Orders", REAL_QID="3",
                                                         **asked).encode(), born_timestamp=NOW - 5, queue_offset=4)
    final = end_transaction_record(half, TRANSACTION_COMMIT_TYPE, 8192)
    delayed = delayed_commit(final, 18, NOW, TIMER)
    assert (delayed.topic, delayed.queue_id) == (SCHEDULE_TOPIC, queue)
    msg = decode_record(delayed.data, check_crc=True)
    assert (msg.topic, msg.queue_id, msg.body) == (SCHEDULE_TOPIC, queue, b"order")
    assert msg.prepared_transaction_offset == 8192
    assert msg.sys_flag & TRANSACTION_COMMIT_TYPE and "TRAN_MSG" not in msg.properties
    assert (msg.properties["REAL_TOPIC"], msg.properties["REAL_QID"], msg.properties["DELAY"]) == (
        "Orders", "3", str(queue + 1))
    plain = end_transaction_record(encode_record(HALF_TOPIC, 0, b"o", props(TRAN_MSG="true", REAL_TOPIC="Orders",
                                                                             REAL_QID="3").encode()),
                                   TRANSACTION_COMMIT_TYPE, 0)
    assert delayed_commit(plain, 18, NOW, TIMER) is plain
