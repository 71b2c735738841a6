"""Sans-IO framing (in the style of h11): bytes in, RemotingCommands out, and back.

Frame: int32 total length (not counting itself) | serialize type (1 byte) + header length (3 bytes)
| header | body. The decoder never holds more than one partial frame, and a length over the limit
is rejected as soon as its four bytes arrive, so a peer cannot make us buffer more than max_frame.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import replace

from smartgo import accel
from smartgo.net.codes import FLAG_COMPRESSED, FLAG_SMARTGO, LanguageCode, SerializeType
from smartgo.net.command import Buffer, RemotingCommand
from smartgo.net.errors import FrameError, HeaderError
from smartgo.net.headers import LANGUAGE_BY_NAME, LANGUAGE_NAMES, DECODERS, encode_header

DEFAULT_MAX_FRAME = 16 * 1024 * 1024
#: zlib level for SmartGo body compression: level 1 keeps the CPU cost low on the hot path.
COMPRESS_LEVEL = 1

#: A body is inflated only when the frame also carries FLAG_SMARTGO: a foreign peer's frame is
#: never reinterpreted, whatever bits it sets.
_COMPRESSED_BY_SMARTGO = FLAG_COMPRESSED | FLAG_SMARTGO
_U32 = struct.Struct(">I")
_PREFIX = struct.Struct(">II")


class FrameDecoder:
    """Feed it the bytes a socket delivers; get back every complete command in order.

    After a FrameError the stream position is lost, so the decoder refuses further input: close
    the connection.
    """

    __slots__ = ("max_frame", "_buf", "_failed")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._failed: str | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf)

    def feed(self, data: Buffer) -> list[RemotingCommand]:
        if self._failed is not None:
            raise FrameError(f"decoder already failed: {self._failed}")
        buf: Buffer
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data
        try:
            out, pos = _split(buf, self.max_frame)
        except FrameError as exc:
            self._failed = exc.reason
            self._buf = bytearray()
            raise
        size = len(buf)
        if buf is self._buf:
            if pos == size:
                self._buf = bytearray()    # drop the capacity a large frame left behind
            elif pos:
                del self._buf[:pos]
        elif pos < size:
            self._buf = bytearray(memoryview(buf)[pos:])
        return out


def split_frames(buf: Buffer, max_frame: int) -> tuple[list[RemotingCommand], int]:
    """The complete frames at the start of buf and how many bytes they take (the reference of
    _codec.split). A length over max_frame raises as soon as its four bytes are there."""
    out: list[RemotingCommand] = []
    pos = 0
    size = len(buf)
    while size - pos >= 4:
        if size - pos < 8:
            (length,) = _U32.unpack_from(buf, pos)
            _check_length(length, max_frame)
            break
        length, mark = _PREFIX.unpack_from(buf, pos)
        if length > max_frame or length < 4:
            _check_length(length, max_frame)
        stype = mark >> 24
        header_len = mark & 0xFFFFFF
        decode = DECODERS.get(stype)
        if decode is None:
            raise FrameError(f"unknown serialize type {stype}")
        if header_len > length - 4:
            raise FrameError(f"header length {header_len} does not fit in frame length {length}")
        end = pos + 4 + length
        if end > size:
            break
        start = pos + 8
        body_start = start + header_len
        if type(buf) is bytes:
            cmd = decode(buf[start:body_start])
            body = buf[body_start:end] if end > body_start else None
        else:
            view = memoryview(buf)
            try:
                cmd = decode(view[start:body_start])
                body = bytes(view[body_start:end]) if end > body_start else None
            finally:
                view.release()
        cmd.body = body
        if cmd.flag & _COMPRESSED_BY_SMARTGO == _COMPRESSED_BY_SMARTGO:
            _inflate_body(cmd, max_frame)
        out.append(cmd)
        pos = end
    return out, pos


def _check_length(length: int, max_frame: int) -> None:
    if length > max_frame:
        raise FrameError(f"frame length {length} exceeds the limit of {max_frame} bytes")
    if length < 4:
        raise FrameError(f"frame length {length} is shorter than the header-length field")


class InflateError(ValueError):
    """A zlib stream refused by inflate(); the message completes "compressed <what> ..."."""


def inflate(data: Buffer, limit: int, *, whole: bool = True) -> bytes:
    """data inflated to at most `limit` bytes: the one zlib bomb guard (compressed frames here,
    REGISTER_BROKER bodies in the registry). whole: a stream cut before its end is refused too."""
    inflater = zlib.decompressobj()
    try:
        plain = inflater.decompress(data, limit)
    except zlib.error as exc:
        raise InflateError(f"does not inflate: {exc}") from None
    if inflater.unconsumed_tail:
        raise InflateError(f"inflates beyond the limit of {limit} bytes")
    if whole and not inflater.eof:
        raise InflateError("is truncated")
    return plain


def _inflate_body(cmd: RemotingCommand, max_frame: int) -> None:
    """A SmartGo peer's compressed body, inflated in place (at most max_frame bytes)."""
    cmd.flag &= ~FLAG_COMPRESSED
    body = cmd.body
    if not body:
        raise HeaderError("compressed flag set on an empty body")
    try:
        cmd.body = inflate(body, max_frame)  # type: ignore[arg-type]  # a decoded frame's body is one buffer
    except InflateError as exc:
        raise HeaderError(f"compressed body {exc}") from None


def _size(buf: Buffer) -> int:
    return buf.nbytes if type(buf) is memoryview else len(buf)


def encode_command(cmd: RemotingCommand, extra_flags: int = 0, compress_threshold: int = 0) -> list[Buffer]:
    """The buffers of one frame, for a single transport.writelines: [prefix + header, *body].

    Body buffers are passed through untouched (no copy). With compress_threshold > 0 a body at
    least that large is zlib-compressed and FLAG_COMPRESSED | FLAG_SMARTGO set; only do that
    towards a SmartGo peer.
    """
    body = cmd.body
    if body is None:
        bodies: Sequence[Buffer] = ()
        body_len = 0
    elif isinstance(body, (bytes, bytearray, memoryview)):
        bodies = (body,)
        body_len = _size(body)
    else:
        bodies = body
        body_len = sum(map(_size, body))
    if compress_threshold and body_len >= compress_threshold:
        packed = zlib.compress(cmd.body_bytes(), COMPRESS_LEVEL)
        if len(packed) < body_len:
            cmd = replace(cmd, flag=cmd.flag | _COMPRESSED_BY_SMARTGO, body=packed)
            bodies = (packed,)
            body_len = len(packed)
    if _head is not None:
        head = _head(cmd, extra_flags, body_len)
        if head is not None:
            return [head, *bodies]
    header = encode_header(cmd, extra_flags)
    header_len = len(header)
    if header_len > 0xFFFFFF:
        raise ValueError(f"header of {header_len} bytes does not fit the 24-bit header length")
    prefix = _PREFIX.pack(4 + header_len + body_len, (cmd.serialize_type << 24) | header_len)
    return [prefix + header, *bodies]


def encode_frame(cmd: RemotingCommand, extra_flags: int = 0, compress_threshold: int = 0) -> bytes:
    """One frame as a single bytes object (tests, tools and the blocking paths)."""
    return b"".join(encode_command(cmd, extra_flags, compress_threshold))


def use_codec(name: str) -> None:
    """"c" (smartgo.net._codec, where it was built) or "python": the frame loop and the
    msgpack/JSON header work of every FrameDecoder and encode_command from now on. Both give the
    same commands and bytes; a process starts on c when built, unless SMARTGO_PURE_PYTHON
    (smartgo.accel)."""
    global _split, _head
    if name == "c":
        if _codec is None:
            raise RuntimeError("smartgo.net._codec is not built (no C compiler at install?)")
        _split, _head = _codec.split, _codec.head
    elif name == "python":
        _split, _head = split_frames, None
    else:
        raise ValueError(f"codec {name!r}: c or python")


def codec_in_use() -> str:
    return "python" if _head is None else "c"


def _configure_codec(decoders: dict) -> None:
    """Give the C codec this module's types, tables and the Python decoders it hands over to."""
    assert _codec is not None  # called only once the C codec loaded
    _codec.configure(RemotingCommand, FrameError, decoders, LANGUAGE_BY_NAME, LanguageCode.OTHER,
                     LANGUAGE_BY_NAME["JAVA"], LANGUAGE_NAMES, _inflate_body, SerializeType.JSON,
                     SerializeType.MSGPACK, _COMPRESSED_BY_SMARTGO)


_codec = accel.load("smartgo.net._codec")
if _codec is not None:
    _configure_codec(DECODERS)
_split = split_frames
_head = None
use_codec("c" if _codec is not None and accel.ENABLED else "python")
