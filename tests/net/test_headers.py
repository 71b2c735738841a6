"""Header codecs against the byte layouts of reference section A, and RemotingCommand helpers."""

from __future__ import annotations

import json
import struct

import msgpack
import pytest

from smartgo.net.codes import (CURRENT_VERSION, FLAG_RESPONSE, LanguageCode, RequestCode,
                               ResponseCode, SerializeType)
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import HeaderError, HeaderFieldError
from smartgo.net.headers import (decode_binary_header, decode_header, decode_json_header,
                                 decode_msgpack_header, encode_binary_header, encode_header,
                                 encode_json_header)

SEND_V2 = {"a": "PG", "b": "TopicTest", "c": "TBW102", "d": "4", "e": "1", "f": "0",
           "g": "1700000000123", "h": "0", "i": "TAGS\x01TagA\x02UNIQ_KEY\x01ABC", "j": "0",
           "k": "false", "m": "false"}


def test_codes_match_the_reference_tables() -> None:
    assert (RequestCode.SEND_MESSAGE_V2, RequestCode.REGISTER_BROKER, RequestCode.QUERY_DATA_VERSION,
            RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, RequestCode.GET_TOPICS_BY_CLUSTER) == (310, 103, 322, 326, 224)
    assert (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, ResponseCode.TOPIC_NOT_EXIST,
            ResponseCode.QUERY_NOT_FOUND, ResponseCode.FLOW_CONTROL, ResponseCode.NO_MESSAGE) == (3, 17, 22, 215, 208)
    assert [c.name for c in LanguageCode][:4] == ["JAVA", "CPP", "DOTNET", "PYTHON"]
    assert LanguageCode.GO == 9 and LanguageCode.RUST == 12


def test_json_header_is_compact_alphabetical_fastjson() -> None:
    cmd = RemotingCommand(105, LanguageCode.JAVA, 409, 7, 0, None, {"topic": "T"})
    assert encode_json_header(cmd) == (
        b'{"code":105,"extFields":{"topic":"T"},"flag":0,"language":"JAVA","opaque":7,'
        b'"serializeTypeCurrentRPC":"JSON","version":409}')
    # remark and extFields are left out when null, like fastjson
    bare = RemotingCommand(0, LanguageCode.GO, 317, 1, FLAG_RESPONSE)
    assert encode_json_header(bare) == (
        b'{"code":0,"flag":1,"language":"GO","opaque":1,"serializeTypeCurrentRPC":"JSON","version":317}')
    with_remark = RemotingCommand(1, remark='boom "x"\n', ext_fields={})
    parsed = json.loads(encode_json_header(with_remark))
    assert parsed["remark"] == 'boom "x"\n' and parsed["extFields"] == {}
    assert list(parsed) == sorted(parsed)


def test_json_ext_values_are_always_written_as_strings() -> None:
    cmd = RemotingCommand(310, ext_fields={"queueId": 3, "unitMode": True, "batch": False, "skip": None,
                                           "ratio": 1.5})
    ext = json.loads(encode_json_header(cmd))["extFields"]
    assert ext == {"queueId": "3", "unitMode": "true", "batch": "false", "ratio": "1.5"}
    assert all(isinstance(v, str) for v in ext.values())


def test_json_decode_of_a_java_header() -> None:
    raw = (b'{"code":34,"extFields":{"bname":"broker-a"},"flag":0,"language":"JAVA","opaque":7,'
           b'"serializeTypeCurrentRPC":"JSON","version":409}')
    cmd = decode_json_header(raw)
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag) == (34, LanguageCode.JAVA, 409, 7, 0)
    assert cmd.ext_fields == {"bname": "broker-a"} and cmd.remark is None
    assert cmd.serialize_type == SerializeType.JSON


def test_json_decode_accepts_ali_ons_raw_values() -> None:
    raw = (b'{"code":310,"language":"JAVA","version":121,"opaque":3,"flag":0,'
           b'"extFields":{"a":"G","e":0,"g":1690000000000,"k":false,"x":null,"r":2.5,"o":{"p":1}}}')
    cmd = decode_json_header(raw)
    assert cmd.ext_fields == {"a": "G", "e": "0", "g": "1690000000000", "k": "false", "r": "2.5",
                              "o": '{"p":1}'}
    assert cmd.ext_int("g") == 1690000000000 and cmd.ext_bool("k") is False


def test_json_decode_tolerates_unknown_language_and_whitespace() -> None:
    cmd = decode_json_header(b' { "code" : 1 , "language" : "KOTLIN" } ')
    assert cmd.code == 1 and cmd.language == LanguageCode.OTHER and cmd.opaque == 0


@pytest.mark.parametrize("raw, fragment", [
    (b"", "undecodable"),
    (b"{", "undecodable"),
    (b'{"code":1} trailing', "undecodable"),
    (b"\xff\xfe", "undecodable"),
    (b"[1,2]", "not an object"),
    (b'{"opaque":1}', "code"),
    (b'{"code":"10"}', "code"),
    (b'{"code":true}', "code"),
    (b'{"code":1,"opaque":4294967296}', "opaque"),
    (b'{"code":1,"flag":1.5}', "flag"),
    (b'{"code":1,"remark":5}', "remark"),
    (b'{"code":1,"language":[]}', "language"),
    (b'{"code":1,"extFields":[1]}', "extFields"),
])
def test_json_decode_rejects_malformed_headers(raw: bytes, fragment: str) -> None:
    with pytest.raises(HeaderError, match=fragment):
        decode_json_header(raw)


def _java_binary(code: int, lang: int, version: int, opaque: int, flag: int, remark: bytes,
                 ext: list[tuple[bytes, bytes]]) -> bytes:
    """RocketMQSerializable.rocketMQProtocolEncode, written out from reference A.3."""
    ext_bytes = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v for k, v in ext)
    return (struct.pack(">hbhii", code, lang, version, opaque, flag) + struct.pack(">i", len(remark)) + remark
            + struct.pack(">i", len(ext_bytes)) + ext_bytes)


def test_binary_header_matches_the_java_layout() -> None:
    expected = _java_binary(105, 0, 409, 7, 2, b"r\xc3\xa9", [(b"topic", b"T"), (b"k", b"")])
    cmd = RemotingCommand(105, LanguageCode.JAVA, 409, 7, 2, "ré", {"topic": "T", "k": ""},
                          serialize_type=SerializeType.ROCKETMQ)
    assert encode_binary_header(cmd) == expected
    back = decode_binary_header(expected)
    assert (back.code, back.language, back.version, back.opaque, back.flag, back.remark) == (105, 0, 409, 7, 2, "ré")
    assert back.ext_fields == {"topic": "T", "k": ""}
    empty = decode_binary_header(_java_binary(0, 9, 317, 1, 1, b"", []))
    assert empty.remark is None and empty.ext_fields is None and empty.language == LanguageCode.GO


@pytest.mark.parametrize("raw", [
    b"\x00" * 20,                                                            # shorter than the fixed part
    struct.pack(">hbhii", 1, 0, 1, 1, 0) + struct.pack(">i", 999),           # remark longer than header
    struct.pack(">hbhii", 1, 0, 1, 1, 0) + struct.pack(">i", -5) + struct.pack(">i", 0),
    _java_binary(1, 0, 1, 1, 0, b"", [])[:-4] + struct.pack(">i", 64),       # ext longer than header
    _java_binary(1, 0, 1, 1, 0, b"", [(b"k", b"v")])[:-1],                   # truncated value
    struct.pack(">hbhii", 1, 0, 1, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", 3) + b"\xff\xff\x00",
    _java_binary(1, 0, 1, 1, 0, b"\xff", []),                                # remark not UTF-8
])
def test_binary_decode_rejects_lengths_beyond_the_header(raw: bytes) -> None:
    with pytest.raises(HeaderError):
        decode_binary_header(raw)


def test_msgpack_round_trip_and_rejections() -> None:
    cmd = RemotingCommand(310, LanguageCode.PYTHON, CURRENT_VERSION, 99, 0, "x", dict(SEND_V2),
                          serialize_type=SerializeType.MSGPACK)
    back = decode_msgpack_header(encode_header(cmd))
    assert (back.code, back.opaque, back.remark, back.ext_fields) == (310, 99, "x", SEND_V2)
    for bad in (b"\xc1", msgpack.packb({"code": 1}), msgpack.packb([1, 2, 3]),
                msgpack.packb([1, 0, 0, 0, 0, None, {1: "x"}]), msgpack.packb(["1", 0, 0, 0, 0, None, None]),
                msgpack.packb([1, 0, 0, 0, 0, None, {"k": b"bytes"}])):
        with pytest.raises(HeaderError):
            decode_msgpack_header(bad)


@pytest.mark.parametrize("stype", list(SerializeType))
def test_every_codec_round_trips_a_send_header(stype: SerializeType) -> None:
    cmd = RemotingCommand(310, LanguageCode.JAVA, 409, 123456, 0, None, dict(SEND_V2), serialize_type=stype)
    back = decode_header(stype, encode_header(cmd))
    assert back.ext_fields == SEND_V2 and back.code == 310 and back.opaque == 123456
    assert back.serialize_type == stype


def test_unknown_serialize_type() -> None:
    with pytest.raises(HeaderError, match="serialize type 7"):
        decode_header(7, b"{}")
    with pytest.raises(ValueError):
        encode_header(RemotingCommand(1, serialize_type=9))


def test_make_response_and_typed_accessors() -> None:
    req = RemotingCommand(105, opaque=42, ext_fields={"topic": "T", "n": "12", "neg": "-3", "b": "TRUE",
                                                     "bad": "1x"}, serialize_type=SerializeType.ROCKETMQ)
    resp = req.make_response(ResponseCode.TOPIC_NOT_EXIST, "no route", {"x": "1"})
    assert (resp.opaque, resp.serialize_type, resp.is_response, resp.code) == (42, SerializeType.ROCKETMQ, True, 17)
    assert not req.is_response and not req.is_oneway
    assert req.ext_str("topic") == "T" and req.ext_int("n") == 12 and req.ext_int("neg") == -3
    assert req.ext_bool("b") is True and req.ext_int("missing", None) is None
    assert req.ext_str("missing", "dflt") == "dflt" and req.ext_bool("missing", False) is False
    with pytest.raises(HeaderFieldError, match="the custom field queueId is null") as info:
        req.ext_int("queueId")
    assert info.value.field == "queueId"
    with pytest.raises(HeaderFieldError, match="bad is not an integer"):
        req.ext_int("bad")
    with pytest.raises(HeaderFieldError, match="the custom field topic is null"):
        RemotingCommand(105).ext_str("topic")


def test_body_bytes_joins_buffers() -> None:
    assert RemotingCommand(0, body=[b"ab", memoryview(b"cd"), bytearray(b"e")]).body_bytes() == b"abcde"
    assert RemotingCommand(0).body_bytes() == b""
