"""The transaction check-back's pass without processes: TransactionChecker over an in-process store,
with a stand-in for the broker actor (its view, offsets, producers and pushes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from smartgo.broker.managers.offsets import ConsumerOffsets
from smartgo.broker.schedule.schedule_message import HALF_TOPIC, OP_TOPIC
from smartgo.broker.managers.topics import RW, TRANS_CHECK_MAX_TIME_TOPIC
from smartgo.broker.transaction.transaction_check import CHECK_GROUP, TransactionChecker
from smartgo.store import Message, MessageStore
from smartgo.store.consume_queue import CQ_UNIT, ENTRY, HOLE_SIZE, queue_dir
from smartgo.store.record import decode_record

from ..store.conftest import small_config

BORN = 1_700_000_000_000
TIMEOUT_MS = 6000


@dataclass
class Broker:
    """What TransactionChecker uses of the broker actor."""
    store: MessageStore
    offsets: ConsumerOffsets
    pushed: list = field(default_factory=list)
    producers: dict = field(default_factory=dict)
    events: list = field(default_factory=list)          # (net actor, op, args) sent to the net actors

    def __post_init__(self) -> None:
        store = self.store
        self.config = SimpleNamespace(transaction_timeout=TIMEOUT_MS / 1000, transaction_check_max=2,
                                      store_path=self.store.config.store_path)
        self.view = SimpleNamespace(max_offset=lambda t, q: store.max_offset(t, q), fresh_reader=lambda: store.reader,
                                    written=SimpleNamespace(get=lambda: store.written))
        self.snapshot = SimpleNamespace(topics={})
        self.clients = SimpleNamespace(producers=self.producers)
        self.channel = SimpleNamespace(push=lambda ref, cmd: self.pushed.append((ref, cmd)), nets=["net0", "net1"],
                                       send=lambda net, op, **args: self.events.append((net, op, args)))

    def publish_topics(self, configs) -> None:
        self.snapshot.topics.update({c.name: c for c in configs})


def half(store: MessageStore, group: str = "G", born: int = BORN, **props: str) -> int:
    """Store a half message; its half-queue offset."""
    return store.put(Message(HALF_TOPIC, b"half", properties={
        "TRAN_MSG": "true", "PGROUP": group, "REAL_TOPIC": "Orders", "REAL_QID": "2", "UNIQ_KEY": f"U{born}", **props},
        born_timestamp=born)).queue_offset


def close(store: MessageStore, half_offset: int) -> None:
    store.put(Message(OP_TOPIC, b"%d" % half_offset, properties={"TAGS": "d"}))


def checked(broker: Broker) -> list[int]:
    return [int(cmd.ext_fields["tranStateTableOffset"]) for _, cmd in broker.pushed]


@pytest.fixture
def setup(tmp_path):
    """(the stand-in broker, its TransactionChecker): producer group G is connected, as "r"."""
    store = MessageStore(small_config(tmp_path / "store", commitlog_file_size=1 << 20))
    store.open()
    broker = Broker(store, ConsumerOffsets(tmp_path / "offsets.json"), producers={"G": {"k": SimpleNamespace(ref="r")}})
    yield broker, TransactionChecker(broker)  # type: ignore[arg-type]
    store.shutdown()


def test_a_pass_checks_open_old_halves_and_moves_past_closed_ones(setup):
    broker, checker = setup
    store = broker.store
    first, second, third = half(store), half(store), half(store, born=BORN + 5000)
    close(store, first)
    assert checker.run(BORN + TIMEOUT_MS) == 1                # second (first is closed, third is young)
    assert checked(broker) == [second]
    [(ref, cmd)] = broker.pushed
    shown = decode_record(cmd.body_bytes())
    assert ref == "r" and (shown.topic, shown.queue_id, shown.body) == ("Orders", 2, b"half")
    assert broker.offsets.query(CHECK_GROUP, HALF_TOPIC, 0) == second          # past the closed first
    assert set(broker.snapshot.topics) == {HALF_TOPIC, OP_TOPIC}
    assert checker.run(BORN + TIMEOUT_MS + 1) == 0            # not again before the timeout since its check
    close(store, second)
    assert checker.run(BORN + 2 * TIMEOUT_MS + 5000) == 1     # third, now old enough
    assert checked(broker) == [second, third]
    assert broker.offsets.query(CHECK_GROUP, HALF_TOPIC, 0) == third


def test_a_half_is_given_up_after_the_check_limit_and_immunity_delays_it(setup):
    broker, checker = setup
    store = broker.store
    stuck = half(store)
    immune = half(store, CHECK_IMMUNITY_TIME_IN_SECONDS="60")
    now = BORN + TIMEOUT_MS
    for _ in range(3):                                        # transaction_check_max 2, then given up
        checker.run(now)
        now += TIMEOUT_MS
    assert checked(broker).count(stuck) == 2 and immune not in checked(broker)
    # the copy to TRANS_CHECK_MAX_TIME_TOPIC (created on demand, one queue) is asked of one net actor
    assert broker.events == [("net0", "given_up", {"phys": store.reader.queue(HALF_TOPIC, 0).entry(stuck)[0],
                                                   "checks": 2})]
    topic = broker.snapshot.topics[TRANS_CHECK_MAX_TIME_TOPIC]
    assert (topic.read_queues, topic.write_queues, topic.perm) == (1, 1, RW)
    close(store, immune)
    checker.run(now)
    assert broker.offsets.query(CHECK_GROUP, HALF_TOPIC, 0) == immune + 1


def test_holes_and_groups_without_a_producer(setup):
    broker, checker = setup
    store = broker.store
    orphan, lost, after = half(store, group="Nobody"), half(store), half(store)
    path = queue_dir(store.config.consume_queue_dir, HALF_TOPIC, 0) / f"{0:020d}"
    with open(path, "r+b") as f:                              # a repaired store's hole in the half queue
        f.seek(lost * CQ_UNIT)
        f.write(ENTRY.pack(0, HOLE_SIZE, 0))
    assert checker.run(BORN + TIMEOUT_MS) == 1                # after; the orphan's group has no producer
    assert checked(broker) == [after]
    close(store, orphan)
    close(store, after)
    checker.run(BORN + TIMEOUT_MS + 1)
    assert broker.offsets.query(CHECK_GROUP, HALF_TOPIC, 0) == after + 1      # the hole does not hold it back
