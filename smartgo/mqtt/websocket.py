"""MQTT over WebSocket, the server side of RFC 6455 without I/O: the opening handshake (path /mqtt,
subprotocol mqtt or mqttv3.1, MQTT 5.0 section 6) and the frame codec. Client frames must be masked, server
frames are not (RFC 6455 section 5.1). MQTT travels in binary messages; what the decoder returns are whole
messages (fragments joined) and control frames, which the caller answers with control_reply()."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import struct
from dataclasses import dataclass, field
from http import HTTPStatus

__all__ = ["WebSocketError", "Handshake", "Frame", "FrameDecoder", "parse_handshake", "handshake_response",
           "error_response", "encode_frame", "close_frame", "parse_close", "control_reply", "SUBPROTOCOLS",
           "CONTINUATION", "TEXT", "BINARY", "CLOSE", "PING", "PONG", "CLOSE_NORMAL", "CLOSE_GOING_AWAY",
           "CLOSE_PROTOCOL_ERROR", "CLOSE_UNSUPPORTED_DATA", "CLOSE_INVALID_DATA", "CLOSE_TOO_BIG"]

#: RFC 6455 section 1.3: appended to the client's key before hashing it into Sec-WebSocket-Accept
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#: What MQTT 5.0 (section 6) and 3.1.1 name the subprotocol, and what MQTT 3.1 clients sent
SUBPROTOCOLS = ("mqtt", "mqttv3.1")
#: A handshake longer than this is refused (431) rather than buffered on and on
MAX_HANDSHAKE = 16 * 1024
#: The largest message the decoder accepts by default (the MQTT layer passes its own packet size limit)
DEFAULT_MAX_PAYLOAD = 1 << 20

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_OPCODES = frozenset((CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG))
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_INVALID_DATA = 1007
CLOSE_TOO_BIG = 1009
#: Close codes that never go on the wire (1005, 1006, 1015) or are unassigned below 3000 (section 7.4)
_SENDABLE_CODES = frozenset((1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014))

#: an HTTP header name (RFC 9110 token)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


class WebSocketError(Exception):
    """code is the HTTP status to answer for a bad handshake, the close code for a bad frame."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(slots=True)
class Handshake:
    path: str
    key: str
    #: the subprotocol chosen (the client's first one of SUBPROTOCOLS)
    protocol: str
    #: header names in lower case; a repeated header's values joined by ", "
    headers: dict[str, str] = field(default_factory=dict)


def _tokens(value: str) -> list[str]:
    return [token.strip() for token in value.split(",") if token.strip()]


def parse_handshake(data: bytes | bytearray, path: str = "/mqtt") -> tuple[Handshake | None, int]:
    """(the handshake, the bytes it took) once data holds the whole request head; (None, 0) until then.
    What follows the head is already frames. WebSocketError(HTTP status) for a request to refuse."""
    end = bytes(data[:MAX_HANDSHAKE + 4]).find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_HANDSHAKE:
            raise WebSocketError(431, f"the request head is over {MAX_HANDSHAKE} bytes")
        return None, 0
    try:
        head = bytes(data[:end]).decode("ascii")
    except UnicodeDecodeError:
        raise WebSocketError(400, "the request head is not ASCII") from None
    request, *lines = head.split("\r\n")
    parts = request.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise WebSocketError(400, f"not an HTTP request line: {request[:80]!r}")
    method, target, version = parts
    if version != "HTTP/1.1":
        raise WebSocketError(400, f"a WebSocket handshake is HTTP/1.1, not {version[:20]}")
    if method != "GET":
        raise WebSocketError(405, f"a WebSocket handshake is a GET, not {method}")
    if target.partition("?")[0] != path:
        raise WebSocketError(404, f"no WebSocket endpoint at {target[:80]}: MQTT is at {path}")
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise WebSocketError(400, f"not an HTTP header line: {line[:80]!r}")
        name = name.lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if "host" not in headers:
        raise WebSocketError(400, "no Host header")
    if "websocket" not in (t.lower() for t in _tokens(headers.get("upgrade", ""))):
        raise WebSocketError(400, "not a WebSocket upgrade: no 'Upgrade: websocket' header")
    if "upgrade" not in (t.lower() for t in _tokens(headers.get("connection", ""))):
        raise WebSocketError(400, "not a WebSocket upgrade: no 'Connection: Upgrade' header")
    if headers.get("sec-websocket-version") != "13":
        raise WebSocketError(426, "unsupported Sec-WebSocket-Version: this server speaks version 13")
    key = headers.get("sec-websocket-key", "")
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            raise ValueError(key)
    except (ValueError, binascii.Error):
        raise WebSocketError(400, "Sec-WebSocket-Key is not 16 bytes in base64") from None
    offered = _tokens(headers.get("sec-websocket-protocol", ""))
    protocol = next((p for p in offered if p in SUBPROTOCOLS), None)
    if protocol is None:
        raise WebSocketError(400, "MQTT over WebSocket needs the subprotocol 'mqtt' (Sec-WebSocket-Protocol: mqtt); "
                             f"offered: {', '.join(offered) or 'none'}")
    return Handshake(target, key, protocol, headers), end + 4


def handshake_response(handshake: Handshake) -> bytes:
    """The 101 that opens the connection."""
    accept = base64.b64encode(hashlib.sha1(handshake.key.encode("ascii") + _GUID).digest()).decode("ascii")
    return ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: {handshake.protocol}\r\n\r\n").encode("ascii")


def error_response(status: int, text: str) -> bytes:
    """A refused handshake: the status, text/plain text, and the connection closes."""
    body = (text + "\n").encode("utf-8")
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    extra = "Sec-WebSocket-Version: 13\r\n" if status == 426 else ""
    return (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n").encode("ascii") + body


@dataclass(slots=True)
class Frame:
    """A whole message (TEXT or BINARY, fragments joined) or a control frame (CLOSE, PING, PONG)."""

    opcode: int
    payload: bytes


def _unmask(data: bytes, key: bytes) -> bytes:
    """XOR with the 4-byte key repeated, as one big-integer operation (C speed, not a Python loop per byte)."""
    n = len(data)
    if not n:
        return b""
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(n, "little")


def parse_close(payload: bytes) -> tuple[int | None, str]:
    """(code, reason) of a CLOSE frame's payload; (None, "") for an empty one. WebSocketError 1002 for a
    1-byte payload or a code that may not be sent, 1007 for a reason that is not UTF-8."""
    if not payload:
        return None, ""
    if len(payload) < 2:
        raise WebSocketError(CLOSE_PROTOCOL_ERROR, "a close frame with a 1-byte payload")
    code = _U16.unpack_from(payload)[0]
    if code not in _SENDABLE_CODES and not 3000 <= code <= 4999:
        raise WebSocketError(CLOSE_PROTOCOL_ERROR, f"close code {code} may not be sent")
    try:
        return code, payload[2:].decode("utf-8")
    except UnicodeDecodeError:
        raise WebSocketError(CLOSE_INVALID_DATA, "the close reason is not UTF-8") from None


class FrameDecoder:
    """Client frames to messages. Any protocol violation raises WebSocketError with the close code to send
    (then the connection closes: the decoder is not usable after an error). Nothing after a CLOSE is read."""

    __slots__ = ("max_payload", "_buffer", "_fragments", "_fragments_size", "_opcode", "closed")

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.max_payload = max_payload
        self._buffer = bytearray()
        self._fragments: list[bytes] = []
        self._fragments_size = 0
        self._opcode = 0  # of the fragmented message under way; 0 = none
        #: a CLOSE came: the caller answers it (control_reply) and closes
        self.closed = False

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        buf = self._buffer
        buf += data
        out: list[Frame] = []
        pos = 0
        size = len(buf)
        while size - pos >= 2 and not self.closed:
            b0, b1 = buf[pos], buf[pos + 1]
            length = b1 & 0x7F
            head = 2
            if length == 126:
                head = 4
            elif length == 127:
                head = 10
            if size - pos < head:
                break
            if length == 126:
                length = _U16.unpack_from(buf, pos + 2)[0]
            elif length == 127:
                length = _U64.unpack_from(buf, pos + 2)[0]
            self._check(b0, b1, length)
            if size - pos < head + 4 + length:
                break
            start = pos + head + 4
            payload = _unmask(bytes(buf[start:start + length]), bytes(buf[pos + head:start]))
            pos = start + length
            frame = self._frame(b0 & 0x80, b0 & 0x0F, payload)
            if frame is not None:
                out.append(frame)
        del buf[:pos]
        return out

    def _check(self, b0: int, b1: int, length: int) -> None:
        """The header alone decides these, before any payload is buffered."""
        opcode = b0 & 0x0F
        if b0 & 0x70:
            raise WebSocketError(CLOSE_PROTOCOL_ERROR, "reserved bits set: no extension was negotiated")
        if opcode not in _OPCODES:
            raise WebSocketError(CLOSE_PROTOCOL_ERROR, f"unknown opcode 0x{opcode:X}")
        if not b1 & 0x80:
            raise WebSocketError(CLOSE_PROTOCOL_ERROR, "a client frame must be masked")
        if opcode & 0x8:
            if length > 125:
                raise WebSocketError(CLOSE_PROTOCOL_ERROR, f"a control frame of {length} bytes (at most 125)")
            if not b0 & 0x80:
                raise WebSocketError(CLOSE_PROTOCOL_ERROR, "a fragmented control frame")
        elif length >> 63:
            raise WebSocketError(CLOSE_PROTOCOL_ERROR, "a payload length with its top bit set")
        elif self._fragments_size + length > self.max_payload:
            raise WebSocketError(CLOSE_TOO_BIG, f"a message over {self.max_payload} bytes")

    def _frame(self, fin: int, opcode: int, payload: bytes) -> Frame | None:
        if opcode & 0x8:
            if opcode == CLOSE:
                parse_close(payload)
                self.closed = True
            return Frame(opcode, payload)
        if opcode == CONTINUATION:
            if not self._opcode:
                raise WebSocketError(CLOSE_PROTOCOL_ERROR, "a continuation frame with no message to continue")
        elif self._opcode:
            raise WebSocketError(CLOSE_PROTOCOL_ERROR, "a new message inside a fragmented one")
        elif not fin:
            self._opcode = opcode
        if self._opcode:
            self._fragments.append(payload)
            self._fragments_size += len(payload)
            if not fin:
                return None
            opcode = self._opcode
            payload = b"".join(self._fragments)
            self._fragments.clear()
            self._fragments_size = 0
            self._opcode = 0
        if opcode == TEXT:
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                raise WebSocketError(CLOSE_INVALID_DATA, "a text message that is not UTF-8") from None
        return Frame(opcode, payload)


def encode_frame(opcode: int, payload: bytes | bytearray | memoryview, mask: bool = False, fin: bool = True) -> bytes:
    """One frame; the server's are unmasked. mask=True makes a client's (tests, tools)."""
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    bit = 0x80 if mask else 0
    if n < 126:
        head = bytes((first, bit | n))
    elif n < 1 << 16:
        head = bytes((first, bit | 126)) + _U16.pack(n)
    else:
        head = bytes((first, bit | 127)) + _U64.pack(n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + _unmask(bytes(payload), key)


def close_frame(code: int = CLOSE_NORMAL, reason: str = "", mask: bool = False) -> bytes:
    """A CLOSE with a code and a reason cut to fit the 125-byte control frame (never inside a character)."""
    text = reason.encode("utf-8")[:123].decode("utf-8", "ignore").encode("utf-8")
    return encode_frame(CLOSE, _U16.pack(code) + text, mask)


def control_reply(frame: Frame) -> bytes | None:
    """What the server sends back: a PONG for a PING, the echo of a CLOSE (its code, or none)."""
    if frame.opcode == PING:
        return encode_frame(PONG, frame.payload)
    if frame.opcode == CLOSE:
        code, _ = parse_close(frame.payload)
        return encode_frame(CLOSE, b"") if code is None else close_frame(code)
    return None
