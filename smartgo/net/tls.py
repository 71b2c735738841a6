"""TLS on the remoting port, as RocketMQ 4.x offers it (TlsMode, TlsHelper).

A server runs in one of three modes (tls.server.mode): `disabled` (plain remoting only),
`permissive` (both: the first byte a client sends tells them apart, 0x16 opening a TLS handshake
record, as NettyRemotingServer's HandshakeHandler sniffs it) or `enforcing` (TLS only). A client
(useTLS) does not check the server's certificate unless given a CA file to check it against:
Java's clients trust any (tls.client.authServer=false) by default. A server may also ask clients
for certificates signed by a CA it trusts (tls.server.need.client.auth: optional or require).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smartgo.net.loop import wait_within

log = logging.getLogger(__name__)

MODES = ("disabled", "permissive", "enforcing")
CLIENT_AUTH = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}
#: The first byte of a TLS record carrying a handshake (a ClientHello opens every TLS connection).
HANDSHAKE = 0x16


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A server's TLS settings (a node's tls_* settings)."""
    mode: str = "disabled"
    cert_file: str = ""
    key_file: str = ""
    #: Ask clients for a certificate (none, optional, require) signed by a CA in trust_file.
    client_auth: str = "none"
    trust_file: str = ""


def server_context(tls: ServerTls) -> ssl.SSLContext:
    """TLS 1.2+ with the server's certificate chain and key (PEM), and the CA its clients'
    certificates must lead to when it asks for them. Raises ValueError, OSError / ssl.SSLError."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_auth not in CLIENT_AUTH:
        raise ValueError(f"client authentication {tls.client_auth!r} is not one of {', '.join(CLIENT_AUTH)}")
    if tls.client_auth != "none":
        if not tls.trust_file:
            raise ValueError(f"client authentication {tls.client_auth} needs tls_trust_cert_file")
        ctx.load_verify_locations(tls.trust_file)
    ctx.verify_mode = CLIENT_AUTH[tls.client_auth]
    return ctx


def server_options(tls: ServerTls) -> dict:
    """RemotingServer's TLS keyword arguments. ValueError, OSError or ssl.SSLError when the mode
    needs a certificate that does not load."""
    if tls.mode not in MODES:
        raise ValueError(f"TLS mode {tls.mode!r} is not one of {', '.join(MODES)}")
    if tls.mode == "disabled":
        return {}
    if not tls.cert_file or not tls.key_file:
        raise ValueError(f"TLS mode {tls.mode} needs tls_cert_file and tls_key_file")
    return {"tls_mode": tls.mode, "ssl_context": server_context(tls)}


def node_server_options(tls: ServerTls, who: str) -> dict:
    """server_options for a node's server, with the error line an operator needs when the
    certificate does not load (the server then does not start: nothing is served in the clear
    that was meant to be served over TLS)."""
    try:
        return server_options(tls)
    except (ValueError, OSError) as exc:            # ssl.SSLError is an OSError
        log.error("%s: tls_mode is %s and its certificate does not load, so nothing is served: %s", who, tls.mode,
                  exc)
        raise


def client_context(ca_file: str | None = None, cert_file: str | None = None,
                   key_file: str | None = None) -> ssl.SSLContext:
    """Without ca_file any server certificate is accepted (Java's default); with it, the chain
    must lead to that CA (the host name is not checked, as Netty's client does not). cert_file
    and key_file: this client's certificate, for servers that ask for one."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    if ca_file is None:
        ctx.verify_mode = ssl.CERT_NONE
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file or None)
    return ctx


async def serve_permissive(listener: socket.socket, make_protocol: Callable[[], asyncio.Protocol],
                           context: ssl.SSLContext, timeout: float) -> None:
    """Accept on listener until cancelled. Each connection's first byte is peeked before any
    transport exists (so nothing is read that the chosen protocol will not see, on any loop), and
    the connection becomes a TLS or a plain transport accordingly."""
    loop = asyncio.get_running_loop()
    adopting: set[asyncio.Task] = set()
    try:
        while True:
            conn, _ = await loop.sock_accept(listener)
            task = loop.create_task(_adopt(conn, make_protocol, context, timeout))
            adopting.add(task)
            task.add_done_callback(adopting.discard)
    finally:
        for task in list(adopting):
            task.cancel()


async def _adopt(conn: socket.socket, make_protocol: Callable[[], asyncio.Protocol], context: ssl.SSLContext,
                 timeout: float) -> None:
    loop = asyncio.get_running_loop()
    peer = "a client"
    try:
        peer = conn.getpeername()
        conn.setblocking(False)
        first = await wait_within(_peek(conn), timeout)
        if not first:
            conn.close()
            return
        tls = first[0] == HANDSHAKE
        options: dict[str, Any] = {"ssl": context, "ssl_handshake_timeout": timeout} if tls else {}
        await loop.connect_accepted_socket(make_protocol, conn, **options)
    except asyncio.CancelledError:
        conn.close()
        raise
    except asyncio.TimeoutError:
        log.info("connection from %s closed: no request or TLS handshake within %g s", peer, timeout)
        conn.close()
    except (OSError, ssl.SSLError) as exc:
        log.warning("connection from %s closed: %s", peer, exc)
        conn.close()


async def _peek(conn: socket.socket) -> bytes:
    """The first byte the peer sent, left in the socket (b"" when it closed first)."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(conn.fileno(), ready)
    try:
        await readable
    finally:
        loop.remove_reader(conn.fileno())
    return conn.recv(1, socket.MSG_PEEK)
