"""Body parsers and encoders against the shapes of reference sections C and D."""

from __future__ import annotations

import json
import zlib

import pytest

from smartgo.net import fastjson
from smartgo.registry.bodies import (BodyError, encode_cluster_info, encode_data_version, encode_kv_table,
                                     encode_topic_list, encode_topic_route, parse_register_broker_body)
from smartgo.registry.route_info import (BrokerData, DataVersion, QueueData, TopicConfig, TopicRoute)

from .conftest import compressed_register_body, register_body, strict_json

QUEUE_FIELDS = {"brokerName", "perm", "readQueueNums", "topicSynFlag", "topicSysFlag", "writeQueueNums"}
BROKER_FIELDS = {"brokerAddrs", "brokerName", "cluster"}


def test_json_register_body() -> None:
    parsed = parse_register_broker_body(register_body({"TopicTest": (4, 8, 6)}, counter=3), False, False)
    assert parsed.data_version == DataVersion(1_700_000_000_000, 3)
    assert parsed.topic_configs == {"TopicTest": TopicConfig("TopicTest", 4, 8, 6, "SINGLE_TAG", 0, False)}
    assert parsed.filter_server_list == []
    assert parse_register_broker_body(None, False, False).topic_configs == {}


def test_compressed_register_body_matches_the_json_one() -> None:
    topics = {"A": (4, 4, 6), "B": (1, 2, 7), "%RETRY%G": (1, 1, 6)}
    packed = parse_register_broker_body(compressed_register_body(topics, counter=5), True, False)
    plain = parse_register_broker_body(register_body(topics, counter=5), False, False)
    assert packed == plain


def test_compressed_register_body_is_bounded_by_the_shared_inflate_guard(monkeypatch) -> None:
    """A zlib bomb or garbage is a BodyError naming the body; the bound is net.frame.inflate's."""
    from smartgo.registry import bodies

    monkeypatch.setattr(bodies, "MAX_INFLATED_BODY", 1 << 16)
    with pytest.raises(BodyError, match="RegisterBrokerBody inflates beyond the limit of 65536 bytes"):
        parse_register_broker_body(zlib.compress(b"\0" * (1 << 20), 9), True, False)
    with pytest.raises(BodyError, match="RegisterBrokerBody does not inflate"):
        parse_register_broker_body(b"garbage", True, False)


def test_legacy_body_is_a_bare_wrapper() -> None:
    wrapper = json.dumps({"dataVersion": {"counter": 2, "timestamp": 5},
                          "topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 2, "writeQueueNums": 2,
                                                     "perm": 6}}}).encode()
    parsed = parse_register_broker_body(wrapper, False, legacy=True)
    assert parsed.data_version == DataVersion(5, 2) and parsed.topic_configs["T"].read_queue_nums == 2


def test_fastjson_unquoted_integer_keys_are_accepted() -> None:
    assert fastjson.loads(b'{"offsetTable":{"T@G":{0:12,1:7}},"s":"{0:x}"}') == \
        {"offsetTable": {"T@G": {"0": 12, "1": 7}}, "s": "{0:x}"}
    with pytest.raises(ValueError):
        fastjson.loads(b"{oops}")


@pytest.mark.parametrize("data, compressed, fragment", [
    (b"not json", False, "not JSON"),
    (b"[]", False, "RegisterBrokerBody must be an object"),
    (b'{"topicConfigSerializeWrapper":[]}', False, "topicConfigSerializeWrapper must be an object"),
    (b'{"topicConfigSerializeWrapper":{"dataVersion":{"counter":"3"}}}', False, "dataVersion.counter must be an integer"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"readQueueNums":true}}}}', False,
     "topicConfigTable.T.readQueueNums must be an integer"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"writeQueueNums":-1}}}}', False, "out of range"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"topicFilterType":"SQL"}}}}', False, "topicFilterType"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"order":"yes"}}}}', False, "order must be a boolean"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":5}}}', False, "T must be an object"),
    (b'{"filterServerList":[1]}', False, "filterServerList"),
    (b"\x78\x9cgarbage", True, "does not inflate"),
    (zlib.compress(b"\x00\x00\x00\x05{}"), True, "length 5 is wrong"),
    (zlib.compress(b"\x00\x00\x00\x02{}\xff\xff\xff\xff"), True, "negative"),
    (zlib.compress(b"\x00\x00\x00\x02{}\x00\x00\x00\x01\x00\x00\x00\x03a b"), True, "malformed topic config"),
    (zlib.compress(b"\x00\x00\x00\x02{}\x00\x00\x00\x00"), True, "truncated"),
])
def test_malformed_register_bodies_name_the_problem(data: bytes, compressed: bool, fragment: str) -> None:
    with pytest.raises(BodyError, match=fragment):
        parse_register_broker_body(data, compressed, False)


def test_topic_route_shape() -> None:
    route = TopicRoute([QueueData("broker-a", 4, 4, 6, 0)],
                       [BrokerData("DefaultCluster", "broker-a", {1: "10.0.0.2:10911", 0: "10.0.0.1:10911"})], {})
    raw = encode_topic_route(route, None)
    obj = strict_json(raw)
    assert set(obj) == {"brokerDatas", "filterServerTable", "queueDatas"}
    assert set(obj["queueDatas"][0]) == QUEUE_FIELDS and set(obj["brokerDatas"][0]) == BROKER_FIELDS
    assert obj["brokerDatas"][0]["brokerAddrs"] == {"0": "10.0.0.1:10911", "1": "10.0.0.2:10911"}
    assert b'"brokerAddrs":{"0":"10.0.0.1:10911","1":"10.0.0.2:10911"}' in raw     # quoted keys, compact
    ordered = strict_json(encode_topic_route(route, "broker-a:4"))
    assert list(ordered) == ["brokerDatas", "filterServerTable", "orderTopicConf", "queueDatas"]


def test_other_body_shapes() -> None:
    brokers = {"broker-a": BrokerData("C", "broker-a", {0: "ip:10911"})}
    cluster = strict_json(encode_cluster_info(brokers, {"C": {"broker-a"}}))
    assert cluster == {"brokerAddrTable": {"broker-a": {"brokerAddrs": {"0": "ip:10911"}, "brokerName": "broker-a",
                                                        "cluster": "C"}},
                       "clusterAddrTable": {"C": ["broker-a"]}}
    assert strict_json(encode_topic_list(["A", "B"])) == {"topicList": ["A", "B"]}
    assert strict_json(encode_kv_table({"k": "v"})) == {"table": {"k": "v"}}
    assert strict_json(encode_data_version(DataVersion(7, 3))) == {"counter": 3, "timestamp": 7}
