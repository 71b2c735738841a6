"""The C codec (smartgo.net._codec) against the Python one it accelerates: the same commands,
field types and errors for any input, garbled or not, and the same bytes out."""

from __future__ import annotations

import json
import struct
import zlib

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smartgo import accel
from smartgo.net import frame
from smartgo.net.codes import FLAG_COMPRESSED, FLAG_SMARTGO, LanguageCode, SerializeType
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import FrameError
from smartgo.net.frame import FrameDecoder, encode_command, encode_frame

MAX_FRAME = 1 << 18
INT = st.one_of(st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 70), 1 << 70),
                st.sampled_from([0, 1, -1, 127, 128, 255, 256, -32, -33, -128, -129, 65535, 65536,
                                 -(1 << 31), (1 << 31) - 1, 1 << 31, 1 << 32, -(1 << 63), (1 << 64) - 1]))
TEXT = st.text(max_size=40) | st.sampled_from(["", "TAGS\x01a\x02KEYS\x01b", "\ud800", "\U0001F600é", "\x7f\x00"])
VALUE = TEXT | st.integers(-10, 10) | st.booleans() | st.none() | st.floats(allow_nan=False) | st.binary(max_size=4)


def commands(values=TEXT) -> st.SearchStrategy[RemotingCommand]:
    return st.builds(
        RemotingCommand,
        code=INT, language=st.sampled_from([0, 3, 9, 12, 200, LanguageCode.PYTHON, -1]), version=INT, opaque=INT,
        flag=INT.map(lambda f: f & ~FLAG_COMPRESSED), remark=st.none() | TEXT,
        ext_fields=st.none() | st.dictionaries(TEXT, values, max_size=6),
        body=st.none() | st.binary(min_size=1, max_size=100),
        serialize_type=st.sampled_from([SerializeType.JSON, SerializeType.MSGPACK, SerializeType.ROCKETMQ]))


def outcome(codec: str, data: bytes, cuts: list[int] = ()) -> list:
    """What a decoder of `codec` makes of data fed in pieces: each command's fields with their
    exact types, then the error, if any."""
    frame.use_codec(codec)
    try:
        decoder = FrameDecoder(max_frame=MAX_FRAME)
        points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
        got: list = []
        try:
            for start, end in zip(points, points[1:]):
                got += [fields(c) for c in decoder.feed(data[start:end])]
        except FrameError as exc:
            got.append((type(exc), exc.reason))
        got.append(decoder.buffered)
        return got
    finally:
        frame.use_codec("c")


def fields(cmd: RemotingCommand) -> tuple:
    ext = None if cmd.ext_fields is None else [(type(k), k, type(v), v) for k, v in cmd.ext_fields.items()]
    return tuple((type(v), v) for v in (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark,
                                        cmd.body, cmd.serialize_type)) + (type(cmd.ext_fields), ext)


def same(data: bytes, cuts: list[int] = ()) -> list:
    c = outcome("c", data, cuts)
    assert c == outcome("python", data, cuts)
    return c


def encoded(codec: str, cmd: RemotingCommand, extra: int) -> object:
    frame.use_codec(codec)
    try:
        return b"".join(encode_command(cmd, extra))
    except Exception as exc:  # noqa: BLE001 - the comparison is the point: the same error either way
        return type(exc), str(exc)
    finally:
        frame.use_codec("c")


def frame_of(stype: int, header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


def test_the_c_codec_is_built_and_in_use():
    """The install builds it (gcc and the Python headers are on every machine this project runs
    on); the suite runs on it unless SMARTGO_PURE_PYTHON says otherwise."""
    assert frame._codec is not None, "smartgo.net._codec was not built: see the pip install output"
    assert frame.codec_in_use() == ("c" if accel.ENABLED else "python")


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(commands(VALUE), min_size=1, max_size=3), st.sampled_from([0, FLAG_SMARTGO]))
def test_same_bytes_out(cmds: list[RemotingCommand], extra: int) -> None:
    for cmd in cmds:
        assert encoded("c", cmd, extra) == encoded("python", cmd, extra)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(commands(), min_size=1, max_size=4), st.lists(st.integers(0, 3000), max_size=6))
def test_same_commands_in_for_valid_frames(cmds: list[RemotingCommand], cuts: list[int]) -> None:
    stream = b""
    for cmd in cmds:
        try:
            stream += encode_frame(cmd)
        except (ValueError, OverflowError, struct.error, UnicodeEncodeError):
            continue
    got = same(stream, cuts)
    assert len(got) >= 1


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands(), st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), min_size=1, max_size=4),
       st.lists(st.integers(0, 3000), max_size=4))
def test_same_outcome_for_mutated_frames(cmd: RemotingCommand, flips: list[tuple[int, int]], cuts: list[int]) -> None:
    try:
        data = bytearray(encode_frame(cmd) * 2)
    except (ValueError, OverflowError, struct.error, UnicodeEncodeError):
        return
    for pos, value in flips:
        data[pos % len(data)] = value
    same(bytes(data), cuts)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600), st.lists(st.integers(0, 600), max_size=4))
def test_same_outcome_for_random_bytes(data: bytes, cuts: list[int]) -> None:
    same(data, cuts)
    same(frame_of(SerializeType.JSON, data))
    same(frame_of(SerializeType.MSGPACK, data))


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False)
                           | TEXT, lambda kids: st.lists(kids, max_size=2) | st.dictionaries(TEXT, kids, max_size=2),
                           max_leaves=4)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["code", "language", "version", "opaque", "flag", "remark", "extFields",
                                        "serializeTypeCurrentRPC", "other"]),
                       JSON_VALUES | st.dictionaries(TEXT, JSON_VALUES, max_size=4), max_size=8),
       st.booleans(), st.booleans(), st.sampled_from(["", " ", "\n\t", "\ufeff"]))
def test_same_outcome_for_any_json_header(obj: dict, ascii_only: bool, spaced: bool, pad: str) -> None:
    text = json.dumps(obj, ensure_ascii=ascii_only, separators=(", ", " : ") if spaced else (",", ":"))
    same(frame_of(SerializeType.JSON, (pad + text + pad).encode("utf-8", "surrogatepass"), b"body"))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.none() | st.booleans() | INT | TEXT | st.binary(max_size=3) | st.floats(allow_nan=False)
                | st.dictionaries(TEXT | st.integers(0, 3), VALUE, max_size=4), min_size=6, max_size=8),
       st.binary(max_size=2))
def test_same_outcome_for_any_msgpack_header(items: list, trailing: bytes) -> None:
    try:
        header = msgpack.packb(items, use_bin_type=True, unicode_errors="surrogatepass") + trailing
    except (OverflowError, UnicodeEncodeError):
        return
    same(frame_of(SerializeType.MSGPACK, header))


@pytest.mark.parametrize("text", [
    '{"code":310,"extFields":{"a":"x\\u0001y\\u0002","b":"\\"\\\\\\/\\b\\f\\n\\r\\t"},"flag":0,"language":"JAVA",'
    '"opaque":1,"serializeTypeCurrentRPC":"JSON","version":399}',
    '{"code":1,"extFields":{"n":12,"m":-0,"t":true,"f":false,"z":null,"x":"y"}}', '{"code":1,"extFields":{"m":-0}}',
    '{"code":1,"extFields":{"big":123456789012345678901234}}', '{"code":1,"extFields":{"n":123456789012345678}}',
    '{"code":1,"extFields":{"a":"1","a":null}}', '{"code":1,"code":2,"remark":"x","remark":null}',
    '{"code":1,"extFields":{"a":1.5}}', '{"code":1,"extFields":{"a":[1]}}', '{"code":1,"extFields":"x"}',
    '{"code":1,"language":"NOPE"}', '{"code":1,"language":3}', '{"code":1,"language":null}',
    '{"code":1,"language":true}', '{"code":true}', '{"code":1.0}', '{"code":01}', '{"code":-}',
    '{"code":2147483648}', '{"code":-2147483649}', '{"opaque":1}', '{}', '[]', '{"code":1}x', ' {"code":1} ',
    '{"code":1,"remark":"\\ud83d\\ude00"}', '{"code":1,"remark":"\\ud83d"}', '{"code":1,"remark":"\\x"}',
    '{"code":1,"remark":"\\u12"}', '{"code":1,"remark":"a\tb"}', '{"code":1,"remark":"a\x1fb"}',
    '{"code":1,"remark":"a\x00"}', '{"code":1,"remark":"a\x7f\x20"}', '{"code":1,"remark":"\\u0000\\u00e9\\u20ac"}',
    '{"code":1,"remark":"\xe9"}', '{"code":1,"other":{"x":1}}', '{"code":1,"other":NaN}', '{"code":1,}',
    '{"code":1 "flag":2}', '{"c\\u006fde":7}', '{"code":1,"extFields":{}}', '{"code":1,"extFields":{"a":"b",}}',
])
def test_same_outcome_for_json_edge_cases(text: str) -> None:
    same(frame_of(SerializeType.JSON, text.encode("utf-8", "surrogatepass")))


def test_same_outcome_for_invalid_utf8_in_json() -> None:
    for raw in (b'{"code":1,"remark":"\xff"}', b'{"code":1,"extFields":{"a":"\xc3\\u00e9"}}',
                b'{"code":1,"other":"\xed\xa0\x80"}', b'{"code":1}\xff'):
        same(frame_of(SerializeType.JSON, raw))


@pytest.mark.parametrize("header", [
    bytes([0x97, 0xcd, 0x01, 0x36, 0x00, 0x01, 0x02, 0x03, 0xc0, 0xc0]),                  # uint16 code
    bytes([0x97, 0xd3]) + (1 << 40).to_bytes(8, "big") + bytes([0, 0, 0, 0, 0xc0, 0xc0]),   # int64 out of int32
    bytes([0x97, 0xcf]) + ((1 << 64) - 1).to_bytes(8, "big") + bytes([0, 0, 0, 0, 0xc0, 0xc0]),
    bytes([0x97, 0x01, 0xa4]) + b"JAVA" + bytes([0, 0, 0, 0xc0, 0xc0]),                     # language by name
    bytes([0x97, 0x01, 0xcf]) + ((1 << 64) - 1).to_bytes(8, "big") + bytes([0, 0, 0, 0xc0, 0xc0]),
    bytes([0x97, 0x01, 0x00, 0x00, 0x00, 0x00, 0xc0, 0xde, 0x00, 0x01, 0xa1]) + b"k" + bytes([0xa1]) + b"v",
    bytes([0x97, 0x01, 0x00, 0x00, 0x00, 0x00, 0xc0, 0xdf, 0xff, 0xff, 0xff, 0xff]),         # a map larger than it is
    bytes([0x97, 0x01, 0x00, 0x00, 0x00, 0x00, 0xa2, 0xff, 0xfe, 0xc0]),                     # remark not UTF-8
    bytes([0x97, 0x01, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x81, 0xa1, 0x6b, 0x05]),               # an int value
    bytes([0x97, 0x01, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x81, 0x05, 0xa1, 0x76]),               # an int key
    bytes([0x97, 0x01, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x81, 0xa1, 0x6b, 0xc4, 0x01, 0x00]),   # a bin value
    bytes([0x97, 0x01, 0x00, 0x00, 0x00, 0x00, 0xc0, 0xc0, 0x00]),                           # trailing byte
    bytes([0x97, 0x01, 0x00, 0x00, 0x00, 0x00, 0xc0]),                                       # six items
    bytes([0x96, 0x01, 0x00, 0x00, 0x00, 0x00, 0xc0]), bytes([0xc3]), b"", bytes([0x97, 0xc2, 0, 0, 0, 0, 0xc0, 0xc0]),
])
def test_same_outcome_for_msgpack_edge_cases(header: bytes) -> None:
    same(frame_of(SerializeType.MSGPACK, header, b"xy"))


def test_compressed_bodies_and_their_errors_alike() -> None:
    body = b"hello " * 100
    ok = RemotingCommand(1, flag=FLAG_COMPRESSED | FLAG_SMARTGO, body=zlib.compress(body),
                         serialize_type=SerializeType.MSGPACK)
    got = same(encode_frame(ok))
    assert got[0][6] == (bytes, body) and got[0][4] == (int, FLAG_SMARTGO)
    for bad in (b"not zlib", zlib.compress(body)[:-3], None, zlib.compress(b"x" * (MAX_FRAME + 1))):
        for stype in (SerializeType.MSGPACK, SerializeType.JSON, SerializeType.ROCKETMQ):
            cmd = RemotingCommand(1, flag=FLAG_COMPRESSED | FLAG_SMARTGO, body=bad, serialize_type=stype)
            assert isinstance(same(encode_frame(cmd))[0][0], type) and \
                issubclass(same(encode_frame(cmd))[0][0], FrameError)


@pytest.mark.parametrize("data, reason", [
    (struct.pack(">I", MAX_FRAME + 1), f"frame length {MAX_FRAME + 1} exceeds the limit of {MAX_FRAME} bytes"),
    (struct.pack(">I", 3), "frame length 3 is shorter than the header-length field"),
    (struct.pack(">II", 0xFFFFFFFF, 0), f"frame length {0xFFFFFFFF} exceeds the limit of {MAX_FRAME} bytes"),
    (struct.pack(">II", 8, 7 << 24), "unknown serialize type 7"),
    (struct.pack(">II", 8, 5), "header length 5 does not fit in frame length 8"),
    (struct.pack(">II", 12, 2 << 24 | 3) + b"\x97", None),          # incomplete: kept for the next read
])
def test_lengths_and_types_refused_alike(data: bytes, reason: str | None) -> None:
    got = same(data)
    assert got == ([(FrameError, reason), 0] if reason else [len(data)])


def test_the_broker_send_frames_decode_alike() -> None:
    """The sync benchmark's frames, both header types, several to a buffer, split anywhere."""
    from tests.support.broker import send_command, uniq_key
    stream = b""
    for stype, extra in ((SerializeType.MSGPACK, FLAG_SMARTGO), (SerializeType.JSON, 0)):
        cmd = send_command("Bench", b"b" * 128, queue_id=3, uniq=uniq_key())
        cmd.serialize_type, cmd.opaque = stype, 77
        stream += encode_frame(cmd, extra) + encode_frame(cmd.make_response(0, None, {"msgId": "7F", "queueId": "3"}))
    got = same(stream, [5, 100, 301, 302])
    assert len(got) == 5 and got[0][7] == (SerializeType, SerializeType.MSGPACK)


LENGTHS = [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]
CHARS = ["\x00", "\x1f", " ", "~", "\x7f", "\x80", "\u07ff", "\u0800", "\uffff", "\U00010000", "\U0010ffff",
         '"', "\\", "\b", "\f", "\n", "\r", "\t", "/"]


@pytest.mark.parametrize("stype", [SerializeType.MSGPACK, SerializeType.JSON])
def test_every_size_class_and_escape_alike(stype: int) -> None:
    """The boundaries where msgpack changes its length form and JSON its escape."""
    cmds = [RemotingCommand(1, remark="r" * n, serialize_type=stype) for n in LENGTHS]
    cmds += [RemotingCommand(1, ext_fields={f"k{i}": "v" for i in range(n)}, serialize_type=stype)
             for n in (14, 15, 16, 17)]
    cmds += [RemotingCommand(1, remark=f"a{c}b", ext_fields={c: c * 3}, serialize_type=stype) for c in CHARS]
    cmds += [RemotingCommand(v, 5, v, v, v & ~FLAG_COMPRESSED, serialize_type=stype) for v in
             (0, 127, 128, 255, 256, 65535, 65536, -1, -32, -33, -128, -129, -32768, -32769, (1 << 31) - 1, -(1 << 31))]
    for cmd in cmds:
        for extra in (0, FLAG_SMARTGO):
            out = encoded("c", cmd, extra)
            assert out == encoded("python", cmd, extra)
            assert same(out)[0][0] == (int, cmd.code)


def test_json_text_forms_alike() -> None:
    """Each header alone, so that one odd field does not send the whole header to the fallback."""
    for value in ("-0", "0", "-7", "123456789012345678", "1234567890123456789", "true", "false", "null", '""',
                  r'"\u0041\u00e9\u20ac\uFFFF"', r'"\ud83d\ude00"', r'"x\/y"', "1e3", "-0.0", "[]", "{}"):
        for text in ('{"code":1,"extFields":{"v":%s}}', '{"code":1,"remark":%s}', '{"code":%s}',
                     '{"code":1,"language":%s}', '{"code":1,"other":%s}', '{"code":1,"version":%s}'):
            same(frame_of(SerializeType.JSON, (text % value).encode()))


def test_common_headers_never_fall_back() -> None:
    """What clients send (a SmartGo or Java send, its reply) is decoded in C, not handed to Python."""
    from tests.support.broker import send_command, uniq_key
    fell_back = []

    def refuse(data):
        fell_back.append(bytes(data))
        raise AssertionError("fallback")

    stream = b""
    for stype in (SerializeType.MSGPACK, SerializeType.JSON):
        cmd = send_command("Bench", b"b" * 128, queue_id=3, uniq=uniq_key(), tags="TagA", keys="k1 k2")
        cmd.serialize_type, cmd.remark = stype, "é\x01"
        stream += encode_frame(cmd, FLAG_SMARTGO) + encode_frame(cmd.make_response(0, None, {"msgId": "7F"}))
    frame._configure_codec({t: refuse for t in SerializeType})
    try:
        got, used = frame._codec.split(stream, MAX_FRAME)
    finally:
        frame._configure_codec(frame.DECODERS)
    assert (len(got), used, fell_back) == (4, len(stream), [])
    assert got[0].ext_fields["b"] == "Bench" and got[2].remark == "é\x01"
