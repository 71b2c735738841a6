"""The node's session directory (smartgo/mqtt/directory.py): which MQTT actors a CONNECT must ask
about a client, so a node of fifty actors does not ask fifty of them each time - nor waits for one
that hangs."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from smartgo.mqtt import codec as c
from smartgo.mqtt.directory import SessionDirectory, slot_of
from tests.mqtt.test_cluster import mqtt_node
from tests.support.waits import wait_for_port, wait_until
from tests.support.wire import closed_by_peer, connect_sent


def _same_slot(client_id: str) -> str:
    """Another client id in client_id's slot."""
    slot = slot_of(client_id)
    return next(other for n in range(10_000_000) if slot_of(other := f"x{n}") == slot)


def test_an_actor_is_asked_about_the_clients_of_its_slots_only(tmp_path: Path) -> None:
    zero, one, two = (SessionDirectory(tmp_path, 3, i) for i in range(3))
    try:
        assert zero.holders("dev-1") == []
        one.hold("dev-1")
        two.hold("dev-2")
        assert zero.holders("dev-1") == [1] and zero.holders("dev-2") == [2]
        assert one.holders("dev-1") == []                 # never itself
        twin = _same_slot("dev-1")
        one.hold(twin)                                    # two of its sessions in one slot
        one.release("dev-1")
        assert zero.holders(twin) == [1]                  # the other is still there
        one.release(twin)
        assert zero.holders("dev-1") == [] and zero.holders(twin) == []
        one.hold("dev-3")
        one.close()
        again = SessionDirectory(tmp_path, 3, 1)          # actor 1 restarted: holds nothing yet
        assert zero.holders("dev-3") == []
        again.close()
    finally:
        for d in (zero, two):
            d.close()


def _connect(port: int, client_id: str, clean: bool = False) -> socket.socket:
    sock = connect_sent(port, client_id, clean=clean)
    sock.setblocking(False)
    return sock


def _answer(sock: socket.socket) -> bytes:
    try:
        return sock.recv(4)
    except (BlockingIOError, ConnectionResetError):
        return b""


@pytest.mark.timeout(180)
def test_a_hung_mqtt_actor_is_not_asked_about_clients_it_never_held(tmp_path: Path) -> None:
    node, broker = mqtt_node(tmp_path / "node", {"mqtt_actors": 2})
    socks: list[socket.socket] = []
    stopped = None
    try:
        stopped = next(a["pid"] for a in node.health()["actors"] if a["name"] == "mqtt-1")
        os.kill(stopped, signal.SIGSTOP)
        socks = [_connect(broker.port, f"new-{i}") for i in range(16)]      # the kernel spreads them

        def answered() -> list[socket.socket]:
            return [sock for sock in socks if _answer(sock) == b"\x20\x02\x00\x00"]
        got = wait_until(answered, timeout=30, message="CONNACKs from the actor that runs")
        assert got
        assert "did not answer take" not in node.log_text()    # nobody waited on the hung one
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        for sock in socks:
            sock.close()
        node.reap()


@pytest.mark.timeout(180)
def test_a_clean_connect_takes_the_client_over_on_whichever_actor_it_lands(tmp_path: Path) -> None:
    """The kernel puts each connection on either actor: over ten CONNECTs with one client id (clean
    session: the directory alone says whether a sibling holds it) some land on the other actor than
    the one before, whose connection must be closed."""
    node, broker = mqtt_node(tmp_path / "node", {"mqtt_actors": 2})
    try:
        before = _connect(broker.port, "twin", clean=True)
        wait_until(lambda: _answer(before) == b"\x20\x02\x00\x00", timeout=30, message="the first CONNACK")
        for _ in range(10):
            sock = _connect(broker.port, "twin", clean=True)
            wait_until(lambda: _answer(sock) == b"\x20\x02\x00\x00", timeout=30, message="a CONNACK")
            wait_until(lambda: closed_by_peer(before), timeout=30, message="the connection before it closed")
            before.close()
            before = sock
        before.close()
        taken = node.log_text().count("session taken over by another actor or node")
        assert taken >= 1                                   # some went from one actor to the other
    finally:
        node.reap()


@pytest.mark.timeout(120)
def test_an_mqtt_actor_counts_its_work_for_the_watchdog(tmp_path: Path) -> None:
    """In a connect storm an MQTT actor's loop may not turn within its heartbeat deadline; its board
    progress counter moving is what tells the supervisor it is busy, not hung (a million-device run
    had 40 of 56 MQTT actors killed as hung, every device on them lost)."""
    node, broker = mqtt_node(tmp_path / "node")

    def progress() -> int:
        return next(a["progress"] for a in node.health()["actors"] if a["name"] == "mqtt-0") or 0
    socks: list[socket.socket] = []
    try:
        before = progress()
        socks = [connect_sent(broker.port, f"busy-{i}") for i in range(20)]
        for sock in socks:
            assert sock.recv(4) == b"\x20\x02\x00\x00"
        wait_until(lambda: progress() >= before + 40, timeout=30, message="mqtt-0's progress counter moving")
    finally:
        for sock in socks:
            sock.close()
        node.reap()


@pytest.mark.timeout(180)
def test_an_mqtt_actor_restarting_while_the_broker_is_slow_waits_for_it(tmp_path: Path) -> None:
    """A restarted MQTT actor makes sure of its topics; a broker too busy to answer in time (a net
    actor stopped here) is waited for, not a reason to fail the start and be restarted again."""
    node, broker = mqtt_node(tmp_path / "node")
    try:
        net = node.actor("net-0")["pid"]
        before = node.actor("mqtt-0")
        os.kill(net, signal.SIGSTOP)
        try:
            os.kill(before["pid"], signal.SIGKILL)
            wait_until(lambda: "creating topic" in node.log_text(), timeout=60, message="the topic asked again")
        finally:
            try:
                os.kill(net, signal.SIGCONT)
            except ProcessLookupError:
                pass                                       # the watchdog replaced it meanwhile
        node.wait_healthy(timeout=90, check=lambda r: next(
            a for a in r["actors"] if a["name"] == "mqtt-0")["restarts"] > before["restarts"])
        assert "smartgo.actors.mqtt-0: start failed" not in node.log_text()
        with connect_sent(broker.port, "after") as sock:
            assert sock.recv(4) == b"\x20\x02\x00\x00"
    finally:
        node.reap()


@pytest.mark.timeout(180)
def test_a_kept_session_whose_holder_does_not_answer_is_not_started_over(tmp_path: Path) -> None:
    """A device coming back to one actor while the sibling holding its session does not answer
    (restarting after a node restart, here stopped) gets "server unavailable" and comes back later
    to its session - not CONNACK with an empty one (a reconnect storm lost its sessions that way)."""
    node, broker = mqtt_node(tmp_path / "node", {"mqtt_actors": 2})
    devices = [f"kept-{i}" for i in range(24)]
    first: list[socket.socket] = []
    again: list[socket.socket] = []
    stopped = None
    try:
        first = [connect_sent(broker.port, d, clean=False) for d in devices]
        assert {sock.recv(4) for sock in first} == {b"\x20\x02\x00\x00"}       # new sessions, spread over both
        stopped = node.actor("mqtt-1")["pid"]
        os.kill(stopped, signal.SIGSTOP)
        again = [_connect(broker.port, d) for d in devices]                  # the same ids, persistent

        got: list[bytes] = []

        def refused() -> bool:
            got.extend(answer for answer in map(_answer, again) if answer)
            return b"\x20\x02\x00\x03" in got                                   # server unavailable
        wait_until(refused, timeout=60, message="a device refused while its holder is stopped")
        assert b"\x20\x02\x00\x00" not in got          # never a fresh session for a device whose holder is away
        os.kill(stopped, signal.SIGCONT)
        stopped = None

        def resumed() -> bool:
            with connect_sent(broker.port, devices[0], clean=False) as sock:
                return sock.recv(4) == b"\x20\x02\x01\x00"                    # its session present
        wait_until(resumed, timeout=60, message="a device back to its session")
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGCONT)
            except ProcessLookupError:
                pass                                       # the watchdog replaced it meanwhile
        for sock in first + again:
            sock.close()
        node.reap()


@pytest.mark.timeout(180)
def test_a_checkpoint_of_many_sessions_is_stored_in_batches_that_fit(tmp_path: Path) -> None:
    """The session records of a checkpoint go in batches a CommitLog file holds: 1,000 persistent
    devices subscribing at once on 32 KiB CommitLog files (16,000 on the default 1 GiB ones in a
    restart storm) were refused as one batch too large, every round, and never stored - so a
    restarted actor had none of their sessions."""
    node, broker = mqtt_node(tmp_path / "node", {"commitlog_file_size": 32768})
    socks: list[socket.socket] = []
    try:
        for i in range(1000):
            sock = connect_sent(broker.port, f"many-{i:04d}-{'x' * 40}", clean=False)
            sock.sendall(c.encode(c.Subscribe(1, [(f"devices/{i}/cmd/{'y' * 40}", c.SubOptions(1))]), 4))
            socks.append(sock)
        for sock in socks:
            got = b""
            while len(got) < 9:                             # CONNACK (4) and SUBACK (5)
                got += sock.recv(9 - len(got))
            assert got[:4] == b"\x20\x02\x00\x00" and got[4] == 0x90
        for sock in socks:
            sock.close()
        socks = []
        with pytest.raises(AssertionError, match="timed out"):    # checkpoints go on at 0.1 s: none refused
            wait_until(lambda: "not stored" in node.log_text(), timeout=5, interval=0.5, message="a refusal")
        before = node.actor("mqtt-0")
        os.kill(before["pid"], signal.SIGKILL)
        node.wait_healthy(timeout=90, check=lambda r: next(
            a for a in r["actors"] if a["name"] == "mqtt-0")["restarts"] > before["restarts"])
        wait_for_port(broker.port, timeout=30)
        with connect_sent(broker.port, f"many-0999-{'x' * 40}", clean=False) as sock:
            assert sock.recv(4) == b"\x20\x02\x01\x00"         # its session, from the stored records
        assert "not stored" not in node.log_text()
    finally:
        for sock in socks:
            sock.close()
        node.reap()
