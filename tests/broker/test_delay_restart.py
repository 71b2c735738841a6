"""Restarts in the middle of delays: graceful, kill -9 of the schedule actor at its worst moments
under a stream of due messages (delay levels, and timer messages hopping through their levels),
kill -9 of the whole node while copies are uncounted, a corrupt delayOffset.json. Every message
sent must arrive exactly once, never before its time."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter

import psutil
import pytest

from tests.support.schedule import delayed_command, delivered, max_offset, pull_all
from tests.support.broker import restart_broker, send_command, uniq_key
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import ResponseCode
from smartgo.store.record import SCHEDULE_TOPIC
from tests.support.waits import wait_until

TOPIC = "Later"
QUEUES = 4
RESOLVED = "had been re-published after the last saved offsets"


def settings(tmp_path, **extra) -> dict:
    return {"topics": f"{TOPIC}:{QUEUES}", "message_delay_level": "1s 3s",
            "schedule_fault_file": str(tmp_path / "fault"), **extra}


class Sender:
    """Delayed sends (level 1, or timers of 0.1-1.5 s) from a thread, one every `pace` seconds,
    over every queue."""

    def __init__(self, addr: str, pace: float = 0.004, timer: bool = False) -> None:
        self.addr = addr
        self.pace = pace
        self.timer = timer
        self.acked: list[str] = []
        self.failed: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with BlockingRemotingClient() as client:
            i = 0
            while not self.stopping.is_set():
                key = uniq_key()
                cmd = send_command(TOPIC, b"t", queue_id=i % QUEUES, uniq=key,
                                   extra={"TIMER_DELAY_MS": str(100 + i * 37 % 1400)}) if self.timer \
                    else delayed_command(TOPIC, b"m", 1, queue_id=i % QUEUES, uniq=key)
                try:
                    r = client.invoke(self.addr, cmd, 5)
                    (self.acked if r.code == ResponseCode.SUCCESS else self.failed).append(key)
                except Exception:
                    self.failed.append(key)
                i += 1
                self.stopping.wait(self.pace)               # the pace, cut short by stop()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)


def burst(broker, n: int, level: int = 1) -> list[str]:
    keys = [uniq_key() for _ in range(n)]
    for i, key in enumerate(keys):
        assert broker.call(delayed_command(TOPIC, b"b", level, queue_id=i % QUEUES, uniq=key)).code == 0
    return keys


def exactly_once(broker, keys: list[str], timeout: float = 20.0) -> Counter:
    """Wait until every key arrived; then none may be there twice (nor anything unknown)."""
    counts: Counter = Counter()

    def arrived() -> bool:
        nonlocal counts
        counts = delivered(broker.call, TOPIC, QUEUES)
        return all(counts[k] for k in keys)
    wait_until(arrived, timeout=timeout, interval=0.1, message=f"{len(keys)} delayed messages")
    time.sleep(0.3)                                     # a duplicate would come right behind
    counts = delivered(broker.call, TOPIC, QUEUES)
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"{len(twice)} delivered more than once, e.g. {list(twice.items())[:3]}"
    assert set(counts) == set(keys), set(counts) ^ set(keys)
    return counts


def fault(tmp_path, step: str, action: str) -> None:
    (tmp_path / "fault").write_text(f"{step} {action}")


def schedule_pid(broker) -> int:
    return broker.node.actor("schedule")["pid"]


def wait_restarted(broker, old: int) -> None:
    broker.node.wait_healthy(check=lambda r: next(a for a in r["actors"] if a["name"] == "schedule")["pid"]
                             not in (0, old))


def stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(90)
@pytest.mark.parametrize("timer", [False, True], ids=["delay_level", "timer"])
def test_kill_9_of_the_schedule_actor_at_each_step_delivers_every_message_once(start_node, tmp_path, timer):
    broker = start_node(settings(tmp_path, timer_precision_ms=100))
    sender = Sender(broker.addr, timer=timer)
    try:
        wait_until(lambda: max_offset(broker.call, TOPIC, 0) > 5, timeout=10, message="deliveries under way")
        for step in ("handover", "landed", "persist", None):
            old = schedule_pid(broker)
            if step is None:
                psutil.Process(old).send_signal(signal.SIGKILL)     # anywhere at all
            else:
                fault(tmp_path, step, "kill")
            wait_restarted(broker, old)
            assert not (tmp_path / "fault").exists()
            n = sum(max_offset(broker.call, TOPIC, q) for q in range(QUEUES))
            wait_until(lambda: sum(max_offset(broker.call, TOPIC, q) for q in range(QUEUES)) > n + 20, timeout=10,
                       message="deliveries after the restart")
    finally:
        sender.stop()
    assert not sender.failed and len(sender.acked) > 200
    exactly_once(broker, sender.acked)
    assert broker.node.log_text().count(RESOLVED) >= 2        # "landed" and "persist" left uncounted copies
    if timer:
        copies = [m for q in range(QUEUES) for m in pull_all(broker.call, TOPIC, q)]
        assert all(m.store_timestamp >= int(m.properties["TIMER_OUT_MS"]) for m in copies)    # never early
        assert max(int(m.properties.get("TIMER_ROLL_TIMES", 0)) for m in copies) >= 3
    assert next(a for a in broker.node.health()["actors"] if a["name"] == "schedule")["restarts"] == 4


@pytest.mark.timeout(120)
def test_kill_9_of_the_whole_node_with_copies_not_yet_counted(start_node, tmp_path):
    broker = start_node(settings(tmp_path))
    keys: list[str] = []
    for step in ("landed", "persist", "handover"):
        keys += burst(broker, 60)
        pid = schedule_pid(broker)
        fault(tmp_path, step, "stop")                             # the actor freezes itself at that step ...
        wait_until(lambda: stopped(pid), timeout=10, message=f"the schedule actor to stop at {step}")
        broker.node.kill()                                        # ... and the node dies around it
        broker.node = restart_broker(broker.node)
    broker.node.logged("abnormal")
    counts = exactly_once(broker, keys)
    assert len(counts) == 180
    assert broker.node.log_text().count(RESOLVED) >= 2


@pytest.mark.timeout(90)
def test_graceful_restart_in_the_middle_of_a_delay_and_a_corrupt_offsets_file(start_node, tmp_path):
    broker = start_node(settings(tmp_path))
    first = burst(broker, 20)
    exactly_once(broker, first)
    sent_at = time.time() * 1000
    later = burst(broker, 20, level=2)                            # 3 s: due while the node restarts
    assert broker.node.stop() == 0
    offsets = broker.node.store / "config" / "delayOffset.json"
    offsets.write_bytes(b'{"offsetTable":{"1":')                  # corrupt: the .bak holds the state before
    broker.node = restart_broker(broker.node)
    broker.node.logged("loaded the backup")
    exactly_once(broker, first + later)
    for q in range(QUEUES):
        for m in pull_all(broker.call, TOPIC, q):
            if m.uniq_key in later:
                assert m.store_timestamp >= int(sent_at) + 3000, "delivered before its time"   # store times are whole ms
    level2 = max_offset(broker.call, SCHEDULE_TOPIC, 1)
    wait_until(lambda: b'"2":%d' % level2 in offsets.read_bytes(), timeout=5)
