"""Property tests of the frame decoder: any input gives valid commands or a FrameError, nothing else."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smartgo.net.codes import FLAG_COMPRESSED, FLAG_SMARTGO, SerializeType
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import FrameError
from smartgo.net.frame import FrameDecoder, encode_frame

pytestmark = pytest.mark.usefixtures("each_codec")    # the C codec and the Python one alike

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
TEXT = st.text(max_size=40)
MAX_FRAME = 64 * 1024

commands = st.builds(
    RemotingCommand,
    code=st.integers(-(1 << 15), (1 << 15) - 1),
    language=st.integers(0, 12),
    version=st.integers(-(1 << 15), (1 << 15) - 1),
    opaque=INT32,
    flag=INT32.map(lambda f: f & ~(FLAG_COMPRESSED | FLAG_SMARTGO)),
    remark=st.none() | TEXT.filter(bool),
    ext_fields=st.none() | st.dictionaries(st.text(min_size=1, max_size=10), TEXT, max_size=6),
    body=st.none() | st.binary(min_size=1, max_size=300),
    serialize_type=st.sampled_from(list(SerializeType)),
)


def _valid(cmd: object) -> None:
    """What "not garbage" means: every field has its wire type and range."""
    assert isinstance(cmd, RemotingCommand)
    for value in (cmd.code, cmd.version, cmd.opaque, cmd.flag):
        assert type(value) is int and -(1 << 31) <= value < (1 << 31)
    assert type(cmd.language) is int or isinstance(cmd.language, int)
    assert cmd.remark is None or type(cmd.remark) is str
    assert cmd.ext_fields is None or all(type(k) is str and type(v) is str for k, v in cmd.ext_fields.items())
    assert cmd.body is None or (type(cmd.body) is bytes and 0 < len(cmd.body) <= MAX_FRAME)
    assert cmd.serialize_type in (0, 1, 2)
    assert cmd.flag & (FLAG_COMPRESSED | FLAG_SMARTGO) != FLAG_COMPRESSED | FLAG_SMARTGO


def _feed_in_chunks(data: bytes, cuts: list[int]) -> list[RemotingCommand]:
    decoder = FrameDecoder(max_frame=MAX_FRAME)
    out: list[RemotingCommand] = []
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    try:
        for start, end in zip(points, points[1:]):
            out += decoder.feed(data[start:end])
    except FrameError as exc:
        assert exc.reason
    assert decoder.buffered <= MAX_FRAME + 4
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000), st.lists(st.integers(0, 2000), max_size=8))
def test_random_bytes_never_escape_as_anything_but_frame_error(data: bytes, cuts: list[int]) -> None:
    for cmd in _feed_in_chunks(data, cuts):
        _valid(cmd)


@settings(max_examples=300, deadline=None)
@given(st.lists(commands, min_size=1, max_size=4), st.lists(st.integers(0, 5000), max_size=10))
def test_valid_frames_round_trip_in_any_chunking(cmds: list[RemotingCommand], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(c) for c in cmds)
    out = _feed_in_chunks(stream, cuts)
    assert len(out) == len(cmds)
    for sent, got in zip(cmds, out):
        _valid(got)
        assert (got.code, got.opaque, got.flag, got.remark, got.serialize_type) == \
            (sent.code, sent.opaque, sent.flag, sent.remark, sent.serialize_type)
        if sent.serialize_type == SerializeType.ROCKETMQ:  # its length-0 map reads back as null, as in Java
            assert (got.ext_fields or None) == (sent.ext_fields or None)
        else:
            assert got.ext_fields == sent.ext_fields
        assert got.body == sent.body


@settings(max_examples=400, deadline=None)
@given(commands, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
       st.lists(st.integers(0, 5000), max_size=5))
def test_mutated_frames_give_valid_commands_or_frame_error(cmd: RemotingCommand, flips: list[tuple[int, int]],
                                                           cuts: list[int]) -> None:
    frame = bytearray(encode_frame(cmd) * 2)
    for pos, value in flips:
        frame[pos % len(frame)] = value
    for got in _feed_in_chunks(bytes(frame), cuts):
        _valid(got)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF), st.binary(max_size=64))
def test_arbitrary_length_words(length: int, mark: int, rest: bytes) -> None:
    for got in _feed_in_chunks(struct.pack(">II", length, mark) + rest, []):
        _valid(got)
