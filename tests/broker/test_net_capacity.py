"""How many RocketMQ client connections a node takes: --remoting-connections starts as many net
actors as their descriptors need (each keeps room for its mapped ConsumeQueue files), and a net
actor holding all it may closes further connections at accept - a log line and a metric say so -
while it keeps serving the clients it has."""

from __future__ import annotations

import socket
import struct
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from smartgo.broker.settings import net_capacity, net_names
from smartgo.config import NodeConfig
from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.frame import FrameDecoder, encode_frame
from smartgo.net.limits import open_files_limit
from tests.support.broker import FREE_PORT, start_broker
from tests.support.few_files_supervisor import FILES
from tests.support.nodes import Node
from tests.support.waits import wait_until

PER_ACTOR = net_capacity(NodeConfig(), FILES)
UNKNOWN_CODE = 9999          # answered by the connection itself: REQUEST_CODE_NOT_SUPPORTED


def test_remoting_connections_starts_the_net_actors_it_needs() -> None:
    per = net_capacity(NodeConfig(), open_files_limit())
    assert len(net_names(NodeConfig(net_actors=1, remoting_connections=2 * per + 1))) == 3
    assert len(net_names(NodeConfig(net_actors=1, remoting_connections=per))) == 1
    assert len(net_names(NodeConfig(net_actors=4, remoting_connections=per))) == 4
    assert PER_ACTOR == FILES - 256 - 512        # its share, less the ConsumeQueue files it may map


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    launcher = Path(__file__).resolve().parents[1] / "support" / "few_files_supervisor.py"
    node = start_broker(tmp_path / "node", {"net_actors": 1, "metrics_port": FREE_PORT, "mqtt_port": 0,
                                            "mqtt_ws_port": 0, "remoting_connections": PER_ACTOR + 1},
                        launcher=launcher)
    try:
        yield node
    finally:
        node.reap()


def _ask(sock: socket.socket, opaque: int) -> int | None:
    """The response code to one request, None if the broker closed the connection instead."""
    sock.sendall(encode_frame(RemotingCommand(UNKNOWN_CODE, opaque=opaque)))
    decoder = FrameDecoder()
    while True:
        try:
            data = sock.recv(4096)
        except ConnectionResetError:
            return None
        if not data:
            return None
        got = decoder.feed(data)
        if got:
            return got[0].code


def _refused_metric(node: Node) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith("smartgo_connections_refused_total{"):
                return float(line.rsplit(" ", 1)[1])
    return -1.0


@pytest.mark.timeout(180)
def test_full_net_actors_refuse_at_accept_and_keep_serving(node: Node) -> None:
    nets = [a["name"] for a in node.health()["actors"] if a["name"].startswith("net-")]
    assert nets == ["net-0", "net-1"]                # one cannot hold PER_ACTOR + 1
    accepted: list[socket.socket] = []
    refused = 0
    try:
        for i in range(2 * PER_ACTOR + 100):         # the kernel spreads them: both actors fill up
            sock = socket.create_connection(("127.0.0.1", node.port), timeout=10)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if _ask(sock, i + 1) == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                accepted.append(sock)
            else:
                refused += 1
                sock.close()
        assert len(accepted) == 2 * PER_ACTOR and refused == 100
        for n, sock in enumerate(accepted[:5]):     # the clients it holds are served
            assert _ask(sock, 10_000 + n) == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        wait_until(lambda: _refused_metric(node) == refused, timeout=30, message="refusals counted in the metrics")
        node.logged("refused a connection from", "the most this process takes")
        for sock in accepted[:40]:                   # room again: taken at once
            sock.close()
        accepted = accepted[40:]

        def back() -> bool:
            with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
                return _ask(sock, 99_999) == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        wait_until(back, timeout=30, message="a connection served once others closed")
    finally:
        for sock in accepted:
            sock.close()
