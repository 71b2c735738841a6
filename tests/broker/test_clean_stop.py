"""A clean stop of a node with thousands of dirty queues: the flush actor's stop syncs them within
shutdown_timeout (one msync after another took 7-13 s for 3,000 queues on a loaded disk and was
killed, leaving the abort file), so the next start is the normal one after a clean stop."""

from __future__ import annotations

import pytest

from smartgo.net.codes import ResponseCode
from smartgo.store.record import decode_records
from tests.support.broker import batch_command, pull_command, restart_broker
from tests.support.waits import wait_until

QUEUES = 3000


@pytest.mark.timeout(180)
def test_thousands_of_dirty_queues_stop_cleanly_and_start_normally(start_node):
    # no periodic ConsumeQueue round before the stop: it flushes all 3,000 queues itself
    broker = start_node({"topics": f"Wide:{QUEUES}", "cq_flush_interval": 600.0, "shutdown_timeout": 3.0})
    for q in range(QUEUES):
        answer = broker.call(batch_command("Wide", [(b"m%d-%d" % (q, i), "") for i in range(3)], queue_id=q))
        assert answer.code == ResponseCode.SUCCESS, answer.remark

    def dispatched() -> bool:
        fields = broker.node.health()["fields"]
        return fields["commitlog.dispatched"] == fields["commitlog.written"]
    wait_until(dispatched, timeout=60, message="every send dispatched")
    assert broker.node.stop(timeout=30) == 0
    log = broker.node.logged("clean shutdown: everything written is flushed")
    assert "still running after shutdown_timeout" not in log
    assert not (broker.node.store / "abort").exists()

    broker.node = restart_broker(broker.node)
    broker.node.logged("(normal start)")
    for q in (0, QUEUES - 1):
        pulled = decode_records(broker.call(pull_command("Wide", q, 0)).body_bytes())
        assert [m.body for m in pulled] == [b"m%d-%d" % (q, i) for i in range(3)]
