"""The SPSC ring: a model-based property test in one process, then the real thing across processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import shutil
import signal
import struct
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from smartgo.actors.ring import (CONSUMER, FRAME_HDR, PRODUCER, Doorbell, Ring, RingError, RingTimeout,
                                 wait_any)
from smartgo.net.loop import run as run_loop
from tests.support.waits import wait_until

CAP = 4096
SEQ = struct.Struct("<Q")


def record(seq: int, size: int) -> bytes:
    """size >= 8 bytes: the sequence number, then a pattern derived from it."""
    return SEQ.pack(seq) + bytes((seq + i) & 0xFF for i in range(size - 8))


class RingModel(RuleBasedStateMachine):
    """Random writes, reads and restarts of either side against a list of what must come out."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ring-model-"))
        self.path = self.dir / "r.ring"
        self.consumer = Ring.attach(self.path, CONSUMER, CAP)
        self.producer = Ring.attach(self.path, PRODUCER, CAP)
        self.expected: list[bytes] = []
        self.seq = 0

    def teardown(self) -> None:
        self.producer.close()
        self.consumer.close()
        shutil.rmtree(self.dir)

    @rule(sizes=st.lists(st.integers(8, 1500), min_size=1, max_size=12))
    def write(self, sizes: list[int]) -> None:
        recs = []
        for s in sizes:
            recs.append(record(self.seq, s))
            self.seq += 1
        empty = self.consumer.backlog() == 0
        n = self.producer.try_write(recs)
        self.expected += recs[:n]
        if n < len(recs):
            self.seq -= len(recs) - n          # unwritten sequence numbers are reused
        if empty:
            assert n >= 1, "an empty ring must take at least one record that fits it"

    @rule()
    def read(self) -> None:
        got = [bytes(r) for r in self.consumer.read()]
        self.consumer.release()
        assert got == self.expected
        self.expected = []

    @rule()
    def restart_producer(self) -> None:
        self.producer.close()
        self.producer = Ring.attach(self.path, PRODUCER, CAP)
        self.expected = []                     # records of the dead producer are never delivered

    @rule()
    def restart_consumer(self) -> None:
        self.consumer.close()
        self.consumer = Ring.attach(self.path, CONSUMER, CAP)
        self.expected = []                     # a new consumer starts from what is published next

    @precondition(lambda self: self.consumer.backlog() == 0)
    @rule(size=st.integers(CAP - FRAME_HDR - 3, CAP * 2))
    def oversized_record(self, size: int) -> None:
        with pytest.raises(RingError):
            self.producer.try_write([b"x" * size])

    @invariant()
    def bounded(self) -> None:
        backlog = self.consumer.backlog()
        assert 0 <= backlog <= CAP


TestRingModel = RingModel.TestCase
TestRingModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@pytest.fixture
def ring_path(tmp_path: Path) -> Path:
    return tmp_path / "rings" / "t.ring"


def test_empty_ring_reads_nothing(ring_path):
    c = Ring.attach(ring_path, CONSUMER, CAP)
    assert c.read() == [] and not c.readable()
    c.release()
    assert c.backlog() == 0


def test_a_record_larger_than_the_free_tail_wraps_whole(ring_path):
    c = Ring.attach(ring_path, CONSUMER, CAP)
    p = Ring.attach(ring_path, PRODUCER, CAP)
    assert p.try_write([b"a" * 3000]) == 1
    c.read()
    c.release()                                  # tail is at ~3016; 1080 bytes remain before the end
    big = record(1, 2000)
    assert p.try_write([big]) == 1
    got = c.read()
    assert [bytes(r) for r in got] == [big]
    # the tail skipped the 1072 bytes left before the end, then the whole frame went to the start
    assert p._tail - 3024 == (CAP - 3024) + ((FRAME_HDR + 4 + 2000 + 7) & ~7)


def test_full_ring_refuses_then_takes_after_release(ring_path):
    c = Ring.attach(ring_path, CONSUMER, CAP)
    p = Ring.attach(ring_path, PRODUCER, CAP)
    recs = [record(i, 1000) for i in range(6)]
    n = p.try_write(recs)
    assert 0 < n < 6
    assert p.try_write(recs, n) == n             # still full: nothing more goes in
    with pytest.raises(RingTimeout) as e:
        p.write(recs[n:], timeout=0.05)
    assert e.value.written == 0
    assert [bytes(r) for r in c.read()] == recs[:n]
    c.release()
    assert p.try_write(recs, n) > n


def test_capacity_mismatch_and_foreign_files_are_refused(ring_path):
    Ring.attach(ring_path, CONSUMER, CAP)
    with pytest.raises(RingError, match="capacity"):
        Ring.attach(ring_path, PRODUCER, CAP * 2)
    other = ring_path.with_name("junk.ring")
    other.write_bytes(b"not a ring" * 1000)
    with pytest.raises(RingError, match="not a SmartGo ring"):
        Ring.attach(other, PRODUCER, CAP)


# ---- across processes -------------------------------------------------------------------------------

def _produce(path: str, count: int, seed: int, capacity: int) -> None:
    async def main() -> None:
        ring = Ring.attach(Path(path), PRODUCER, capacity)
        rnd = random.Random(seed)
        seq = 0
        while seq < count:
            batch = [record(seq + i, rnd.randint(8, 700)) for i in range(min(rnd.randint(1, 40), count - seq))]
            await ring.awrite(batch, timeout=30)
            seq += len(batch)
            if rnd.random() < 0.05:
                await asyncio.sleep(0.001)    # let the consumer fall asleep now and then
    run_loop(main())


def _spawn(target, *args) -> multiprocessing.Process:
    p = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    p.start()
    return p


@pytest.fixture
def procs():
    started: list[multiprocessing.Process] = []
    yield started
    for p in started:
        if p.is_alive():
            p.kill()
        p.join(5)


async def _consume(ring: Ring, count: int, timeout: float = 20.0) -> list[int]:
    seqs: list[int] = []
    while len(seqs) < count:
        for r in ring.read():
            seq = SEQ.unpack_from(r)[0]
            assert bytes(r) == record(seq, len(r)), f"record {seq} corrupt"
            seqs.append(seq)
        ring.release()
        if len(seqs) < count:
            assert await asyncio.wait_for(ring.wait_readable(), timeout), "woken without data"
    return seqs


@pytest.mark.timeout(60)
def test_stream_across_processes_with_wrap_backpressure_and_sleeps(ring_path, procs):
    cap = 1 << 14
    consumer = Ring.attach(ring_path, CONSUMER, cap)
    procs.append(_spawn(_produce, str(ring_path), 20000, 1, cap))
    seqs = run_loop(_consume(consumer, 20000))
    assert seqs == list(range(20000))


def _ping_one_at_a_time(path: str, count: int) -> None:
    ring = Ring.attach(Path(path), PRODUCER, CAP)
    rnd = random.Random(2)
    for i in range(count):
        ring.write([record(i, 16)], timeout=10)
        time.sleep(rnd.choice((0, 0, 0.0002, 0.001)))


@pytest.mark.timeout(60)
def test_no_lost_wakeups_one_record_at_a_time(ring_path, procs):
    """Every record is a separate batch and the consumer sleeps between most: a lost wake-up hangs."""
    consumer = Ring.attach(ring_path, CONSUMER, CAP)
    procs.append(_spawn(_ping_one_at_a_time, str(ring_path), 3000))
    assert run_loop(_consume(consumer, 3000, timeout=5.0)) == list(range(3000))


def _write_forever(path: str, blocking: bool) -> None:
    """Writes until killed: blocking, it waits in write() whenever the ring is full."""
    ring = Ring.attach(Path(path), PRODUCER, CAP)
    seq = 0
    while True:
        if blocking:
            ring.write([record(seq, 500)], timeout=30)
            seq += 1
        else:
            seq += ring.try_write([record(seq, 300), record(seq + 1, 200)])


@pytest.mark.timeout(60)
def test_a_restarted_consumer_skips_old_records_and_unblocks_the_producer(ring_path, procs):
    old = Ring.attach(ring_path, CONSUMER, CAP)
    p = _spawn(_write_forever, str(ring_path), True)
    procs.append(p)
    wait_until(lambda: old.backlog() > CAP - 600, message="the producer to fill the ring")
    old.close()                                     # the consumer 'dies' with a full ring
    new = Ring.attach(ring_path, CONSUMER, CAP)
    assert new.epoch == 2 and new.backlog() == 0
    got: list[int] = []

    def more() -> bool:
        got.extend(SEQ.unpack_from(r)[0] for r in new.read())
        new.release()
        return len(got) > 20

    wait_until(more, timeout=10, message="the blocked producer to resume")
    assert got == list(range(got[0], got[0] + len(got)))
    assert got[0] >= 7                             # ~7 records filled the old ring: none of those come back


@pytest.mark.timeout(60)
def test_a_producer_killed_mid_write_leaves_nothing_stale_or_torn(ring_path, procs):
    consumer = Ring.attach(ring_path, CONSUMER, CAP)
    p = _spawn(_write_forever, str(ring_path), False)
    procs.append(p)
    wait_until(lambda: consumer.backlog() > 2000, message="the producer to write")
    os.kill(p.pid, signal.SIGKILL)
    p.join(5)
    fresh = Ring.attach(ring_path, PRODUCER, CAP)
    assert fresh.epoch == 2 and fresh.peer_pid == os.getpid()
    assert consumer.readable()
    assert consumer.read() == []                  # the dead producer's records are dropped, not delivered
    consumer.release()
    assert consumer.backlog() == 0
    new = [record(10**6 + i, 64) for i in range(3)]
    assert fresh.try_write(new) == 3
    assert [bytes(r) for r in consumer.read()] == new


@pytest.mark.timeout(30)
def test_one_doorbell_for_many_rings(tmp_path, procs):
    bell = Doorbell(tmp_path / "consumer.bell")
    paths = [tmp_path / f"r{i}.ring" for i in range(3)]
    rings = [Ring.attach(p, CONSUMER, CAP, bell) for p in paths]

    async def main() -> list[int]:
        seen: list[int] = []
        procs.append(_spawn(_produce, str(paths[2]), 50, 3, CAP))
        while len(seen) < 50:
            for r in rings:
                seen += [SEQ.unpack_from(x)[0] for x in r.read()]
                r.release()
            if len(seen) < 50:
                await asyncio.wait_for(wait_any(rings, bell), 10)
        return seen

    assert run_loop(main()) == list(range(50))
    assert rings[0].backlog() == rings[1].backlog() == 0


def test_a_doorbell_above_fd_setsize_waits_and_wakes(tmp_path):
    """Actors run with the open-files limit raised (thousands of mapped files), so a doorbell can
    get a descriptor above 1,024, where select() raises ValueError; wait_blocking must not care."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard >= 1200, f"needs a hard open-files limit of 1,200 (it is {hard})"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fillers = []
    try:
        while not fillers or fillers[-1] < 1100:
            fillers.append(os.dup(0))
        bell = Doorbell(tmp_path / "high.bell")
        assert bell.fd > 1024
        assert bell.wait_blocking(0.05) is False
        bell.ring()
        assert bell.wait_blocking(1.0) is True
        bell.close()
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
