"""ConsumerRunningInfo, ConsumeStatus and ConsumeMessageDirectlyResult bodies, and the rate
windows behind statusTable (smartgo.client.running_info), without a broker."""

from __future__ import annotations

import pytest

from smartgo.client.message import MessageQueue
from smartgo.client.running_info import (CMResult, ConsumerStats, RunningInfo, encode_direct_result,
                                         encode_running_info, parse_direct_result, parse_running_info)

pytestmark = pytest.mark.timeout(10)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_status_is_the_last_minute_and_failures_the_last_hour():
    clock = Clock()
    stats = ConsumerStats(clock)
    clock.now += 120                                    # started two minutes ago: a full minute's window
    stats.pulled("T", 32, 4.0)
    stats.pulled("T", 28, 6.0)
    for i in range(30):
        stats.consumed("T", ok=i % 10 != 0)
    assert stats.status("T")["consumeOKTPS"] == 0.0     # counted, not yet folded into the windows
    stats.fold(listener_ms=90.0)
    assert stats.status("T") == {"pullRT": 5.0, "pullTPS": 1.0, "consumeRT": 3.0, "consumeOKTPS": 0.45,
                                 "consumeFailedTPS": 0.05, "consumeFailedMsgs": 3}
    clock.now += 61                                     # the minute has passed; the hour has not
    assert stats.status("T") == {"pullRT": 0.0, "pullTPS": 0.0, "consumeRT": 0.0, "consumeOKTPS": 0.0,
                                 "consumeFailedTPS": 0.0, "consumeFailedMsgs": 3}
    clock.now += 3600
    assert stats.status("T")["consumeFailedMsgs"] == 0
    assert stats.status("Unknown")["pullTPS"] == 0.0


def test_a_young_consumer_divides_by_its_age():
    clock = Clock()
    stats = ConsumerStats(clock)
    clock.now += 10
    stats.pulled("T", 50, 1.0)
    assert stats.status("T")["pullTPS"] == 5.0


def test_running_info_round_trips_with_queue_objects_as_keys():
    mq1, mq0 = MessageQueue("T", "broker-a", 1), MessageQueue("T", "broker-a", 0)
    info = RunningInfo({"consumerGroup": "G", "PROP_THREADPOOL_CORE_SIZE": 20},
                       [{"topic": "T", "subString": "*"}, {"topic": "%RETRY%G", "subString": "*"}],
                       {mq1: {"commitOffset": 7}, mq0: {"commitOffset": 3}}, {"T": {"pullTPS": 1.5}}, "stacks")
    raw = encode_running_info(info)
    # fastjson's form: the MessageQueue object itself in key position, queues in TreeMap order
    assert b'"mqTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"commitOffset":3},{' in raw
    back = parse_running_info(raw)
    assert back.properties == {"consumerGroup": "G", "PROP_THREADPOOL_CORE_SIZE": "20"}
    assert back.queues == {mq0: {"commitOffset": 3}, mq1: {"commitOffset": 7}}
    assert [s["topic"] for s in back.subscriptions] == ["%RETRY%G", "T"]
    assert (back.status, back.jstack) == ({"T": {"pullTPS": 1.5}}, "stacks")


def test_what_the_cpp_client_writes_reads():
    """rocketmq-client-cpp drops the brace of an empty mqTable and writes longs as strings."""
    empty = b'{"mqTable":},"jstack":"","properties":{"PROP_CONSUME_TYPE":"CONSUME_PASSIVELY"},"subscriptionSet":[]}'
    assert parse_running_info(empty).queues == {}
    one = (b'{"mqTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"commitOffset":"12","droped":false}},'
           b'"properties":{},"subscriptionSet":[]}')
    assert parse_running_info(one).queues == {MessageQueue("T", "b", 0): {"commitOffset": 12, "droped": False}}


@pytest.mark.parametrize("body", [b"[]", b'{"mqTable":{"x":1}}', b'{"properties":[]}', b"{nope"])
def test_malformed_running_info_is_a_value_error(body):
    with pytest.raises(ValueError):
        parse_running_info(body)


def test_direct_result_round_trips():
    raw = encode_direct_result(CMResult.CR_THROW_EXCEPTION, 12, "Traceback ...", order=True)
    assert parse_direct_result(raw) == {"autoCommit": True, "consumeResult": "CR_THROW_EXCEPTION", "order": True,
                                        "remark": "Traceback ...", "spentTimeMills": 12}
    assert "remark" not in parse_direct_result(encode_direct_result(CMResult.CR_SUCCESS, 0))
    with pytest.raises(ValueError):
        parse_direct_result(b'{"order":false}')
