"""Where an MQTT actor answers its node: an abstract UNIX socket (Linux), named after the node's run dir.

Abstract names have no file to leave behind and no 108-byte path limit (a run dir deep in a temporary
directory made the socket paths too long to bind), and they go with the process that listens.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path


def local_address(run_path: Path, actor: str, kind: str) -> str:
    """The address of an actor's `kind` channel: the same for every process of the node, another for
    another node on the host (its run dir differs)."""
    node = hashlib.sha1(str(Path(run_path).resolve()).encode()).hexdigest()[:16]
    return f"\0smartgo-{node}-{actor}.{kind}"


def shown(address: str | Path) -> str:
    """The address as a log line shows it (an abstract name with a leading @)."""
    text = str(address)
    return "@" + text[1:] if text.startswith("\0") else text


def listening(address: str | Path) -> socket.socket:
    """A listening UNIX socket made here (uvloop refuses abstract names given as a path)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(address))
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def connected(address: str | Path, timeout: float) -> socket.socket:
    """A UNIX socket connected to address (a local connect does not wait on the network)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(str(address))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
