"""The sans-IO WebSocket server side (smartgo.mqtt.websocket): RFC 6455's handshake example, refused
handshakes, frames whole and in pieces, every framing violation with its close code, and paho-mqtt's own
WebSocket transport talking to a loopback server built on the codec."""

from __future__ import annotations

import socket
import struct
import threading

import paho.mqtt.client as paho
import pytest

from smartgo.mqtt.websocket import (BINARY, CLOSE, CONTINUATION, PING, PONG, TEXT, Frame, FrameDecoder, WebSocketError,
                                    close_frame, control_reply, encode_frame, error_response, handshake_response,
                                    parse_close, parse_handshake)
from tests.support.waits import wait_until

RFC_KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455 section 1.3's example and its answer
RFC_ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def request(path: str = "/mqtt", method: str = "GET", version: str = "HTTP/1.1", drop: tuple[str, ...] = (),
            **headers: str) -> bytes:
    fields = {"Host": "127.0.0.1:8083", "Upgrade": "websocket", "Connection": "keep-alive, Upgrade",
              "Sec-WebSocket-Key": RFC_KEY, "Sec-WebSocket-Version": "13", "Sec-WebSocket-Protocol": "mqtt"}
    fields.update({k.replace("_", "-"): v for k, v in headers.items()})
    lines = [f"{method} {path} {version}"] + [f"{k}: {v}" for k, v in fields.items() if k not in drop]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_rfc_handshake() -> None:
    data = request() + b"\x82\x80rest"
    handshake, used = parse_handshake(data)
    assert handshake is not None
    assert data[used:] == b"\x82\x80rest"  # what follows the head is frames already
    assert (handshake.path, handshake.key, handshake.protocol) == ("/mqtt", RFC_KEY, "mqtt")
    assert handshake.headers["connection"] == "keep-alive, Upgrade"
    response = handshake_response(handshake)
    assert response.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert f"\r\nSec-WebSocket-Accept: {RFC_ACCEPT}\r\n".encode() in response
    assert b"\r\nSec-WebSocket-Protocol: mqtt\r\n" in response
    assert response.endswith(b"\r\n\r\n")


def test_partial_head_waits() -> None:
    data = request()
    for cut in (0, 1, len(data) // 2, len(data) - 1):
        assert parse_handshake(data[:cut]) == (None, 0)


def test_query_string_and_header_case() -> None:
    data = request("/mqtt?token=1").replace(b"Upgrade: websocket", b"UPGRADE: WebSocket")
    handshake, _ = parse_handshake(data)
    assert handshake is not None and handshake.path == "/mqtt?token=1"


@pytest.mark.parametrize(("offered", "chosen"), [("mqtt", "mqtt"), ("mqttv3.1", "mqttv3.1"),
                                                  ("foo, mqttv3.1, mqtt", "mqttv3.1"), ("foo,mqtt", "mqtt")])
def test_subprotocol_choice(offered: str, chosen: str) -> None:
    handshake, _ = parse_handshake(request(Sec_WebSocket_Protocol=offered))
    assert handshake is not None and handshake.protocol == chosen
    assert f"Sec-WebSocket-Protocol: {chosen}\r\n".encode() in handshake_response(handshake)


@pytest.mark.parametrize(("data", "status", "text"), [
    (request("/other"), 404, "MQTT is at /mqtt"),
    (request("/mqtt/x"), 404, "no WebSocket endpoint"),
    (request(drop=("Sec-WebSocket-Protocol",)), 400, "needs the subprotocol 'mqtt'"),
    (request(Sec_WebSocket_Protocol="chat, superchat"), 400, "offered: chat, superchat"),
    (request(Sec_WebSocket_Protocol="MQTT"), 400, "subprotocol"),
    (request(method="POST"), 405, "not POST"),
    (request(drop=("Upgrade",)), 400, "'Upgrade: websocket'"),
    (request(Upgrade="h2c"), 400, "'Upgrade: websocket'"),
    (request(Connection="keep-alive"), 400, "'Connection: Upgrade'"),
    (request(Sec_WebSocket_Version="8"), 426, "version 13"),
    (request(drop=("Sec-WebSocket-Key",)), 400, "Sec-WebSocket-Key"),
    (request(Sec_WebSocket_Key="c2hvcnQ="), 400, "16 bytes"),
    (request(Sec_WebSocket_Key="!!!!"), 400, "16 bytes"),
    (request(drop=("Host",)), 400, "Host"),
    (request(version="HTTP/1.0"), 400, "HTTP/1.1"),
    (b"GET /mqtt\r\n\r\n", 400, "not an HTTP request line"),
    (request().replace(b"Host:", b"Host"), 400, "not an HTTP header line"),
    (request().replace(b"Host: ", b"Host: \xff"), 400, "not ASCII"),
    (b"GET /mqtt HTTP/1.1\r\nX: " + b"a" * 20000, 431, "over"),
])
def test_refused_handshakes(data: bytes, status: int, text: str) -> None:
    with pytest.raises(WebSocketError) as caught:
        parse_handshake(data)
    assert caught.value.code == status
    assert text in caught.value.message


def test_error_response() -> None:
    response = error_response(404, "no WebSocket endpoint at /x")
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert b"Connection: close" in head
    assert body == b"no WebSocket endpoint at /x\n"
    assert f"Content-Length: {len(body)}".encode() in head
    assert b"Sec-WebSocket-Version: 13" in error_response(426, "version")


# ---- frames -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 300_000])
def test_binary_round_trip_at_each_length_encoding(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    decoder = FrameDecoder()
    data = encode_frame(BINARY, payload, mask=True)
    assert decoder.feed(data[:1]) == []
    assert decoder.feed(data[1:-1] if size else data[1:]) == ([] if size else [Frame(BINARY, b"")])
    if size:
        assert decoder.feed(data[-1:]) == [Frame(BINARY, payload)]


def test_server_frames_are_unmasked() -> None:
    assert encode_frame(BINARY, b"abc") == b"\x82\x03abc"
    assert encode_frame(BINARY, b"a" * 126)[:4] == b"\x82\x7e\x00\x7e"
    assert encode_frame(BINARY, b"a" * 65535)[:4] == b"\x82\x7e\xff\xff"
    assert encode_frame(BINARY, b"a" * 65536)[:10] == b"\x82\x7f" + struct.pack(">Q", 65536)
    masked = encode_frame(BINARY, b"abc", mask=True)
    assert masked[1] == 0x83 and len(masked) == 9 and masked[6:] != b"abc"


def test_byte_by_byte_with_many_frames() -> None:
    decoder = FrameDecoder()
    data = b"".join(encode_frame(BINARY, bytes([i]) * i, mask=True) for i in range(1, 40))
    frames = []
    for b in data:
        frames += decoder.feed(bytes([b]))
    assert frames == [Frame(BINARY, bytes([i]) * i) for i in range(1, 40)]


def test_fragments_joined_with_a_ping_between() -> None:
    decoder = FrameDecoder()
    data = (encode_frame(BINARY, b"he", mask=True, fin=False) + encode_frame(CONTINUATION, b"ll", mask=True, fin=False)
            + encode_frame(PING, b"p", mask=True) + encode_frame(CONTINUATION, b"o", mask=True)
            + encode_frame(TEXT, "é".encode(), mask=True))
    assert decoder.feed(data) == [Frame(PING, b"p"), Frame(BINARY, b"hello"), Frame(TEXT, "é".encode())]


def header(first: int, length: int, masked: bool = True) -> bytes:
    """A frame header; masked ones with the zero key (the payload goes as is)."""
    if length < 126:
        head = bytes((first, (0x80 if masked else 0) | length))
    elif length < 65536:
        head = bytes((first, (0x80 if masked else 0) | 126)) + struct.pack(">H", length)
    else:
        head = bytes((first, (0x80 if masked else 0) | 127)) + struct.pack(">Q", length)
    return head + (bytes(4) if masked else b"")


@pytest.mark.parametrize(("data", "code", "text"), [
    (b"\x82\x03abc", 1002, "must be masked"),
    (header(0xC2, 0), 1002, "reserved bits"),
    (header(0x92, 0), 1002, "reserved bits"),
    (header(0x83, 0), 1002, "unknown opcode 0x3"),
    (header(0x8B, 0), 1002, "unknown opcode 0xB"),
    (header(0x89, 126) + bytes(126), 1002, "control frame of 126 bytes"),
    (header(0x09, 1) + b"p", 1002, "fragmented control frame"),
    (header(0x80, 1) + b"x", 1002, "no message to continue"),
    (header(0x02, 1) + b"x" + header(0x82, 1) + b"y", 1002, "a new message inside a fragmented one"),
    (header(0x88, 1) + b"\x03", 1002, "1-byte payload"),
    (header(0x88, 2) + struct.pack(">H", 1005), 1002, "close code 1005"),
    (header(0x88, 2) + struct.pack(">H", 999), 1002, "close code 999"),
    (header(0x88, 2) + struct.pack(">H", 2000), 1002, "close code 2000"),
    (header(0x88, 4) + struct.pack(">H", 1000) + b"\xc3\x28", 1007, "not UTF-8"),
    (header(0x81, 2) + b"\xc3\x28", 1007, "text message that is not UTF-8"),
    (b"\x82\xff" + struct.pack(">Q", 1 << 63), 1002, "top bit"),
])
def test_framing_violations(data: bytes, code: int, text: str) -> None:
    with pytest.raises(WebSocketError) as caught:
        FrameDecoder().feed(data)
    assert caught.value.code == code
    assert text in caught.value.message


def test_too_big_is_refused_from_the_header_alone() -> None:
    decoder = FrameDecoder(max_payload=1000)
    assert decoder.feed(encode_frame(BINARY, bytes(1000), mask=True)) == [Frame(BINARY, bytes(1000))]
    with pytest.raises(WebSocketError) as caught:
        decoder.feed(header(0x82, 1001))  # no payload sent yet
    assert caught.value.code == 1009


def test_too_big_counts_the_fragments() -> None:
    decoder = FrameDecoder(max_payload=1000)
    assert decoder.feed(encode_frame(BINARY, bytes(600), mask=True, fin=False)) == []
    with pytest.raises(WebSocketError) as caught:
        decoder.feed(header(0x80, 401))
    assert caught.value.code == 1009


def test_close_ends_reading() -> None:
    decoder = FrameDecoder()
    data = close_frame(1001, "bye", mask=True) + encode_frame(BINARY, b"late", mask=True)
    assert decoder.feed(data) == [Frame(CLOSE, struct.pack(">H", 1001) + b"bye")]
    assert decoder.closed
    assert decoder.feed(encode_frame(BINARY, b"later", mask=True)) == []


def test_control_replies() -> None:
    assert control_reply(Frame(PING, b"abc")) == b"\x8a\x03abc"
    assert control_reply(Frame(CLOSE, struct.pack(">H", 1001) + b"bye")) == b"\x88\x02\x03\xe9"
    assert control_reply(Frame(CLOSE, b"")) == b"\x88\x00"
    assert control_reply(Frame(PONG, b"")) is None
    assert control_reply(Frame(BINARY, b"x")) is None


def test_close_frame_reason_fits_a_control_frame() -> None:
    frame = close_frame(1002, "é" * 100)
    assert frame[:2] == b"\x88\x7d" or frame[1] < 126
    assert len(frame) - 2 <= 125
    code, reason = parse_close(frame[2:])
    assert code == 1002 and reason == "é" * 61  # 122 bytes: the 62nd character would split
    assert parse_close(b"") == (None, "")
    assert parse_close(struct.pack(">H", 4000)) == (4000, "")


# ---- paho-mqtt's WebSocket transport against the codec ---------------------------------------------------------------
class OneClientServer:
    """A loopback listener that speaks the handshake and frames with the codec, answers the client's CONNECT
    with a CONNACK and records every MQTT packet it receives (a packet per binary message)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.packets: list[bytes] = []
        self.controls: list[int] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
            with conn:
                conn.settimeout(60)
                data = b""
                handshake = None
                while handshake is None:
                    data += conn.recv(4096)
                    handshake, used = parse_handshake(data)
                conn.sendall(handshake_response(handshake))
                decoder = FrameDecoder()
                pending = data[used:]
                while True:
                    for frame in decoder.feed(pending):
                        if frame.opcode == BINARY:
                            self.packets.append(frame.payload)
                            if frame.payload[0] == 0x10:  # CONNECT -> CONNACK accepted
                                conn.sendall(encode_frame(BINARY, b"\x20\x02\x00\x00"))
                        else:
                            self.controls.append(frame.opcode)
                            reply = control_reply(frame)
                            if reply:
                                conn.sendall(reply)
                    if decoder.closed:
                        return
                    pending = conn.recv(65536)
                    if not pending:
                        return
        except BaseException as exc:  # the test reports it
            self.error = exc
        finally:
            self.listener.close()


@pytest.mark.timeout(60)
def test_paho_websocket_client() -> None:
    server = OneClientServer()
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="ws-test", transport="websockets")
    client.ws_set_options(path="/mqtt")
    connected = threading.Event()
    client.on_connect = lambda *args: connected.set()
    client.connect("127.0.0.1", server.port, keepalive=30)
    client.loop_start()
    try:
        assert connected.wait(30), server.error
        payload = bytes(range(256)) * 400  # 102,400 bytes: a 64-bit length frame
        client.publish("devices/42/state", payload, qos=0).wait_for_publish(30)
        wait_until(lambda: len(server.packets) >= 2 or server.error is not None, timeout=30)
    finally:
        client.disconnect()
        client.loop_stop()
    server.thread.join(30)
    assert server.error is None
    connect, publish = server.packets[:2]
    assert connect[0] == 0x10 and b"\x00\x04MQTT" in connect and b"ws-test" in connect
    assert publish[0] == 0x30 and b"devices/42/state" in publish and publish.endswith(payload)
    assert server.packets[2:] == [b"\xe0\x00"]  # DISCONNECT
