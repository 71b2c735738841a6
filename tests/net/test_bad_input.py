"""Garbage thrown at a live server process: it keeps serving, memory stays bounded by the frame limit."""

from __future__ import annotations

import random
import socket
import struct
import time

import psutil
import pytest

from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.frame import FrameDecoder, encode_frame
from tests.support.waits import wait_until

HOST = "127.0.0.1"
MAX_FRAME = 1 << 20   # the echo_server fixture's limit


def _frame(stype: int, header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


class Client:
    """A well-behaved blocking client on one connection that must keep getting correct answers."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=5)
        self.decoder = FrameDecoder()
        self.opaque = 0

    def round_trip(self) -> None:
        self.opaque += 1
        body = b"good-%d" % self.opaque
        self.sock.sendall(encode_frame(RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=self.opaque,
                                                       ext_fields={"e": "2"}, body=body)))
        replies: list[RemotingCommand] = []
        while not replies:
            chunk = self.sock.recv(65536)
            assert chunk, "the good connection was closed"
            replies = self.decoder.feed(chunk)
        (reply,) = replies
        assert (reply.opaque, reply.code, reply.ext_fields["queueId"]) == (self.opaque, ResponseCode.SUCCESS, "2")


def _closed_by_server(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True once the server has closed (EOF or reset); replies before the close are skipped."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return False


def _attack(port: int, payload: bytes, expect_close: bool) -> None:
    with socket.create_connection((HOST, port), timeout=5) as sock:
        try:
            sock.sendall(payload)
        except (ConnectionResetError, BrokenPipeError):
            return   # already closed on us: fine
        if expect_close:
            assert _closed_by_server(sock), f"server kept a connection open after {payload[:16]!r}"


ATTACKS = [
    ("huge length", struct.pack(">I", 0x7FFFFFFF), True),
    ("length just over the limit", struct.pack(">I", MAX_FRAME + 1) + b"x" * 100, True),
    ("negative length", struct.pack(">i", -1) + b"\0" * 8, True),
    ("length shorter than its field", struct.pack(">I", 2) + b"ab", True),
    ("header longer than frame", struct.pack(">II", 20, 100) + b"x" * 20, True),
    ("unknown serialize type", _frame(9, b"{}"), True),
    ("malformed JSON header", _frame(0, b'{"code":10,"opaque":'), True),
    ("JSON header not an object", _frame(0, b'"just a string"'), True),
    ("JSON header with a string code", _frame(0, b'{"code":"10"}'), True),
    ("JSON header with a list extFields", _frame(0, b'{"code":10,"extFields":[1,2]}'), True),
    ("binary header with a lying remark length", _frame(1, struct.pack(">hbhiii", 10, 0, 1, 1, 0, 10_000)), True),
    ("msgpack garbage", _frame(2, b"\xc1\xc1\xc1"), True),
    ("truncated frame then hang up", encode_frame(RemotingCommand(10, body=b"z" * 5000))[:-100], False),
    ("half a length field", b"\x00\x00", False),
]


@pytest.mark.timeout(120)
def test_server_survives_garbage_and_keeps_serving(echo_server) -> None:
    proc, port = echo_server
    good = Client(port)
    good.round_trip()
    for _name, payload, expect_close in ATTACKS:
        _attack(port, payload, expect_close)
        good.round_trip()
    rng = random.Random(1234)
    for size in (1, 7, 64, 4096, 65536, 300_000):
        for _ in range(3):
            _attack(port, rng.randbytes(size), False)
            good.round_trip()
    assert proc.poll() is None


@pytest.mark.timeout(120)
def test_memory_stays_bounded_by_the_frame_limit(echo_server) -> None:
    proc, port = echo_server
    server = psutil.Process(proc.pid)
    good = Client(port)
    for _ in range(20):     # warm up allocator and caches before taking the baseline
        good.round_trip()
    baseline = server.memory_info().rss
    # Rounds of 8 connections that each announce a near-limit frame and send most of it, then
    # vanish; plus oversized announcements that must be refused before any buffering.
    for _round in range(6):
        socks = []
        for _ in range(8):
            sock = socket.create_connection((HOST, port), timeout=5)
            sock.sendall(struct.pack(">II", MAX_FRAME - 8, 64) + b"{" * (MAX_FRAME - 4096))
            socks.append(sock)
        for _ in range(4):
            _attack(port, struct.pack(">I", 0x40000000) + b"y" * 65536, True)
        good.round_trip()
        for sock in socks:
            sock.close()
        good.round_trip()
    # the listening socket and the good connection remain once the server has reaped the rest
    wait_until(lambda: len(server.net_connections(kind="tcp")) <= 2, message="server to drop closed sockets")
    good.round_trip()
    growth = server.memory_info().rss - baseline
    # 8 partial frames of ~1 MiB may be held at once; 6 rounds must not accumulate.
    print(f"server RSS growth {growth / 2**20:.1f} MiB")
    assert growth < 8 * MAX_FRAME * 3, f"RSS grew by {growth / 2**20:.1f} MiB"
    assert proc.poll() is None
