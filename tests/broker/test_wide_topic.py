"""A topic of 10,000 queues (issue 47's backlog has one): the admin CLI creates it, the registry
serves its route, a producer sends to a queue above 9,000 through that route, a pull consumer reads
it back and rebalancing spreads all of it; past topics.MAX_QUEUES the answer says why."""

from __future__ import annotations

import asyncio

import pytest

from smartgo.broker.managers.topics import MAX_QUEUES, parse_static_topics
from smartgo.cli.main import main
from smartgo.client import AsyncAdmin, AsyncProducer, AsyncPullConsumer
from smartgo.client.allocate import allocate_averagely
from smartgo.client.message import Message
from smartgo.config import ConfigError

WIDE = 10_000
HIGH = 9_321              # the queue the message goes to: far past the old cap of 1,024


def test_static_topics_take_ten_thousand_queues_and_refuse_past_the_bound():
    assert [(t.name, t.read_queues, t.write_queues) for t in parse_static_topics(f"Wide:{WIDE};Narrow:2")] == \
        [("Wide", WIDE, WIDE), ("Narrow", 2, 2)]
    assert parse_static_topics(f"Edge:{MAX_QUEUES}")[0].read_queues == MAX_QUEUES
    with pytest.raises(ConfigError, match=f"'Over:{MAX_QUEUES + 1}' is not Name:queues\\[:perm\\] with "
                                          f"1..{MAX_QUEUES} queues"):
        parse_static_topics(f"Over:{MAX_QUEUES + 1}")


@pytest.mark.timeout(180)
def test_a_topic_of_ten_thousand_queues_end_to_end(start_node, capsys):
    broker = start_node()
    assert main(["admin", "topic-create", "-n", broker.registry, "--topic", "Wide", "--queues", str(WIDE),
                 "--broker", broker.addr, "--timeout", "20"]) == 0, capsys.readouterr().err
    assert main(["admin", "topic-create", "-n", broker.registry, "--topic", "Over", "--queues",
                 str(MAX_QUEUES + 1), "--broker", broker.addr]) == 1
    assert f"readQueueNums and writeQueueNums must be in 1..{MAX_QUEUES}, got {MAX_QUEUES + 1}" \
        in capsys.readouterr().err
    broker.node.logged("topic Over refused to")

    async def scenario() -> None:
        async with AsyncAdmin(broker.registry) as admin:
            route = await admin.topic_route("Wide")         # the registry's route, from REGISTER_BROKER
            assert [(q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas] == [(WIDE, WIDE)]
            queues = route.subscribe_queues("Wide")
            assert [q.queue_id for q in queues] == list(range(WIDE))
        owned = [allocate_averagely("G", c, queues, ["c0", "c1", "c2"]) for c in ("c0", "c1", "c2")]
        assert sorted(q.queue_id for share in owned for q in share) == list(range(WIDE))
        assert [len(share) for share in owned] == [3334, 3333, 3333]
        async with AsyncProducer("PG", broker.registry) as producer:
            sent = await producer.send_orderly(Message("Wide", b"far"), HIGH, lambda qs, key: qs[key])
            assert (sent.queue.queue_id, sent.queue_offset) == (HIGH, 0)
            assert len(await producer.fetch_publish_queues("Wide")) == WIDE
        async with AsyncPullConsumer("CG", broker.registry) as consumer:
            fetched = await consumer.fetch_queues("Wide")
            assert len(fetched) == WIDE
            queue = next(q for q in fetched if q.queue_id == HIGH)
            for _ in range(100):                            # dispatch makes it readable shortly
                result = await consumer.pull(queue, offset=0)
                if result.messages:
                    break
                await asyncio.sleep(0.1)
            assert [(m.body, m.queue_id) for m in result.messages] == [(b"far", HIGH)]
    asyncio.run(scenario())
