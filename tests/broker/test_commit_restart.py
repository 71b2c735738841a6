"""The commit actor's exactly-once restart protocol, crash point by crash point.

The commit actor runs in-process against a real board, real rings and a real store; the test
plays the net actors (producers of send.<net>, consumers of done.<net>). A crash is an exception
injected at one step of a turn, after which the actor is abandoned the way a killed process is
(its maps and lock go, nothing is flushed or released); a second incarnation then starts on the
same board, rings and files. Whatever the crash point: every request is answered, all answers of
one request agree, and every message is in the CommitLog exactly once (checked by recovery).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Collection
from pathlib import Path

import pytest

from smartgo.actors.actor import ActorContext
from smartgo.actors.board import NODE_FIELDS, Board, BoardLayout
from smartgo.actors.ring import CONSUMER, PRODUCER, Ring
from smartgo.node.roles import ROLES
from smartgo.actors.spec import ActorSpec
from smartgo.broker import recovery
from smartgo.broker.actors.commit_actor import CommitActor
from smartgo.broker.rings import (DONE_RING_CAPACITY, SEND_RING_CAPACITY, STATUS_FENCED, STATUS_OK, iter_completions,
                                  send_prefix)
from smartgo.broker.settings import store_config
from smartgo.config import NodeConfig
from smartgo.store import CommitLogReader, recover
from smartgo.store.record import decode_record, encode_properties, encode_record, pack_host
from tests.support.waits import async_wait_until

NETS = ["net-0", "net-1"]
HOST = pack_host("127.0.0.1", 10911)


class Crash(Exception):
    """Stands for kill -9 at one step of a commit turn."""


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.config = NodeConfig(role="master", store_dir=str(tmp / "store"), net_actors=2,
                                 commitlog_file_size=4096).resolved(10911)
        fields = (*NODE_FIELDS, *ROLES["master"].board_fields(self.config))
        self.board = Board.create(self.config.board_path, BoardLayout(fields=fields))
        recovery.save(self.config.run_path, recovery.Recovered(0, 0, 0, False))
        rings = self.config.run_path / "rings"
        self.send = [Ring.attach(rings / f"send.{n}.ring", PRODUCER, SEND_RING_CAPACITY) for n in NETS]
        self.done = [Ring.attach(rings / f"done.{n}.ring", CONSUMER, DONE_RING_CAPACITY) for n in NETS]
        self.sent: dict[int, str] = {}                   # req id -> UNIQ_KEY
        self.answers: dict[int, set[tuple]] = {}
        self.incarnation = 0
        self._ids = itertools.count(1)

    async def commit_actor(self, run: bool) -> CommitActor:
        self.incarnation += 1
        spec = ActorSpec("commit", "smartgo.broker.actors.commit_actor:CommitActor", {"nets": NETS})
        actor = CommitActor(ActorContext(spec, self.config, self.board, 0, self.incarnation, None), nets=NETS)
        await actor.start()
        if not run:
            actor._task.cancel()
            await asyncio.gather(actor._task, return_exceptions=True)
        return actor

    def records(self, count: int, queue_id: int = 0) -> list[bytes]:
        """Send records (the send.<net> format) of `count` new messages, each in self.sent."""
        records = []
        for _ in range(count):
            req_id = next(self._ids)
            uniq = f"U{req_id:031d}"
            rec = encode_record("T", queue_id, b"body-%d" % req_id, encode_properties({"UNIQ_KEY": uniq}),
                                born_host=HOST, store_host=HOST)
            records.append(send_prefix(req_id, 1, queue_id, b"T") + rec)
            self.sent[req_id] = uniq
        return records

    def put(self, net: int, count: int, queue_id: int = 0) -> None:
        assert self.send[net].try_write(self.records(count, queue_id)) == count

    def collect(self) -> None:
        for ring in self.done:
            for mv in ring.read():
                for req_id, status, _count, phys, qoff, _end in iter_completions(mv):
                    assert status == STATUS_OK
                    self.answers.setdefault(req_id, set()).add((phys, qoff))
            ring.release()

    def all_answered(self, but: Collection[int] = ()) -> bool:
        """Every request in self.sent answered through a done ring (but those)."""
        self.collect()
        return set(self.sent) - set(but) <= set(self.answers)


def abandon(actor: CommitActor) -> None:
    """What kill -9 leaves: files as written into the page cache, rings and board as they are."""
    actor.stage.close()


class Raising:
    """A board scalar stand-in whose set() crashes for one value."""

    def __init__(self, scalar, bad: int) -> None:
        self.scalar, self.bad = scalar, bad

    def get(self) -> int:
        return self.scalar.get()

    def set(self, value: int) -> None:
        if value == self.bad:
            raise Crash
        self.scalar.set(value)


def crash_after_append(actor):                           # appended, written not published
    real = actor.stage.writer.append

    def append(blocks):
        real(blocks)
        raise Crash
    actor.stage.writer.append = append


def crash_before_completions(actor):                     # written published, nobody answered
    def complete(owners, results, wake=True):
        raise Crash
    actor.stage._complete = complete


def crash_mid_completions(actor):                        # net-0 answered, net-1 not
    def try_write(records, start=0, wake=True):
        raise Crash
    actor.stage.outputs[1].try_write = try_write


def crash_before_release(actor):                         # everybody answered, inputs not released
    def release():
        raise Crash
    actor.stage.inputs[0].release = release


def crash_before_clearing_intent(actor):                 # released, intent still up
    actor.stage.intent = Raising(actor.stage.intent, 0)


@pytest.mark.parametrize("net_restarts", [False, True], ids=["nets-stay", "net-1-restarts-too"])
@pytest.mark.parametrize("inject", [crash_after_append, crash_before_completions, crash_mid_completions,
                                    crash_before_release, crash_before_clearing_intent])
def test_a_crash_at_any_step_neither_loses_nor_duplicates(tmp_path, inject, net_restarts):
    asyncio.run(_scenario(tmp_path, inject, net_restarts))


async def _scenario(tmp_path: Path, inject, net_restarts: bool) -> None:
    h = Harness(tmp_path)
    first = await h.commit_actor(run=False)
    h.put(0, 12)                                                  # ~2.4 KB: the next batch rolls the 4 KiB file
    assert first.stage.turn()
    h.put(0, 6)
    h.put(1, 6, queue_id=1)
    inject(first)
    with pytest.raises(Crash):
        first.stage.turn()
    abandon(first)
    assert h.board.get("commit.intent") != 0                      # the crash left the intent up
    orphans: set[str] = set()
    if net_restarts:
        # net-1 dies too: its requests go unanswered (their connections are gone), and a new
        # incarnation attaches to its rings. Its last records must be stored at most once.
        h.collect()
        orphans = {h.sent.pop(r) for r in [r for r in h.sent if r > 18 and r not in h.answers]}
        rings = h.config.run_path / "rings"
        h.send[1] = Ring.attach(rings / "send.net-1.ring", PRODUCER, SEND_RING_CAPACITY)
        h.done[1] = Ring.attach(rings / "done.net-1.ring", CONSUMER, DONE_RING_CAPACITY)

    second = await h.commit_actor(run=True)
    h.put(1, 3, queue_id=1)                                       # new traffic after the restart
    await async_wait_until(h.all_answered, timeout=10, message="every request answered")
    await second.stop()
    assert h.board.get("commit.intent") == 0
    assert all(len(a) == 1 for a in h.answers.values()), "one request, two different answers"

    stored = stored_messages(h)
    keys = [m.uniq_key for m in stored]
    assert sorted(k for k in keys if k not in orphans) == sorted(h.sent.values())  # each exactly once
    assert all(keys.count(k) <= 1 for k in orphans)
    for queue_id in (0, 1):
        assert [m.queue_offset for m in stored if m.queue_id == queue_id] == \
            list(range(sum(1 for m in stored if m.queue_id == queue_id)))
    by_offset = {m.commit_log_offset: m for m in stored}
    for req_id, ((phys, qoff),) in ((r, tuple(a)) for r, a in h.answers.items() if r in h.sent):
        assert by_offset[phys].uniq_key == h.sent[req_id] and by_offset[phys].queue_offset == qoff


def stored_messages(h: Harness) -> list:
    """Every message in the CommitLog, as recovery sees it (which must be what was published)."""
    cfg = store_config(h.config)
    state = recover(cfg)
    assert state.written == h.board.get("commitlog.written")
    reader = CommitLogReader(cfg.commitlog_dir, cfg.commitlog_file_size)
    try:
        return [decode_record(memoryview(mm)[rel:rel + size]) for _, mm, rel, size in reader.walk(0, state.written)]
    finally:
        reader.close()


@pytest.mark.parametrize("inject", [crash_after_append, crash_before_clearing_intent])
def test_a_crash_in_a_local_batch_neither_loses_nor_duplicates(tmp_path, inject):
    """The sends of a net actor hosting the commit stage go in without a ring (append_local) and are
    answered by the call's result. A crash in such a batch before written is published leaves none
    of it behind the restart; one after leaves it stored once, with nothing to answer again (its
    connections died with the process), while the ring producers' requests are all answered."""
    async def scenario() -> None:
        h = Harness(tmp_path)
        first = await h.commit_actor(run=False)
        local = first.stage.append_local(h.records(5))
        statuses = {req_id: status for req_id, status, *_ in iter_completions(memoryview(local))}
        assert statuses == {req_id: STATUS_OK for req_id in list(h.sent)[-5:]}
        h.put(1, 4, queue_id=1)                             # a ring producer's batch, appended next turn
        assert first.stage.turn()
        crashed = h.records(6)
        crashed_keys = {h.sent.pop(req_id) for req_id in list(h.sent)[-6:]}
        inject(first)
        with pytest.raises(Crash):
            first.stage.append_local(crashed)
        abandon(first)
        second = await h.commit_actor(run=True)
        h.put(1, 3, queue_id=1)
        await async_wait_until(lambda: h.all_answered(but=statuses), timeout=10, message="every ring request answered")
        await second.stop()
        assert h.board.get("commit.intent") == 0
        keys = [m.uniq_key for m in stored_messages(h)]
        assert sorted(k for k in keys if k not in crashed_keys) == sorted(h.sent.values())      # exactly once
        landed = inject is crash_before_clearing_intent
        assert sorted(k for k in keys if k in crashed_keys) == (sorted(crashed_keys) if landed else [])
        queue0 = [m.queue_offset for m in stored_messages(h) if m.queue_id == 0]
        assert queue0 == list(range(len(queue0)))

    asyncio.run(scenario())


def test_a_fenced_master_commits_nothing_and_says_when_its_end_is_final(tmp_path):
    """failover.fenced up: commit.fenced follows once the turns before have landed, every batch
    from then on is refused (STATUS_FENCED) and commitlog.written stays; lifted, writes go on."""
    async def scenario() -> None:
        h = Harness(tmp_path)
        actor = await h.commit_actor(run=True)
        statuses: dict[int, int] = {}

        def answered(count: int) -> bool:
            for ring in h.done:
                for mv in ring.read():
                    statuses.update((req_id, status) for req_id, status, *_ in iter_completions(mv))
                ring.release()
            return len(statuses) == count

        h.put(0, 4)
        await async_wait_until(lambda: answered(4), timeout=10)
        fence = h.board.scalar("failover.fenced", writer="broker")
        fence.set(1)
        actor.bell.ring()                                   # as the broker actor does
        await async_wait_until(lambda: h.board.get("commit.fenced") == 1, timeout=10, message="commit.fenced")
        end = h.board.get("commitlog.written")
        h.put(0, 3)
        h.put(1, 2, queue_id=1)
        await async_wait_until(lambda: answered(9), timeout=10)
        assert [statuses[r] for r in range(5, 10)] == [STATUS_FENCED] * 5
        assert h.board.get("commitlog.written") == end
        fence.set(0)
        actor.bell.ring()
        await async_wait_until(lambda: h.board.get("commit.fenced") == 0, timeout=10, message="the fence lifted")
        h.put(1, 1, queue_id=1)
        await async_wait_until(lambda: answered(10), timeout=10)
        assert statuses[10] == STATUS_OK and h.board.get("commitlog.written") > end
        await actor.stop()

    asyncio.run(scenario())
