"""Sans-IO framing: layout, reassembly, limits, zero-copy bodies and SmartGo compression."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from smartgo.net.codes import FLAG_COMPRESSED, FLAG_RESPONSE, FLAG_SMARTGO, SerializeType
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import FrameError
from smartgo.net.frame import FrameDecoder, encode_command, encode_frame

pytestmark = pytest.mark.usefixtures("each_codec")    # the C codec and the Python one alike


def _cmd(body: object = b"hello", stype: int = SerializeType.JSON) -> RemotingCommand:
    return RemotingCommand(310, opaque=5, ext_fields={"b": "T"}, body=body, serialize_type=stype)  # type: ignore[arg-type]


def _frame(stype: int, header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


@pytest.mark.parametrize("stype", list(SerializeType))
def test_frame_layout(stype: SerializeType) -> None:
    frame = encode_frame(_cmd(stype=stype))
    total, mark = struct.unpack_from(">II", frame)
    header_len = mark & 0xFFFFFF
    assert total == len(frame) - 4
    assert mark >> 24 == stype
    assert frame[8 + header_len:] == b"hello"
    assert total == 4 + header_len + 5


def test_decoder_reassembles_byte_by_byte_and_splits_batches() -> None:
    frames = [encode_frame(_cmd(b"x" * n, st)) for n, st in ((0, 0), (1, 1), (300, 2), (70000, 0))]
    stream = b"".join(frames)
    decoder = FrameDecoder()
    out = []
    for i in range(len(stream)):
        out += decoder.feed(stream[i:i + 1])
    assert [len(c.body or b"") for c in out] == [0, 1, 300, 70000]
    assert out[0].body is None and [c.serialize_type for c in out] == [0, 1, 2, 0]
    assert decoder.buffered == 0
    batch = decoder.feed(stream * 3)
    assert len(batch) == 12 and all(isinstance(c.body, (bytes, type(None))) for c in batch)
    part = decoder.feed(stream[:-10])
    assert len(part) == 3 and decoder.buffered > 0
    assert len(decoder.feed(stream[-10:])) == 1


def test_oversized_length_is_rejected_from_its_four_bytes() -> None:
    decoder = FrameDecoder(max_frame=1024)
    with pytest.raises(FrameError, match="exceeds the limit of 1024"):
        decoder.feed(struct.pack(">I", 1025))
    with pytest.raises(FrameError, match="already failed"):
        decoder.feed(encode_frame(_cmd()))
    assert decoder.buffered == 0


@pytest.mark.parametrize("data, fragment", [
    (struct.pack(">I", 0x7FFFFFFF), "exceeds"),
    (struct.pack(">I", 0xFFFFFFFF), "exceeds"),
    (struct.pack(">I", 3) + b"abc", "shorter"),
    (struct.pack(">II", 10, 7), "does not fit"),                     # header length 7 > 10 - 4
    (struct.pack(">II", 10, (5 << 24) | 2), "serialize type 5"),
    (_frame(0, b"{not json"), "undecodable JSON"),
    (_frame(0, b'{"flag":0}'), "code"),
    (_frame(1, b"\x00\x01"), "too short"),
    (_frame(2, b"\x93\x01\x02\x03"), "7-item"),
])
def test_decoder_rejects_impossible_frames(data: bytes, fragment: str) -> None:
    with pytest.raises(FrameError, match=fragment) as info:
        FrameDecoder(max_frame=1 << 20).feed(data)
    assert fragment.split()[0] in info.value.reason


def test_encode_passes_body_buffers_through_without_copy() -> None:
    big = memoryview(bytearray(b"z" * 100_000))
    parts = [memoryview(b"head"), big]
    buffers = encode_command(_cmd(parts))
    assert buffers[1] is parts[0] and buffers[2] is big
    total = struct.unpack_from(">I", buffers[0])[0]
    assert total + 4 == sum(len(b) if not isinstance(b, memoryview) else b.nbytes for b in buffers)
    decoded = FrameDecoder().feed(b"".join(bytes(b) for b in buffers))[0]
    assert decoded.body == b"head" + b"z" * 100_000
    single = encode_command(_cmd(big))
    assert single[1] is big


def test_compression_sets_the_flag_and_round_trips() -> None:
    body = b"abcdefgh" * 10_000
    cmd = _cmd(body)
    plain = encode_frame(cmd)
    packed = encode_frame(cmd, compress_threshold=4096)
    assert len(packed) < len(plain) // 10
    header = FrameDecoder().feed(packed)[0]
    assert header.body == body and not header.flag & FLAG_COMPRESSED
    wire_flag = json.loads(packed[8:8 + (struct.unpack_from(">I", packed, 4)[0] & 0xFFFFFF)])["flag"]
    assert wire_flag & FLAG_COMPRESSED
    assert cmd.body is body and not cmd.flag & FLAG_COMPRESSED          # the caller's command is untouched
    assert encode_frame(_cmd(b"x" * 100), compress_threshold=4096) == encode_frame(_cmd(b"x" * 100))
    noise = bytes(range(256)) * 40 + zlib.compress(b"seed")               # incompressible: sent plain
    assert not FrameDecoder().feed(encode_frame(_cmd(noise), compress_threshold=1024))[0].flag & FLAG_COMPRESSED


SMARTGO_ZIP = b'{"code":1,"flag":%d}' % (FLAG_COMPRESSED | FLAG_SMARTGO)


def test_compressed_body_limits() -> None:
    bomb = zlib.compress(b"\0" * (2 << 20), 9)
    frame = _frame(0, SMARTGO_ZIP, bomb)
    with pytest.raises(FrameError, match="beyond the limit"):
        FrameDecoder(max_frame=1 << 20).feed(frame)
    with pytest.raises(FrameError, match="does not inflate"):
        FrameDecoder().feed(_frame(0, SMARTGO_ZIP, b"garbage"))
    with pytest.raises(FrameError, match="truncated"):
        FrameDecoder().feed(_frame(0, SMARTGO_ZIP, zlib.compress(b"x" * 999)[:-6]))
    with pytest.raises(FrameError, match="empty body"):
        FrameDecoder().feed(_frame(0, SMARTGO_ZIP))
    # A foreign frame that happens to set bit 2 is left alone: body and flag as sent.
    foreign = FrameDecoder().feed(_frame(0, b'{"code":1,"flag":%d}' % FLAG_COMPRESSED, b"raw"))[0]
    assert foreign.body == b"raw" and foreign.flag == FLAG_COMPRESSED


def test_response_flag_survives_framing() -> None:
    cmd = RemotingCommand(0, opaque=9, flag=FLAG_RESPONSE, remark="ok")
    back = FrameDecoder().feed(encode_frame(cmd, extra_flags=8))[0]
    assert back.is_response and back.flag == FLAG_RESPONSE | 8 and back.remark == "ok"
