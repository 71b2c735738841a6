"""Registry request and response bodies in RocketMQ's shapes (reference sections C and D).

Parsers validate everything and raise BodyError naming the offending field, so a processor can
reject a request before it touches any table. Encoders write compact JSON with quoted keys and
fastjson's field order (alphabetical).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from smartgo.net import fastjson
from smartgo.net.errors import RemotingError
from smartgo.net.frame import InflateError, inflate
from smartgo.registry.route_info import BrokerData, DataVersion, RegisterBrokerBody, TopicConfig, TopicRoute

#: Inflated REGISTER_BROKER bodies larger than this are refused (a zlib bomb guard).
MAX_INFLATED_BODY = 64 * 1024 * 1024
_I32 = struct.Struct(">i")
_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")


class BodyError(RemotingError):
    """A request body that does not parse or has a field of the wrong type."""


def load_json(data: bytes | None, what: str) -> Any:
    if not data:
        raise BodyError(f"{what} body is missing")
    try:
        return fastjson.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BodyError(f"{what} body is not JSON: {exc}") from None


_REQUIRED = object()
_KIND_NAMES = {int: "an integer", bool: "a boolean", str: "a string"}


def _field(obj: Mapping, name: str, kind: type, path: str, default: Any = _REQUIRED) -> Any:
    value = obj.get(name)
    if value is None:   # fastjson leaves nulls out; treat an explicit null the same way
        if default is _REQUIRED:
            raise BodyError(f"{path}.{name} is missing")
        return default
    if (type(value) is not kind) if kind in (int, bool) else not isinstance(value, kind):
        raise BodyError(f"{path}.{name} must be {_KIND_NAMES.get(kind, kind.__name__)}, got {value!r:.60}")
    return value


def _object(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise BodyError(f"{path} must be an object, got {type(value).__name__}")
    return value


def parse_data_version(obj: Any, path: str = "dataVersion") -> DataVersion:
    obj = _object(obj, path)
    return DataVersion(_field(obj, "timestamp", int, path, 0), _field(obj, "counter", int, path, 0))


def _queue_nums(value: int, path: str) -> int:
    if not 0 <= value <= 1 << 16:
        raise BodyError(f"{path} out of range: {value}")
    return value


def _filter_type(value: str, path: str) -> str:
    if value not in _FILTER_TYPES:
        raise BodyError(f"{path}.topicFilterType must be SINGLE_TAG or MULTI_TAG, got {value!r:.40}")
    return value


def _topic_config(name: Any, obj: Any, path: str) -> TopicConfig:
    obj = _object(obj, path)
    topic = _field(obj, "topicName", str, path, name)
    if not isinstance(topic, str) or not topic:
        raise BodyError(f"{path}.topicName must be a non-empty string")
    return TopicConfig(
        topic_name=topic,
        read_queue_nums=_queue_nums(_field(obj, "readQueueNums", int, path, 16), f"{path}.readQueueNums"),
        write_queue_nums=_queue_nums(_field(obj, "writeQueueNums", int, path, 16), f"{path}.writeQueueNums"),
        perm=_field(obj, "perm", int, path, 6),
        topic_filter_type=_filter_type(_field(obj, "topicFilterType", str, path, "SINGLE_TAG"), path),
        topic_sys_flag=_field(obj, "topicSysFlag", int, path, 0),
        order=_field(obj, "order", bool, path, False))


def _topic_config_wrapper(obj: Any) -> tuple[DataVersion, dict[str, TopicConfig]]:
    path = "topicConfigSerializeWrapper"
    obj = _object(obj, path)
    version = parse_data_version(obj.get("dataVersion", {}), f"{path}.dataVersion")
    table = _object(obj.get("topicConfigTable", {}), f"{path}.topicConfigTable")
    configs = {}
    for name, config in table.items():
        parsed = _topic_config(name, config, f"{path}.topicConfigTable.{name}")
        configs[parsed.topic_name] = parsed
    return version, configs


def _filter_servers(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise BodyError("filterServerList must be a list of strings")
    return value


def parse_register_broker_body(data: bytes | None, compressed: bool, legacy: bool) -> RegisterBrokerBody:
    """REGISTER_BROKER's body: RegisterBrokerBody JSON, its zlib form (compressed=true), or for
    senders older than V3_0_11 (legacy) a bare TopicConfigSerializeWrapper. No body at all means
    "nothing changed" to RocketMQ: an empty table with DataVersion(0, 0)."""
    if not data:
        return RegisterBrokerBody(DataVersion(), {}, [])
    if compressed:
        return _parse_compressed(data)
    obj = load_json(data, "RegisterBrokerBody")
    if legacy:
        version, configs = _topic_config_wrapper(obj)
        return RegisterBrokerBody(version, configs, [])
    obj = _object(obj, "RegisterBrokerBody")
    version, configs = _topic_config_wrapper(obj.get("topicConfigSerializeWrapper", {}))
    return RegisterBrokerBody(version, configs, _filter_servers(obj.get("filterServerList", [])))


def _parse_compressed(data: bytes) -> RegisterBrokerBody:
    """RegisterBrokerBody.encode(true): a zlib stream of int32-length-prefixed parts (reference C)."""
    try:
        raw = inflate(data, MAX_INFLATED_BODY, whole=False)     # as Java's, whose reads stop at the last part
    except InflateError as exc:
        raise BodyError(f"compressed RegisterBrokerBody {exc}") from None
    stream = io.BytesIO(raw)

    def chunk(what: str) -> bytes:
        head = stream.read(4)
        if len(head) != 4:
            raise BodyError(f"compressed RegisterBrokerBody truncated before {what}")
        (size,) = _I32.unpack(head)
        body = stream.read(size) if size >= 0 else b""
        if size < 0 or len(body) != size:
            raise BodyError(f"compressed RegisterBrokerBody {what} length {size} is wrong")
        return body

    version = parse_data_version(load_json(chunk("dataVersion"), "dataVersion"))
    head = stream.read(4)
    if len(head) != 4:
        raise BodyError("compressed RegisterBrokerBody truncated before the topic count")
    (count,) = _I32.unpack(head)
    if count < 0:
        raise BodyError(f"compressed RegisterBrokerBody topic count {count} is negative")
    configs = {}
    for i in range(count):
        config = _encoded_topic_config(chunk(f"topic config {i}"))
        configs[config.topic_name] = config
    filters = _filter_servers(load_json(chunk("filterServerList"), "filterServerList"))
    return RegisterBrokerBody(version, configs, filters)


def _encoded_topic_config(data: bytes) -> TopicConfig:
    """TopicConfig.encode(): "<name> <read> <write> <perm> <SINGLE_TAG|MULTI_TAG>"."""
    try:
        name, read, write, perm, filter_type = data.decode("utf-8").split(" ")
        return TopicConfig(name, _queue_nums(int(read), "readQueueNums"),
                           _queue_nums(int(write), "writeQueueNums"), int(perm),
                           _filter_type(filter_type, f"topic {name}"))
    except (UnicodeDecodeError, ValueError):
        raise BodyError(f"compressed RegisterBrokerBody has a malformed topic config {data[:80]!r}") from None


# -- encoders ----------------------------------------------------------------------------------------

def _data_version(version: DataVersion) -> dict[str, int]:
    return {"counter": version.counter, "timestamp": version.timestamp}


def encode_data_version(version: DataVersion) -> bytes:
    return fastjson.dumps(_data_version(version))


def encode_topic_route(route: TopicRoute, order_topic_conf: str | None) -> bytes:
    body: dict[str, Any] = {"brokerDatas": [b.to_json() for b in route.broker_datas],
                            "filterServerTable": route.filter_server_table}
    if order_topic_conf is not None:
        body["orderTopicConf"] = order_topic_conf
    body["queueDatas"] = [q.to_json() for q in route.queue_datas]
    return fastjson.dumps(body)


def encode_cluster_info(brokers: Mapping[str, BrokerData], clusters: Mapping[str, Iterable[str]]) -> bytes:
    return fastjson.dumps({"brokerAddrTable": {name: b.to_json() for name, b in brokers.items()},
                           "clusterAddrTable": {c: sorted(names) for c, names in clusters.items()}})


def encode_topic_list(topics: Iterable[str]) -> bytes:
    return fastjson.dumps({"topicList": list(topics)})


def encode_kv_table(table: Mapping[str, str]) -> bytes:
    return fastjson.dumps({"table": dict(table)})
