"""kill -9 under a send load: of each actor in turn, and of the whole node under sync flush.

Producers track every message by its UNIQ_KEY: acknowledged ones, and how often a send failed
(and was retried with the same key). After the faults every acknowledged message must be in the
store, exactly once unless its send was retried after an error (then at most once per attempt),
and producers must only have seen retriable errors.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
from collections import Counter
from dataclasses import dataclass, field

import psutil
import pytest

from tests.support.broker import pull_command, restart_broker, send_command, uniq_key
from smartgo.net.client import RemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.errors import ConnectionClosedError, RemotingConnectError, RemotingTimeoutError
from smartgo.store.record import decode_records
from tests.support.waits import wait_until
from tests.support.broker import offset_command

TOPIC = "Faulty"
QUEUES = 4
RETRIABLE_CODES = {ResponseCode.SYSTEM_BUSY}
RETRIABLE_ERRORS = (RemotingTimeoutError, ConnectionClosedError, RemotingConnectError)


@dataclass
class Load:
    """Producers on their own event loop thread, each with its own connection."""
    addr: str
    producers: int = 6
    acked: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)      # failed attempts per key (each was retried)
    errors: Counter = field(default_factory=Counter)      # what the failures were
    bad: list = field(default_factory=list)               # non-retriable answers
    running: bool = True

    def start(self) -> None:
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.running = False
        self.thread.join(60)
        assert not self.thread.is_alive()

    async def _main(self) -> None:
        await asyncio.gather(*(self._producer(i) for i in range(self.producers)))

    async def _producer(self, i: int) -> None:
        client = RemotingClient()
        try:
            while self.running:
                key = uniq_key()
                cmd_queue = random.randrange(QUEUES)
                while True:
                    try:
                        r = await client.invoke(self.addr, send_command(TOPIC, b"payload-" + key.encode(),
                                                                        queue_id=cmd_queue, uniq=key), 3.0)
                    except RETRIABLE_ERRORS as exc:
                        kind = type(exc).__name__
                    else:
                        if r.code == ResponseCode.SUCCESS:
                            self.acked[key] += 1
                            break
                        if r.code not in RETRIABLE_CODES:
                            self.bad.append((r.code, r.remark))
                            break
                        kind = f"code {r.code}"
                    self.failed[key] += 1
                    self.errors[kind] += 1
                    if not self.running:
                        break
                    await asyncio.sleep(0.05)
        finally:
            await client.close()

    def wait_progress(self, more: int = 30, timeout: float = 20.0) -> None:
        target = sum(self.acked.values()) + more
        wait_until(lambda: sum(self.acked.values()) >= target, timeout=timeout,
                   message=f"{more} more acknowledged sends")


def stored_keys(broker) -> Counter:
    """UNIQ_KEY -> how often it is in the store (all queues, read through the broker)."""
    counts: Counter = Counter()
    for q in range(QUEUES):
        offset = 0
        while True:
            r = broker.call(pull_command(TOPIC, q, offset))
            if r.code != ResponseCode.SUCCESS:
                assert r.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED) and offset == int(
                    broker.call(offset_command(RequestCode.GET_MAX_OFFSET, TOPIC, q)).ext_fields["offset"]), r.remark
                break
            counts.update(m.uniq_key for m in decode_records(r.body_bytes(), check_crc=True))
            offset = int(r.ext_fields["nextBeginOffset"])
    return counts


def settled(broker) -> None:
    """Wait until everything written is dispatched (the pulls then see every message)."""
    wait_until(lambda: broker.board("commitlog.dispatched") == broker.board("commitlog.written"), timeout=20)


def check_exactly_once(load: Load, counts: Counter) -> None:
    print(f"acknowledged {sum(load.acked.values())}, failed attempts {dict(load.errors)}, stored {sum(counts.values())}")
    assert not load.bad, f"non-retriable answers: {load.bad[:5]}"
    assert sum(load.acked.values()) > 100
    missing = [k for k in load.acked if counts[k] == 0]
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
    dup = [k for k, n in counts.items() if n > 1 + load.failed[k]]
    assert not dup, f"{len(dup)} messages stored more often than sent, e.g. {[(k, counts[k]) for k in dup[:3]]}"
    unretried_dup = [k for k in load.acked if counts[k] > 1 and not load.failed[k]]
    assert not unretried_dup


def kill9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


ACTORS = ["commit", "net-0", "dispatch", "flush", "hold", "cleanup", "broker", "schedule", "net-1"]


@pytest.mark.timeout(180)
def test_kill_9_of_each_actor_under_load_loses_and_duplicates_nothing(start_node):
    broker = start_node({"topics": f"{TOPIC}:{QUEUES}", "net_actors": 2})     # two: SO_REUSEPORT failover
    # the node's disk usage is the test's (steady_disk_usage), not the host's: a full CI disk once
    # made cleanup delete the oldest CommitLog files under this test
    wait_until(lambda: broker.board("disk.used_permille") == 100, message="the test's own disk usage")
    load = Load(broker.addr)
    load.start()
    try:
        load.wait_progress(100)
        for name in ACTORS:
            before = broker.node.actor(name)
            if name == "hold":                             # a parked pull must survive its hold actor
                parked = threading.Thread(target=lambda: parked_result.append(broker.client.invoke(
                    broker.addr, pull_command("SELF_TEST_TOPIC", 0, 0, suspend_ms=3000), 15)))
                parked_result: list = []
                parked.start()
                wait_until(lambda: broker.board("hold.watching") == 1, message="the pull parked")
            kill9(before["pid"])
            broker.node.wait_healthy(check=lambda r, n=name, p=before["pid"]: next(
                a for a in r["actors"] if a["name"] == n)["pid"] not in (0, p))
            load.wait_progress(30)
            if name == "hold":
                parked.join(10)
                assert parked_result and parked_result[0].code == ResponseCode.PULL_NOT_FOUND
    finally:
        load.stop()
    settled(broker)
    check_exactly_once(load, stored_keys(broker))
    restarts = {a["name"]: a["restarts"] for a in broker.node.health()["actors"]}
    assert all(restarts[n] == 1 for n in ACTORS), restarts
    assert broker.node.health()["node"]["restarts"] == 0


@pytest.mark.timeout(150)
def test_kill_9_of_the_net_actor_hosting_the_commit_stage_loses_and_duplicates_nothing(start_node):
    """With one net actor the CommitLog writer runs inside it (commit_in_net): there is no commit
    actor, and a kill -9 of the net actor takes the writer down with every connection. Each
    restart resumes the log where the last published batch ended; producers reconnect and retry."""
    broker = start_node({"topics": f"{TOPIC}:{QUEUES}", "net_actors": 1})
    assert "commit" not in {a["name"] for a in broker.node.health()["actors"]}
    load = Load(broker.addr)
    load.start()
    try:
        for _ in range(3):
            load.wait_progress(100)
            before = broker.node.actor("net-0")["pid"]
            kill9(before)
            broker.node.wait_healthy(check=lambda r, p=before: next(
                a for a in r["actors"] if a["name"] == "net-0")["pid"] not in (0, p))
        load.wait_progress(30)
    finally:
        load.stop()
    settled(broker)
    check_exactly_once(load, stored_keys(broker))
    assert next(a for a in broker.node.health()["actors"] if a["name"] == "net-0")["restarts"] == 3


@pytest.mark.timeout(120)
def test_kill_9_of_the_whole_node_under_sync_flush_keeps_every_acknowledged_message(start_node):
    broker = start_node({"topics": f"{TOPIC}:{QUEUES}", "flush": "sync"})
    load = Load(broker.addr, producers=4)
    load.start()
    load.wait_progress(200)
    broker.node.kill()                                      # everything at once, supervisor included
    load.stop()
    assert (broker.node.store / "abort").exists()          # an unclean stop: abnormal recovery follows
    broker.node = restart_broker(broker.node)
    settled(broker)
    counts = stored_keys(broker)
    check_exactly_once(load, counts)
    broker.node.logged("abnormal")


@pytest.mark.timeout(90)
def test_sends_wait_for_a_restarting_commit_actor_then_get_system_busy_if_it_stays_down(start_node):
    """A send made while commit is down waits in the ring and is answered when commit is back;
    once commit has been down for seconds, new sends are refused at once with SYSTEM_BUSY."""
    from concurrent.futures import ThreadPoolExecutor

    from smartgo.store import StoreLock
    broker = start_node({"restart_backoff": 1.0, "restart_backoff_max": 1.0, "max_restarts": 50,
                         "commit_in_net": False})
    assert broker.call(send_command("Patient", b"warm")).code == ResponseCode.SUCCESS
    kill9(broker.node.actor("commit")["pid"])
    lock = wait_until(lambda: _try_lock(StoreLock(broker.node.store)), timeout=5, interval=0.005)
    pool = ThreadPoolExecutor(1)
    try:                                                   # commit's restarts now fail on the store lock
        waiting = pool.submit(broker.call, send_command("Patient", b"waits"), 20.0)

        def refused_now():            # until commit is down COMMIT_DOWN_BUSY (3 s), a send waits in the ring too
            try:
                r = broker.call(send_command("Patient", b"refused"), 0.5)
            except RemotingTimeoutError:
                return None
            return r if r.code == ResponseCode.SYSTEM_BUSY else None
        refused = wait_until(refused_now, timeout=15, interval=0.1, message="sends refused while commit stays down")
        assert refused.code == ResponseCode.SYSTEM_BUSY and "commit" in refused.remark
        assert not waiting.done()
    finally:
        lock.release()
    assert waiting.result(timeout=20).code == ResponseCode.SUCCESS
    broker.node.wait_healthy()
    assert broker.call(send_command("Patient", b"after")).code == ResponseCode.SUCCESS
    pool.shutdown()


def _try_lock(lock):
    from smartgo.store import StoreLockedError
    try:
        return lock.acquire()
    except StoreLockedError:
        return None


@pytest.mark.timeout(90)
def test_a_full_ring_queues_sends_briefly_then_refuses_them_and_never_stores_a_refused_one(start_node):
    """commit stops draining (SIGSTOP): the send ring fills, further sends wait in the net actor's
    overflow queue and get SYSTEM_BUSY after 2 s; once commit runs again the ones in the ring
    are stored and acknowledged. Refused sends are not in the store."""
    from tests.support.broker import batch_command, message_properties
    broker = start_node({"topics": "Flood:1", "heartbeat_deadline": 30.0, "commit_in_net": False})
    commit = psutil.Process(broker.node.actor("commit")["pid"])
    keys = [[uniq_key() for _ in range(32)] for _ in range(48)]          # 48 x 256 KiB > the 8 MiB ring

    result: dict[int, object] = {}

    async def flood():
        client = RemotingClient()

        async def one(i: int, ks: list[str]) -> None:
            cmd = batch_command("Flood", [(b"f" * 8000, message_properties(uniq=k)) for k in ks])
            result[i] = await client.invoke(broker.addr, cmd, 30.0)
        try:
            await asyncio.gather(*(one(i, ks) for i, ks in enumerate(keys)))
        finally:
            await client.close()

    commit.suspend()
    try:
        t = threading.Thread(target=lambda: asyncio.run(flood()))
        t.start()
        wait_until(lambda: any(r.code == ResponseCode.SYSTEM_BUSY for r in list(result.values())), timeout=10,
                   message="the overflow to refuse sends")
        assert not any(r.code == ResponseCode.SUCCESS for r in list(result.values()))   # nothing stored yet
    finally:
        commit.resume()
    t.join(30)
    answers = [result[i] for i in range(len(keys))]
    codes = Counter(r.code for r in answers)
    assert set(codes) == {ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY}, codes
    stored: Counter = Counter()
    offset = 0
    settled(broker)
    while True:
        r = broker.call(pull_command("Flood", 0, offset))
        if r.code != ResponseCode.SUCCESS:
            break
        stored.update(m.uniq_key for m in decode_records(r.body_bytes()))
        offset = int(r.ext_fields["nextBeginOffset"])
    for ks, r in zip(keys, answers):
        expected = 1 if r.code == ResponseCode.SUCCESS else 0
        assert all(stored[k] == expected for k in ks), (r.code, r.remark)
