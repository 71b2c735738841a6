"""tests.support.waits's port helpers: what tests rely on when they pick ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.waits import held_port_outside_ephemeral_range


@pytest.mark.timeout(10)
def test_a_held_port_is_below_the_ephemeral_range_and_listening():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    holder = held_port_outside_ephemeral_range()
    try:
        port = holder.getsockname()[1]
        assert 1024 <= port < low
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
    finally:
        holder.close()
    with socket.socket() as again:           # let go, it is free for the service that is to take it
        again.bind(("127.0.0.1", port))
