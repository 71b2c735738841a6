"""Send, batch send and pull against a real node: round trips, tag filtering, every pull edge case."""

from __future__ import annotations

import json
import socket

import pytest

from tests.support.broker import batch_command, message_properties, pull_command, send_command, uniq_key
from smartgo.net.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.frame import FrameDecoder, encode_command
from smartgo.store.record import (BORNHOST_V6_FLAG, COMPRESSED_FLAG, MULTI_TAGS_FLAG, STOREHOST_V6_FLAG,
                                  decode_records, encode_batch_body, encode_record, pack_host, parse_offset_msg_id)
from tests.support.waits import wait_until

PULL_HEADERS = {"suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"}


def pull_until(broker, topic, queue_id, offset, count, **kw):
    """Pull from offset until `count` messages came back (dispatch runs behind the send ack)."""
    got = []

    def more():
        nonlocal offset
        r = broker.call(pull_command(topic, queue_id, offset, **kw))
        assert PULL_HEADERS <= set(r.ext_fields), r.ext_fields
        if r.code == ResponseCode.SUCCESS:
            got.extend(decode_records(r.body_bytes(), check_crc=True))
            offset = int(r.ext_fields["nextBeginOffset"])
        return len(got) >= count
    wait_until(more, timeout=10, message=f"{count} messages from {topic}/{queue_id}")
    return got


def test_send_then_pull_round_trip_with_both_send_codes(broker):
    topic = "RoundTrip"
    sent = []
    for v1 in (False, True):
        key = uniq_key()
        r = broker.call(send_command(topic, f"body-{v1}".encode(), queue_id=1, tags="TagA", keys="k1 k2",
                                     uniq=key, v1=v1))
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert set(r.ext_fields) >= {"msgId", "queueId", "queueOffset", "MSG_REGION", "TRACE_ON"}
        assert r.ext_fields["queueId"] == "1" and r.ext_fields["MSG_REGION"] == "DefaultRegion"
        sent.append((key, r.ext_fields))
    assert [int(e["queueOffset"]) for _, e in sent] == [0, 1]
    msgs = pull_until(broker, topic, 1, 0, 2)
    assert [m.uniq_key for m in msgs] == [k for k, _ in sent]
    for m, (_, ext) in zip(msgs, sent):
        assert m.msg_id == ext["msgId"]                                  # offsetMsgId = store host + offset
        assert parse_offset_msg_id(ext["msgId"]) == ("127.0.0.1", broker.node.port, m.commit_log_offset)
        assert m.store_host == ("127.0.0.1", broker.node.port)
        assert m.born_host[0] == "127.0.0.1" and m.born_host[1] > 0       # the producer's socket address
        assert m.tags == "TagA" and m.keys == ["k1", "k2"] and m.properties["CLUSTER"] == "DefaultCluster"
        assert m.topic == topic and m.queue_id == 1


def test_batch_send_is_contiguous_with_comma_joined_ids(broker):
    topic = "Batched"
    keys = [uniq_key() for _ in range(5)]
    r = broker.call(batch_command(topic, [(f"m{i}".encode(), message_properties(tags="B", uniq=k))
                                          for i, k in enumerate(keys)], queue_id=2))
    assert r.code == ResponseCode.SUCCESS, r.remark
    ids = r.ext_fields["msgId"].split(",")
    assert len(ids) == 5 and r.ext_fields["queueOffset"] == "0"
    msgs = pull_until(broker, topic, 2, 0, 5)
    assert [m.msg_id for m in msgs] == ids
    assert [m.uniq_key for m in msgs] == keys
    assert [m.queue_offset for m in msgs] == list(range(5))
    assert [m.body for m in msgs] == [f"m{i}".encode() for i in range(5)]


@pytest.mark.parametrize("code, flag_name, flag", [
    (RequestCode.SEND_MESSAGE, "batch", "1"),          # the C++ client's batches (Java's broker misreads "1")
    (RequestCode.SEND_MESSAGE, "batch", "true"),
    (RequestCode.SEND_MESSAGE_V2, "m", "true"),       # Java's broker goes by the flag, not the code
])
def test_batch_flag_on_a_single_send_code_stores_each_item(broker, code, flag_name, flag):
    topic = f"BatchFlag{code}{flag}"
    keys = [uniq_key() for _ in range(3)]
    cmd = batch_command(topic, [(f"m{i}".encode(), message_properties(tags="B", uniq=k)) for i, k in enumerate(keys)])
    v1 = code == RequestCode.SEND_MESSAGE
    names = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
             "bornTimestamp", "flag", "properties", "reconsumeTimes") if v1 else tuple("abcdefghij")
    ext = dict(zip(names, (cmd.ext_fields[c] for c in "abcdefghij")))
    r = broker.call(RemotingCommand(code, ext_fields={**ext, flag_name: flag}, body=cmd.body))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert len(r.ext_fields["msgId"].split(",")) == 3
    msgs = pull_until(broker, topic, 0, 0, 3)
    assert [m.uniq_key for m in msgs] == keys and [m.body for m in msgs] == [b"m0", b"m1", b"m2"]


def _stored_bytes(broker, topic: str, queue_id: int, count: int) -> list[tuple[bytes, object]]:
    """The raw records a pull brings back, each with its decoding."""
    msgs = pull_until(broker, topic, queue_id, 0, count)
    r = broker.call(pull_command(topic, queue_id, 0, max_nums=count))
    raw = r.body_bytes()
    out, pos = [], 0
    for m in decode_records(raw):
        out.append((raw[pos:pos + m.store_size], m))
        pos += m.store_size
    assert [m.msg_id for _, m in out] == [m.msg_id for m in msgs]
    return out


def _expected(broker, m, body: bytes, props: str, flag: int, sys_flag: int, born: int, reconsume: int) -> bytes:
    """encode_record of what was sent, with the fields only the store knows (offsets, store time)."""
    return encode_record(m.topic, m.queue_id, body, props.encode(), flag=flag, sys_flag=sys_flag,
                         born_timestamp=born, born_host=pack_host(*m.born_host),
                         store_host=pack_host("127.0.0.1", broker.node.port), reconsume_times=reconsume,
                         queue_offset=m.queue_offset, physical_offset=m.commit_log_offset,
                         store_timestamp=m.store_timestamp)


V6_HOSTS = BORNHOST_V6_FLAG | STOREHOST_V6_FLAG       # a client's v6 claim: the hosts are stored as IPv4
BORN = 1_700_000_000_123


@pytest.mark.parametrize("sys_flag", [0, COMPRESSED_FLAG | MULTI_TAGS_FLAG, V6_HOSTS | COMPRESSED_FLAG])
def test_sent_records_are_the_bytes_of_the_store_encoder(broker, sys_flag):
    """The send path (single and batch) stores exactly what store.record.encode_record makes."""
    topic = f"Encoder{sys_flag}"
    cluster = "CLUSTER\x01DefaultCluster"
    singles = [(b"one", message_properties(tags="A", keys="k1 k2", uniq=uniq_key()), 7, 2),
               (b"", "", 0, 0),
               (bytes(range(256)) * 3, message_properties(extra={"x": "\u00e9\u4e2d"}) + "\x02", 1, 0)]
    for i, (body, props, flag, reconsume) in enumerate(singles):
        cmd = send_command(topic, body, queue_id=1, sys_flag=sys_flag)
        cmd.ext_fields.update(g=str(BORN + i), h=str(flag), i=props, j=str(reconsume))
        assert broker.call(cmd).code == ResponseCode.SUCCESS
    stored = _stored_bytes(broker, topic, 1, len(singles))
    for i, ((raw, m), (body, props, flag, reconsume)) in enumerate(zip(stored, singles)):
        kept = props.rstrip("\x02")
        assert raw == _expected(broker, m, body, f"{kept}\x02{cluster}" if kept else cluster, flag, sys_flag,
                                BORN + i, reconsume)

    items = [(b"b0", 3, message_properties(tags="B", uniq=uniq_key())), (b"", 0, ""),
             (b"b2" * 500, 1, message_properties(keys="k") + "\x02")]
    cmd = batch_command(topic, [], queue_id=2)
    cmd.body = encode_batch_body([(b, f, p.encode()) for b, f, p in items])
    cmd.ext_fields.update(f=str(sys_flag), g=str(BORN), j="4")
    assert broker.call(cmd).code == ResponseCode.SUCCESS
    for (raw, m), (body, flag, props) in zip(_stored_bytes(broker, topic, 2, len(items)), items):
        kept = props.rstrip("\x02")
        assert raw == _expected(broker, m, body, f"{kept}\x02{cluster}" if kept else cluster, flag, sys_flag,
                                BORN, 4)


def test_tag_filtering_and_no_match_retry_immediately(broker):
    topic = "Tagged"
    for i in range(6):
        assert broker.call(send_command(topic, b"x%d" % i, tags="TagA" if i % 2 else "TagB")).code == 0
    wait_until(lambda: broker.call(RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={
        "topic": topic, "queueId": "0"})).ext_fields["offset"] == "6")
    a = broker.call(pull_command(topic, 0, 0, subscription="TagA"))
    assert a.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(a.body_bytes())] == [b"x1", b"x3", b"x5"]
    both = broker.call(pull_command(topic, 0, 0, subscription="TagA || TagB"))
    assert len(decode_records(both.body_bytes())) == 6
    everything = broker.call(pull_command(topic, 0, 0))                 # no subscription: "*"
    assert len(decode_records(everything.body_bytes())) == 6
    none = broker.call(pull_command(topic, 0, 0, subscription="TagC"))
    assert none.code == ResponseCode.PULL_RETRY_IMMEDIATELY and none.remark == "NO_MATCHED_MESSAGE"
    assert none.ext_fields["nextBeginOffset"] == "6"                     # after the scanned entries


@pytest.mark.parametrize("offset, code, status, next_begin", [
    (0, ResponseCode.PULL_NOT_FOUND, "NO_MESSAGE_IN_QUEUE", 0),           # empty queue, offset 0
    (5, ResponseCode.PULL_OFFSET_MOVED, "NO_MESSAGE_IN_QUEUE", 0),        # empty queue, offset != 0
])
def test_pull_edge_cases_of_an_empty_queue(broker, offset, code, status, next_begin):
    broker.call(send_command("EdgeEmpty", b"x", queue_id=0))             # creates the topic; queue 3 stays empty
    r = broker.call(pull_command("EdgeEmpty", 3, offset))
    assert (r.code, r.remark, int(r.ext_fields["nextBeginOffset"])) == (code, status, next_begin)
    assert set(r.ext_fields) == PULL_HEADERS and r.ext_fields["suggestWhichBrokerId"] == "0"


def test_pull_edge_cases_at_and_past_the_end(broker):
    topic = "EdgeEnd"
    for _ in range(3):
        broker.call(send_command(topic, b"x"))
    pull_until(broker, topic, 0, 0, 3)
    at_max = broker.call(pull_command(topic, 0, 3))
    assert (at_max.code, at_max.remark, at_max.ext_fields["nextBeginOffset"]) == \
        (ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE", "3")
    past = broker.call(pull_command(topic, 0, 9))
    assert (past.code, past.remark, past.ext_fields["nextBeginOffset"]) == \
        (ResponseCode.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY", "3")
    assert (past.ext_fields["minOffset"], past.ext_fields["maxOffset"]) == ("0", "3")
    found = broker.call(pull_command(topic, 0, 1, max_nums=1))
    assert found.remark == "FOUND" and found.ext_fields["nextBeginOffset"] == "2"
    # the moved offset is reported in OFFSET_MOVED_EVENT, as generateOffsetMovedEvent does
    def moved():
        r = broker.call(pull_command("OFFSET_MOVED_EVENT", 0, 0))
        events = decode_records(r.body_bytes()) if r.code == ResponseCode.SUCCESS else []
        return [m for m in events if json.loads(m.body)["messageQueue"]["topic"] == topic]
    mine = wait_until(moved, message="the offset-moved event")
    assert len(mine) == 1 and mine[0].tags == mine[0].keys[0] == "test_consumer"
    assert json.loads(mine[0].body) == {"consumerGroup": "test_consumer", "offsetNew": 3, "offsetRequest": 9,
                                        "messageQueue": {"brokerName": "broker-a", "queueId": 0, "topic": topic}}


def test_auto_created_topic_is_routed_and_forwarded_requests_reach_the_broker_actor(broker):
    """Auto-creation goes net -> broker -> net through the request channel; GET_ALL_TOPIC_CONFIG
    is forwarded whole to the broker actor and its answer comes back on the same connection."""
    r = broker.call(send_command("AutoMade", b"x", default_queues=3))
    assert r.code == ResponseCode.SUCCESS
    route = wait_until(lambda: (a := broker.client.invoke(broker.registry, RemotingCommand(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "AutoMade"}))).code == 0 and a)
    queues = json.loads(route.body_bytes())["queueDatas"][0]
    assert queues["writeQueueNums"] == 3 and queues["perm"] == 6            # min(3, TBW102's 8), no INHERIT
    table = broker.call(RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG))
    assert table.code == ResponseCode.SUCCESS
    configs = json.loads(table.body_bytes())["topicConfigTable"]
    assert configs["AutoMade"]["readQueueNums"] == 3 and configs["TBW102"]["perm"] == 7
    assert broker.call(send_command("AutoMade", b"y", queue_id=2)).code == ResponseCode.SUCCESS
    wrong = broker.call(send_command("AutoMade", b"y", queue_id=3))
    assert wrong.code == ResponseCode.SYSTEM_ERROR and "queueId[3] is illegal" in wrong.remark


def test_oneway_send_is_stored_without_an_answer(broker):
    key = uniq_key()
    cmd = send_command("Oneway", b"quiet", uniq=key)
    broker.client.invoke_oneway(broker.addr, cmd)
    assert broker.call(send_command("Oneway", b"loud")).code == ResponseCode.SUCCESS
    msgs = pull_until(broker, "Oneway", 0, 0, 2)
    assert msgs[0].uniq_key == key



def test_a_oneway_send_whose_producer_hangs_up_at_once_is_stored(broker):
    """A oneway send needing a step through the broker actor (the topic's auto-creation), its
    connection closed right behind it: the send is carried out all the same, as a 4.x broker's
    processor thread does; only two-way requests' work ends with their connection."""
    key = uniq_key()
    cmd = send_command("OnewayHangUp", b"fire and forget", uniq=key, default_queues=1)
    cmd.flag |= FLAG_ONEWAY
    with socket.create_connection(("127.0.0.1", broker.node.port), timeout=5) as s:
        s.sendall(b"".join(bytes(b) for b in encode_command(cmd)))

    def stored():         # TOPIC_NOT_EXIST until the send created it
        r = broker.call(pull_command("OnewayHangUp", 0, 0))
        return r.code == ResponseCode.SUCCESS and decode_records(r.body_bytes())
    [msg] = wait_until(stored, message="the oneway message")
    assert (msg.uniq_key, msg.body) == (key, b"fire and forget")

def test_sends_on_one_connection_are_stored_in_order_while_the_first_creates_the_topic(broker):
    """Oneway sends to a new topic, each its own write, and a sync send behind them on one
    connection: the first creates the topic (a call to the broker actor), and those that arrive
    once the topic table has moved on but before that call's answer still wait their turn, as
    4.x's single send thread stores them."""
    rounds, oneways = 6, 150
    decoder, answered, sent = FrameDecoder(), [], {}
    with socket.create_connection(("127.0.0.1", broker.node.port), timeout=5) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for r in range(rounds):
            topic = f"InOrder{r}"
            keys = [uniq_key() for _ in range(oneways + 1)]
            for i, key in enumerate(keys):
                cmd = send_command(topic, b"%d" % i, uniq=key, default_queues=1)
                cmd.flag |= FLAG_ONEWAY if i < oneways else 0
                s.sendall(b"".join(bytes(b) for b in encode_command(cmd)))
            sent[topic] = keys
            while len(answered) <= r:
                data = s.recv(65536)
                assert data, "the broker closed the connection"
                answered.extend(decoder.feed(data))
    assert [c.code for c in answered] == [ResponseCode.SUCCESS] * rounds
    for topic, keys in sent.items():
        assert [m.uniq_key for m in pull_until(broker, topic, 0, 0, len(keys))] == keys, topic


def test_update_and_create_topic_reaches_routes_and_net_actors(broker):
    """UPDATE_AND_CREATE_TOPIC (17) is served by the broker actor through the request channel."""
    def create(topic, read, write, perm=6):
        return broker.call(RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields={
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(read), "writeQueueNums": str(write),
            "perm": str(perm), "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}))
    assert create("Created", 2, 2).code == ResponseCode.SUCCESS
    assert broker.call(send_command("Created", b"x", queue_id=1)).code == ResponseCode.SUCCESS
    assert create("Created", 3, 3, perm=4).code == ResponseCode.SUCCESS            # read-only now
    refused = broker.call(send_command("Created", b"y"))
    assert refused.code == ResponseCode.NO_PERMISSION and "forbidden" in refused.remark
    assert broker.call(pull_command("Created", 2, 0)).code == ResponseCode.PULL_NOT_FOUND   # queue 2 is valid
    # routed as soon as the change is answered, as Java's registerIncrementBrokerData does
    r = broker.client.invoke(broker.registry, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                              ext_fields={"topic": "Created"}))
    assert r.code == ResponseCode.SUCCESS and json.loads(r.body_bytes())["queueDatas"][0]["readQueueNums"] == 3
    bad = create("bad topic", 1, 1)
    assert bad.code == ResponseCode.SYSTEM_ERROR and "illegal characters" in bad.remark
    assert create("Zero", 0, 1).code == ResponseCode.SYSTEM_ERROR
