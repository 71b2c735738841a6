"""Transactional messages with the SDK against a real node: send_in_transaction's three outcomes,
the broker's check-back answered by the listener (plain or coroutine functions, exceptions as
UNKNOW), and the blocking facade."""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from smartgo.client import (AsyncAdmin, AsyncProducer, AsyncPullConsumer, ClientStateError, LocalTransactionState,
                            Message, NoRouteError, Producer, PullStatus, SendStatus)
from tests.support.waits import async_wait_until

from .conftest import RealCluster, arun

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A node that checks open halves 1 s after their birth, every 0.2 s, and gives up after 2 checks."""
    with RealCluster(tmp_path_factory.mktemp("tx"), extra_args=(
            "--transaction-timeout", "1", "--transaction-check-interval", "0.2", "--transaction-check-max", "2")) as c:
        yield c


class Listener:
    """execute answers `local` (raises it when it is an exception); check answers `checked` and
    records what it was asked."""

    def __init__(self, local, checked=COMMIT) -> None:
        self.local, self.checked = local, checked
        self.executed: list[tuple[bytes, object]] = []
        self.checks: list = []
        self._lock = threading.Lock()

    def execute(self, msg: Message, arg: object) -> LocalTransactionState:
        self.executed.append((msg.body, arg))
        if isinstance(self.local, Exception):
            raise self.local
        return self.local

    async def check(self, msg) -> LocalTransactionState:       # a coroutine function: runs on the loop
        with self._lock:
            self.checks.append(msg)
        return self.checked


async def bodies(registry: str, topic: str) -> list[bytes]:
    async with AsyncPullConsumer("TX_READER", registry) as pc:
        out = []
        for q in await pc.fetch_queues(topic):
            r = await pc.pull(q, "*", 0, 32)
            if r.status is PullStatus.FOUND:
                out += [m.body for m in r.messages]
        return sorted(out)


def topic_name() -> str:
    return "TX_" + uuid.uuid4().hex[:8]


@pytest.mark.parametrize("local, delivered", [(COMMIT, True), (ROLLBACK, False)])
def test_the_local_outcome_commits_or_rolls_back(cluster, local, delivered):
    topic = topic_name()
    listener = Listener(local, checked=ROLLBACK)

    async def main():
        async with AsyncProducer("PG_TX_" + local.name, cluster.registry, transaction_listener=listener) as p:
            result = await p.send_in_transaction(Message(topic, b"order", tags="T", keys="o-1"), arg={"id": 1})
            assert result.status is SendStatus.SEND_OK and result.local_state is local
            assert listener.executed == [(b"order", {"id": 1})]
            await p.send(Message(topic, b"after"))                 # plain: the queue reads past the half
            await async_wait_until(lambda: bodies_contain(cluster.registry, topic, b"after"), 10, 0.1, "the plain send")
            got = await bodies(cluster.registry, topic)
        assert got == ([b"after", b"order"] if delivered else [b"after"])
        assert listener.checks == []                              # ended at once: never checked
    arun(main())


def test_a_committed_timer_message_arrives_at_its_time(cluster):
    """5.x: a transactional message's timer times its commit (the half is never timed); the
    delivered copy keeps the COMMIT type."""
    topic = topic_name()

    async def main():
        async with AsyncProducer("PG_TX_TIMER", cluster.registry, transaction_listener=Listener(COMMIT)) as p:
            result = await p.send_in_transaction(Message(topic, b"timed", delay_time_ms=1500))
            assert result.local_state is COMMIT
            await async_wait_until(lambda: bodies_contain(cluster.registry, topic, b"timed"), 15, 0.1,
                                   "the committed timer message")
            async with AsyncPullConsumer("TX_READER", cluster.registry) as pc:
                got = [m for q in await pc.fetch_queues(topic) for m in (await pc.pull(q, "*", 0, 32)).messages
                       if m.body == b"timed"]
        [m] = got
        assert m.store_timestamp >= int(m.properties["TIMER_OUT_MS"]) >= m.born_timestamp + 1500   # stored when due
        assert m.properties["TIMER_DELAY_MS"] == "1500" and "TRAN_MSG" not in m.properties
    arun(main())


async def bodies_contain(registry: str, topic: str, body: bytes) -> bool:
    """Whether topic holds body; False while the registries have no route yet (the broker creates
    a new topic at the first send and registers it a moment later)."""
    try:
        return body in await bodies(registry, topic)
    except NoRouteError:
        return False


@pytest.mark.parametrize("local", [UNKNOW, RuntimeError("the local transaction crashed")])
def test_an_undecided_transaction_is_settled_by_the_check_back(cluster, local):
    topic = topic_name()
    listener = Listener(local, checked=COMMIT)

    async def main():
        async with AsyncProducer("PG_TX_CHECK", cluster.registry, transaction_listener=listener) as p:
            result = await p.send_in_transaction(Message(topic, b"pending", keys="p-1"))
            assert result.local_state is UNKNOW
            await async_wait_until(lambda: bodies_contain(cluster.registry, topic, b"pending"), 15, 0.1,
                                   "the message committed by the check-back")
        [checked] = listener.checks
        assert (checked.topic, checked.body, checked.keys) == (topic, b"pending", ["p-1"])
        assert checked.properties["UNIQ_KEY"] == result.msg_id and checked.properties["PGROUP"] == "PG_TX_CHECK"
    arun(main())


def test_a_given_up_transaction_is_listed_and_resumed_by_the_admin(cluster):
    """Undecided past the check limit: the admin finds it among the given-up halves and resumes it
    by its msgId; the listener, asked again, commits it."""
    topic = topic_name()
    listener = Listener(UNKNOW, checked=UNKNOW)

    async def main():
        async with AsyncProducer("PG_TX_GIVEN_UP", cluster.registry, transaction_listener=listener) as p, \
                AsyncAdmin(cluster.registry) as admin:
            result = await p.send_in_transaction(Message(topic, b"stuck", keys="s-1"))

            async def given_up() -> list:
                return [m for m in await admin.given_up_halves(1000) if m.properties["UNIQ_KEY"] == result.msg_id]
            await async_wait_until(given_up, 15, 0.1, "the given-up copy")
            [copy] = await given_up()
            assert (copy.properties["REAL_TOPIC"], copy.properties["TRANSACTION_CHECK_TIMES"]) == (topic, "2")
            assert len(listener.checks) == 2 and await bodies(cluster.registry, topic) == []
            listener.checked = COMMIT
            assert await admin.resume_half(result.msg_id) == copy.msg_id
            await async_wait_until(lambda: bodies_contain(cluster.registry, topic, b"stuck"), 15, 0.1,
                                   "the resumed transaction committed by its check")
        assert len(listener.checks) == 3 and listener.checks[-1].body == b"stuck"
    arun(main())


def test_the_blocking_producer_and_a_plain_check_function(cluster):
    topic = topic_name()
    asked = threading.Event()

    class Blocking:
        def execute(self, msg, arg):
            return UNKNOW

        def check(self, msg):                                     # a plain function: runs in a worker thread
            asked.set()
            return ROLLBACK

    with Producer("PG_TX_BLOCKING", cluster.registry, transaction_listener=Blocking()) as p:
        result = p.send_in_transaction(Message(topic, b"maybe"))
        assert result.local_state is UNKNOW
        assert asked.wait(15), "no check-back came"
        p.send(Message(topic, b"after"))
    arun(async_wait_until(lambda: bodies_contain(cluster.registry, topic, b"after"), 10, 0.1, "the plain send"))
    assert arun(bodies(cluster.registry, topic)) == [b"after"]


def test_send_in_transaction_needs_a_listener(cluster):
    async def main():
        async with AsyncProducer("PG_TX_NONE", cluster.registry) as p:
            with pytest.raises(ClientStateError, match="transaction_listener"):
                await p.send_in_transaction(Message(topic_name(), b"x"))
    arun(main())


def test_the_send_command_commits_rolls_back_or_leaves_open(cluster, capsys):
    """`smartgo send --transaction`: commit is delivered, rollback is not, and unknown stays open
    until the broker's check-back asks the group's running producer, which commits it here. That
    producer never sends: it is known to the broker from its start, as a restarted one must be."""
    from smartgo.cli.main import main
    topic = topic_name()
    listener = Listener(UNKNOW, checked=COMMIT)
    with Producer("PG_TX_CLI", cluster.registry, transaction_listener=listener):
        for body, ending in (("kept", "commit"), ("dropped", "rollback"), ("open", "unknown")):
            assert main(["send", "-n", cluster.registry, "--topic", topic, "--body", body, "--transaction", ending,
                         "--group", "PG_TX_CLI", "--json"]) == 0
        results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(r["status"], r["transaction"]) for r in results] == [
            ("SEND_OK", "COMMIT_MESSAGE"), ("SEND_OK", "ROLLBACK_MESSAGE"), ("SEND_OK", "UNKNOW")]
        arun(async_wait_until(lambda: bodies_contain(cluster.registry, topic, b"open"), 15, 0.1,
                              "the open one committed by the check-back"))
    assert arun(bodies(cluster.registry, topic)) == [b"kept", b"open"]       # never the rolled-back one
    assert [c.body for c in listener.checks] == [b"open"]
    assert main(["send", "-n", cluster.registry, "--topic", topic, "--body", "x", "--transaction", "commit",
                 "--mode", "async"]) == 1
    assert "--transaction sends one message at a time" in capsys.readouterr().err
