"""Long polling through the hold actor: a parked pull is answered soon after a send, or at its timeout."""

from __future__ import annotations

import concurrent.futures
import time

from tests.support.broker import offset_command, pull_command, send_command
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.store.record import decode_records
from tests.support.waits import wait_until


def dispatched(broker, topic, queue_id, count):
    """Wait until the queue holds count messages (a send is acknowledged before it is dispatched)."""
    wait_until(lambda: broker.call(offset_command(RequestCode.GET_MAX_OFFSET, topic, queue_id))
               .ext_fields["offset"] == str(count), message=f"{topic}/{queue_id} at {count}")


def parked_pull(broker, topic, queue_id, offset, suspend_ms, subscription="*"):
    """Start a suspended pull on a thread; returns (future, start time)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    start = time.monotonic()
    fut = pool.submit(broker.call, pull_command(topic, queue_id, offset, suspend_ms=suspend_ms,
                                                subscription=subscription), suspend_ms / 1000 + 5)
    pool.shutdown(wait=False)
    return fut, start


def test_a_parked_pull_is_answered_right_after_a_send(broker):
    topic = "LongPoll"
    assert broker.call(send_command(topic, b"first")).code == 0
    dispatched(broker, topic, 0, 1)
    fut, _ = parked_pull(broker, topic, 0, 1, 10_000)
    wait_until(lambda: broker.board("hold.watching") == 1, message="the pull parked")
    assert not fut.done()
    sent_at = time.monotonic()
    assert broker.call(send_command(topic, b"second")).code == 0
    r = fut.result(timeout=5)
    waited = time.monotonic() - sent_at
    assert r.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(r.body_bytes())] == [b"second"]
    assert waited < 2.0, f"a parked pull took {waited:.2f}s to wake (its timeout is 10s)"


def test_a_parked_pull_times_out_with_pull_not_found(broker):
    topic = "LongPollTimeout"
    assert broker.call(send_command(topic, b"only")).code == 0
    dispatched(broker, topic, 0, 1)
    fut, start = parked_pull(broker, topic, 0, 1, 600)
    r = fut.result(timeout=10)
    waited = time.monotonic() - start
    assert r.code == ResponseCode.PULL_NOT_FOUND and r.remark == "OFFSET_OVERFLOW_ONE"
    assert r.ext_fields["nextBeginOffset"] == "1"
    assert 0.5 <= waited < 3.5, waited


def test_a_parked_pull_ignores_other_queues_and_many_wait_at_once(broker):
    topic = "LongPollMany"
    for q in (0, 1):
        assert broker.call(send_command(topic, b"seed", queue_id=q)).code == 0
        dispatched(broker, topic, q, 1)
    futs = [parked_pull(broker, topic, 0, 1, 8000)[0] for _ in range(3)]
    sentinel = parked_pull(broker, topic, 1, 1, 8000)[0]       # answered once the hold actor saw queue 1 move
    wait_until(lambda: broker.board("hold.watching") == 1, message="the pulls parked")
    assert broker.call(send_command(topic, b"elsewhere", queue_id=1)).code == 0
    assert [m.body for m in decode_records(sentinel.result(timeout=5).body_bytes())] == [b"elsewhere"]
    assert not any(f.done() for f in futs)                     # queue 1's arrival does not wake queue 0
    assert broker.call(send_command(topic, b"here", queue_id=0)).code == 0
    for f in futs:
        r = f.result(timeout=5)
        assert [m.body for m in decode_records(r.body_bytes())] == [b"here"]


def test_only_a_pull_woken_by_an_arrival_says_consumers_follow_the_head(broker):
    """hold.woken_ms, which keeps dispatch's rounds 1 ms apart (else 10 ms, for bigger rounds),
    moves when a parked pull is woken by a message, not for sends nobody waits for nor for a pull
    that reaches its deadline."""
    from smartgo.broker.rings import monotonic_ms
    topic = "LongPollPace"
    before = broker.board("hold.woken_ms")
    for i in range(20):
        assert broker.call(send_command(topic, b"nobody waits %d" % i)).code == 0
    dispatched(broker, topic, 0, 20)
    fut, _ = parked_pull(broker, topic, 0, 20, 600)
    assert fut.result(timeout=10).code == ResponseCode.PULL_NOT_FOUND
    assert broker.board("hold.woken_ms") == before
    fut, _ = parked_pull(broker, topic, 0, 20, 10_000)
    wait_until(lambda: broker.board("hold.watching") == 1, message="the pull parked")
    assert broker.call(send_command(topic, b"awaited")).code == 0
    assert fut.result(timeout=5).code == ResponseCode.SUCCESS
    wait_until(lambda: broker.board("hold.woken_ms") > before, message="hold.woken_ms stamped")
    assert 0 <= monotonic_ms() - broker.board("hold.woken_ms") < 5_000
