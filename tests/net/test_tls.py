"""TLS on the remoting port (smartgo.net.tls), on both event loops: a permissive server serves TLS
and plain clients on one port, an enforcing one only TLS, a client checks the server against a CA
only when given one, and a connection that never says anything is closed."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time

import pytest

from smartgo.net.client import RemotingClient
from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection
from smartgo.net.errors import RemotingConnectError, RemotingError
from smartgo.net.server import RemotingServer
from smartgo.net.tls import ServerTls, client_context, server_context, server_options
from tests.support.waits import self_signed_cert

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    folder = tmp_path_factory.mktemp("certs")
    return {name: self_signed_cert(folder, name) for name in ("broker", "stranger", "app")}


async def who(conn: Connection, req: RemotingCommand) -> RemotingCommand:
    """Says whether the request came over TLS, and echoes its body."""
    secured = conn._transport.get_extra_info("ssl_object") is not None  # type: ignore[union-attr]
    return req.make_response(ResponseCode.SUCCESS, "tls" if secured else "plain", body=req.body)


def serve(mode: str, certs: dict, client_auth: str = "none", **options) -> RemotingServer:
    tls = ServerTls(mode, *certs["broker"], client_auth, certs["app"][0] if client_auth != "none" else "")
    return RemotingServer("127.0.0.1", [0], {10: who}, **server_options(tls), **options)


def test_a_permissive_port_serves_tls_and_plain_clients_alike(arun, certs):
    async def main():
        async with serve("permissive", certs) as server, RemotingClient(ssl_context=client_context()) as secure, \
                RemotingClient() as plain:
            addr = f"127.0.0.1:{server.port}"
            big = b"x" * 300_000                          # many TLS records, and a frame split across them
            answers = [await client.invoke(addr, RemotingCommand(10, body=body))
                       for client in (secure, plain, secure) for body in (b"hi", big)]
        return answers
    answers = arun(main())
    assert [(a.code, a.remark) for a in answers] == [(0, "tls"), (0, "tls"), (0, "plain"), (0, "plain"),
                                                     (0, "tls"), (0, "tls")]
    assert [a.body for a in answers] == [b"hi", b"x" * 300_000] * 3


def test_an_enforcing_port_refuses_plain_clients(arun, certs):
    async def main():
        async with serve("enforcing", certs) as server, RemotingClient(ssl_context=client_context()) as secure, \
                RemotingClient(connect_timeout=2.0) as plain:
            addr = f"127.0.0.1:{server.port}"
            ok = await secure.invoke(addr, RemotingCommand(10, body=b"hi"))
            with pytest.raises(RemotingError):
                await plain.invoke(addr, RemotingCommand(10, body=b"hi"), timeout=3.0)
        return ok
    assert arun(main()).remark == "tls"


def test_a_client_given_a_ca_accepts_only_servers_it_signed(arun, certs):
    async def main():
        async with serve("permissive", certs) as server, \
                RemotingClient(ssl_context=client_context(certs["broker"][0])) as trusting, \
                RemotingClient(ssl_context=client_context(certs["stranger"][0])) as wary:
            addr = f"127.0.0.1:{server.port}"
            ok = await trusting.invoke(addr, RemotingCommand(10, body=b"hi"))
            with pytest.raises(RemotingConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await wary.invoke(addr, RemotingCommand(10, body=b"hi"))
        return ok
    assert arun(main()).remark == "tls"


def test_a_silent_connection_is_closed_and_the_port_serves_on(arun, certs):
    async def main():
        async with serve("permissive", certs, handshake_timeout=0.3) as server, \
                RemotingClient(ssl_context=client_context()) as secure:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as silent:
                start = time.monotonic()
                assert await asyncio.to_thread(silent.recv, 1) == b""    # closed by the server, not our timeout
                waited = time.monotonic() - start
            ok = await secure.invoke(f"127.0.0.1:{server.port}", RemotingCommand(10, body=b"hi"))
        return waited, ok
    waited, ok = arun(main())
    assert 0.2 <= waited < 4 and ok.remark == "tls"


def test_a_garbled_handshake_is_closed_with_a_log_line_and_the_port_serves_on(arun, certs, caplog):
    """0x16 and then junk: taken for TLS, the handshake fails, the connection is closed (at most a
    TLS alert first), and the next clients, TLS and plain, are served."""
    def read_to_eof(sock: socket.socket) -> bytes:
        data = b""
        while chunk := sock.recv(1024):             # a socket timeout (5 s) fails the test
            data += chunk
        return data

    async def main():
        async with serve("permissive", certs, handshake_timeout=2.0) as server, \
                RemotingClient(ssl_context=client_context()) as secure, RemotingClient() as plain:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as bad:
                bad.sendall(b"\x16\x03\x01\x00\x10" + b"\xff" * 16)
                answer = await asyncio.to_thread(read_to_eof, bad)
            addr = f"127.0.0.1:{server.port}"
            return answer, [await c.invoke(addr, RemotingCommand(10, body=b"hi")) for c in (secure, plain)]
    answer, answers = arun(main())
    assert answer == b"" or answer[:1] == b"\x15"                          # nothing, or an alert record
    assert [a.remark for a in answers] == ["tls", "plain"]
    assert any(r.name == "smartgo.net.tls" and "closed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", ["permissive", "enforcing"])
def test_a_server_that_requires_client_certificates_takes_only_those_its_ca_signed(arun, certs, mode):
    """tls.server.need.client.auth=require: the app's certificate (its own CA here) is let in; no
    certificate, or one the server's CA did not sign, is not."""
    async def main():
        app_tls = client_context(cert_file=certs["app"][0], key_file=certs["app"][1])
        async with serve(mode, certs, client_auth="require") as server, RemotingClient(ssl_context=app_tls) as app, \
                RemotingClient(ssl_context=client_context()) as anonymous, \
                RemotingClient(ssl_context=client_context(cert_file=certs["stranger"][0],
                                                          key_file=certs["stranger"][1])) as stranger:
            addr = f"127.0.0.1:{server.port}"
            ok = await app.invoke(addr, RemotingCommand(10, body=b"hi"))
            for client in (anonymous, stranger):
                with pytest.raises(RemotingError):
                    await client.invoke(addr, RemotingCommand(10, body=b"hi"), timeout=3.0)
        return ok
    assert arun(main()).remark == "tls"


def test_tls_needs_a_certificate(certs):
    with pytest.raises(ValueError, match="needs a certificate"):
        RemotingServer("127.0.0.1", [0], {}, tls_mode="permissive")
    with pytest.raises(ValueError, match="needs tls_cert_file"):
        server_options(ServerTls("enforcing"))
    with pytest.raises(ValueError, match="needs tls_trust_cert_file"):
        server_options(ServerTls("enforcing", *certs["broker"], "require"))
    with pytest.raises((OSError, ssl.SSLError)):
        server_context(ServerTls("enforcing", "/nonexistent.crt", "/nonexistent.key"))
