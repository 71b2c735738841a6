"""Master/slave replication against real nodes: a slave's CommitLog is the master's, byte for
byte, through restarts and kill -9; a slave takes no writes; SYNC_MASTER answers follow the
slave; garbage on either end of the HA stream costs one connection, nothing else."""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from smartgo.broker.processor.send_processor import SLAVE_REMARK
from tests.support.broker import (FREE_PORT, batch_command, committed_total, group_command, message_properties,
                                    metric_value, offset_command, parse_metrics, pull_command, restart_broker,
                                    scrape_metrics, send_command, uniq_key, update_offset_command)
from smartgo.net.client import RemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.frame import FrameDecoder, encode_command
from smartgo.net.ha_codec import encode_header
from smartgo.store.record import decode_records, pack_host
from tests.support.waits import free_port, held_port_outside_ephemeral_range, steady_disk_usage, wait_until

pytestmark = pytest.mark.timeout(120)


def commitlog_bytes(store: Path, end: int, file_size: int = 1 << 20, start: int = 0) -> bytes:
    """The CommitLog's bytes [start, end) from its files (SMALL_NODE's 1 MiB files; start is a
    file's)."""
    out = bytearray()
    while start < end:
        data = (store / "commitlog" / f"{start:020d}").read_bytes()
        out += data[:min(file_size, end - start)]
        start += file_size
    return bytes(out)


def field(node, name: str) -> int:
    report = node.health()
    assert report is not None
    return report["fields"][name]


def caught_up(master, slave) -> int:
    """Wait until the slave has published everything the master wrote; returns that position."""
    wait_until(lambda: field(slave, "commitlog.written") == field(master, "commitlog.written") > 0, timeout=20,
               message="the slave to catch up")
    return field(master, "commitlog.written")


def assert_same_log(master, slave) -> int:
    end = caught_up(master, slave)
    assert commitlog_bytes(slave.store, end) == commitlog_bytes(master.store, end)
    return end


def send_many(broker, topic: str, count: int, size: int, start: int = 0) -> None:
    for i in range(start, start + count):
        r = broker.call(send_command(topic, bytes([65 + i % 26]) * size, queue_id=i % 4, keys=f"k{i}"))
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)


def test_a_slave_copies_the_master_byte_for_byte_and_passes_writes_on_to_it(start_node, slaves):
    """A write that reaches a slave (a client's stale route) is passed on to the master and its
    answer relayed; one that cannot be (no master known, slave_forward_writes off, a master that
    does not answer) gets 4.x's SERVICE_NOT_AVAILABLE, and nothing is written on the slave."""
    master = start_node({"topics": "Rep:4"})
    slave = slaves(master.node, {"metrics_port": FREE_PORT, "metrics_host": "127.0.0.1"})
    send_many(master, "Rep", 200, 700)                 # frames are cut at 32 KiB, inside records
    r = master.call(batch_command("Rep", [(b"b%d" % i, message_properties(uniq=uniq_key())) for i in range(32)]))
    assert r.code == ResponseCode.SUCCESS
    end = assert_same_log(master.node, slave)
    wait_until(lambda: field(master.node, "commitlog.slave_acked") == end, timeout=10)
    assert field(master.node, "ha.slaves") == 1
    assert field(slave, "commitlog.dispatched") == end           # its own ConsumeQueues follow
    status, _, page = scrape_metrics(slave.metrics_port)              # a slave's page: its own log and actors
    samples = parse_metrics(page)
    assert status == 200 and metric_value(samples, "smartgo_commitlog_max_offset") == end
    assert metric_value(samples, "smartgo_node_healthy") == 1
    assert metric_value(samples, "smartgo_actor_up", actor="ha") == 1
    assert metric_value(samples, "smartgo_actor_up", actor="commit") is None     # a slave has no commit actor
    assert metric_value(samples, "rocketmq_storage_message_reserve_time") > 0

    listed = subprocess.run([sys.executable, "-m", "smartgo.cli", "admin", "cluster-list", "-n", master.registry],
                            capture_output=True, text=True, timeout=30)
    rows = {line.split()[2]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert rows["0"][-1] == "-" and rows["1"][-2:] == ["0", "B"]             # SLAVE BEHIND
    assert rows["1"][3] == f"127.0.0.1:{slave.port}" and rows["1"][4] != "-"  # the slave answers runtime info

    slave_addr = f"127.0.0.1:{slave.port}"
    queue_end = master.call(offset_command(RequestCode.GET_MAX_OFFSET, "Rep", 2))
    passed = master.client.invoke(slave_addr, send_command("Rep", b"via the slave", queue_id=2))
    assert passed.code == ResponseCode.SUCCESS, passed.remark
    assert passed.ext_fields["msgId"] == f"{pack_host('127.0.0.1', master.node.port).hex().upper()}{end:016X}"
    assert passed.ext_fields["queueOffset"] == queue_end.ext_fields["offset"]
    # born at the producer's address, as if sent to the master itself (not the slave's connection's)
    with socket.create_connection(("127.0.0.1", slave.port), timeout=10, source_address=("127.0.0.2", 0)) as s:
        s.sendall(b"".join(bytes(b) for b in encode_command(send_command("Rep", b"born at .2", queue_id=3))))
        decoder, answers = FrameDecoder(), []
        while not answers:
            answers = decoder.feed(s.recv(65536))
        producer = s.getsockname()
    assert answers[0].code == ResponseCode.SUCCESS, answers[0].remark
    born_at = int(answers[0].ext_fields["queueOffset"])      # acknowledged before the master dispatches it
    [born] = wait_until(lambda: decode_records(master.call(pull_command("Rep", 3, born_at, max_nums=1)).body_bytes()),
                        message="the passed-on message in the master's queue")
    assert (born.body, born.born_host) == (b"born at .2", producer)
    batch = master.client.invoke(slave_addr, batch_command("Rep", [(b"s%d" % i, message_properties(uniq=uniq_key()))
                                                                   for i in range(3)], queue_id=1))
    assert batch.code == ResponseCode.SUCCESS and batch.ext_fields["msgId"].count(",") == 2
    # a consumer offset too: the slave's next copy of the master's offsets would overwrite it
    assert master.client.invoke(slave_addr, update_offset_command("FG", "Rep", 1, 2)).code == ResponseCode.SUCCESS
    wait_until(lambda: master.call(group_command(RequestCode.QUERY_CONSUMER_OFFSET, "FG", topic="Rep", queueId=1))
               .ext_fields.get("offset") == "2", timeout=10, message="the offset committed at the master")
    resume = RemotingCommand(RequestCode.RESUME_CHECK_HALF_MESSAGE, ext_fields={"msgId": "7F00000100002A9F" + "0" * 16})
    assert master.client.invoke(slave_addr, resume).code == ResponseCode.SERVICE_NOT_AVAILABLE   # no half put back
    assert_same_log(master.node, slave)                 # written by the master, copied as any other

    def relayed(code: int, result: str) -> float | None:
        samples = parse_metrics(scrape_metrics(slave.metrics_port)[2])
        return metric_value(samples, "smartgo_slave_forwarded_requests_total", request_code=str(code), result=result)
    wait_until(lambda: [relayed(c, "passed") for c in (310, 320, 15)] == [2, 1, 1], timeout=10,
               message="the relays counted on the slave's page")

    refusing = slaves(master.node, {"slave_forward_writes": "false", "broker_id": 2})
    refused = master.client.invoke(f"127.0.0.1:{refusing.port}", send_command("Rep", b"no"))
    assert (refused.code, refused.remark) == (ResponseCode.SERVICE_NOT_AVAILABLE, SLAVE_REMARK)
    written = field(master.node, "commitlog.written")
    master.node.kill()
    failed = master.client.invoke(slave_addr, send_command("Rep", b"no master"))
    assert failed.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert f"its master 127.0.0.1:{master.node.port} did not take the message" in failed.remark
    for _ in range(3):                                  # the connection is kept
        again = master.client.invoke(slave_addr, send_command("Rep", b"no master"))
        assert again.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert field(slave, "commitlog.written") == written
    # the first relay may instead meet the old connection's reset: a different line
    refused = f"not passed on to the master 127.0.0.1:{master.node.port}: connect to"
    wait_until(lambda: refused in slave.log_text(), timeout=10)
    assert slave.log_text().count(refused) == 1     # the same failure: once a minute
    wait_until(lambda: relayed(310, "failed") == 4, timeout=10, message="the failed relays counted")


def test_a_late_slave_catches_up_across_files_and_resumes_after_restart_and_kill9(start_node, slaves):
    master = start_node({"topics": "Rep:4"})
    send_many(master, "Rep", 1500, 1000)                # ~1.6 MB: two CommitLog files of 1 MiB
    slave = slaves(master.node)
    first = assert_same_log(master.node, slave)
    assert first > 1 << 20

    slave.stop()                                        # clean stop, then more data meanwhile
    send_many(master, "Rep", 300, 1000, start=1500)
    slave = restart_broker(slave, role="slave")
    slaves.made.append(slave)
    assert_same_log(master.node, slave)
    slave.logged("starting at %d" % first)                     # resumed, not copied again

    send_many(master, "Rep", 300, 1000, start=1800)
    slave.kill()                                        # kill -9 of the whole slave, maybe mid-frame
    send_many(master, "Rep", 100, 1000, start=2100)
    slave = restart_broker(slave, role="slave")
    slaves.made.append(slave)
    end = assert_same_log(master.node, slave)
    assert field(slave, "commitlog.dispatched") == end


def test_sync_master_answers_follow_the_slave(start_node, slaves):
    master = start_node({"topics": "Sync:1", "replication": "sync", "sync_flush_timeout": 3.0})
    alone = master.call(send_command("Sync", b"alone"))
    assert alone.code == ResponseCode.SLAVE_NOT_AVAILABLE               # stored, but no slave has it
    assert alone.ext_fields["msgId"] and alone.ext_fields["queueOffset"] == "0"

    slave = slaves(master.node)
    wait_until(lambda: field(master.node, "ha.slaves") == 1, timeout=10)
    ok = master.call(send_command("Sync", b"replicated"))
    assert ok.code == ResponseCode.SUCCESS
    assert field(master.node, "commitlog.slave_acked") >= field(master.node, "commitlog.written")

    ha = psutil.Process(slave.actor("ha")["pid"])
    ha.suspend()
    try:
        answers = []
        waiter = threading.Thread(target=lambda: answers.append(master.call(send_command("Sync", b"late"))))
        waiter.start()
        # while it waits, the net actor asks the ha actor for a doorbell at its end (else it would
        # only see the slave's acknowledgement on its own next timeout)
        wait_until(lambda: field(master.node, "net-0.flush_wait") > field(master.node, "commitlog.slave_acked"),
                   timeout=2.5, message="the waiting send's flush_wait word")
        waiter.join(10)
        (late,) = answers
        assert late.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
        assert late.ext_fields["queueOffset"] == "2"
    finally:
        ha.resume()
    assert master.call(send_command("Sync", b"after")).code == ResponseCode.SUCCESS
    assert_same_log(master.node, slave)


def test_garbage_on_the_ha_port_costs_that_connection_only(start_node, slaves):
    master = start_node({"topics": "Rep:4"})
    slave = slaves(master.node)
    send_many(master, "Rep", 10, 100)
    caught_up(master.node, slave)
    for report, logged in ((-5, "a slave reported the negative offset -5"),
                           (1 << 40, f"a slave reported {1 << 40}, ahead of this master's")):
        with socket.create_connection(("127.0.0.1", master.node.ha_port), timeout=5) as s:
            s.sendall(struct.pack(">q", report))
            s.settimeout(5)
            assert s.recv(64) == b""                     # closed on us
        wait_until(lambda: f"broke the protocol: {logged}" in master.node.log_text(), timeout=10)
    assert field(master.node, "commitlog.slave_acked") == field(master.node, "commitlog.written")
    send_many(master, "Rep", 10, 100, start=10)
    assert_same_log(master.node, slave)
    assert field(master.node, "ha.slaves") == 1


def test_a_slave_refused_at_each_reconnect_is_logged_once_a_minute(start_node):
    """A slave ahead of its master is refused at each of its reconnects (every second), each
    time with the master's moving end in the line: it is logged once, then once a minute; a
    different refusal from the same host passes at once."""
    master = start_node({"topics": "Rep:4"})

    def refused(report: int) -> None:
        with socket.create_connection(("127.0.0.1", master.node.ha_port), timeout=5) as s:
            s.sendall(struct.pack(">q", report))
            s.settimeout(5)
            assert s.recv(64) == b""                     # closed on us

    for i in range(4):
        refused(1 << 40)
        send_many(master, "Rep", 1, 100, start=i)        # the master's end moves between the refusals
    refused(-5)
    wait_until(lambda: "negative offset -5" in master.node.log_text(), timeout=10, message="the other refusal")
    log_text = master.node.log_text()
    assert log_text.count(f"a slave reported {1 << 40}, ahead of this master's") == 1
    assert "negative offset -5 (acknowledged up to -1) (3 more like the last line held back)" in log_text


def test_a_slave_fed_garbage_drops_the_connection_and_keeps_its_log(tmp_path, start_node, slaves):
    """A 'master' that answers with data for the wrong offset, then with frames that are not ones:
    the slave logs it, reconnects, and publishes nothing from it; the failure that repeats at
    every reconnect is logged once a minute, not every second."""
    master = start_node({"topics": "Rep:4"})
    fake_port = free_port()
    frames = [encode_header(4096, 3) + b"abc", b"\xff" * 12]
    served = []

    async def fake_master(reader, writer):
        await reader.readexactly(8)
        served.append(1)
        writer.write(frames[min(len(served), len(frames)) - 1])
        await writer.drain()
        await reader.read(100)
        writer.close()

    async def run_fake(stop: asyncio.Event):
        server = await asyncio.start_server(fake_master, "127.0.0.1", fake_port)
        async with server:
            await stop.wait()

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    t = threading.Thread(target=lambda: loop.run_until_complete(run_fake(stop)), daemon=True)
    t.start()
    try:
        slave = slaves(master.node, {"ha_master_address": f"127.0.0.1:{fake_port}"})
        wait_until(lambda: len(served) >= 2, timeout=15)
        wait_until(lambda: "not an HA frame" in slave.log_text(), timeout=10,     # logged through the supervisor
                   message="the second connection's error in the slave's log")
        slave.logged("the master sent data for 4096, this slave's log ends at 0")
        assert field(slave, "commitlog.written") == 0
        assert slave.health()["healthy"]
        wait_until(lambda: len(served) >= 5, timeout=15, message="three more reconnects")
        assert slave.log_text().count("not an HA frame") == 1
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(10)


def test_a_new_slave_of_a_master_past_its_first_file_starts_at_the_oldest_file(tmp_path, start_node, slaves):
    """An empty slave takes the master's oldest file on; its dispatch goes on from there (4.x's
    ReputMessageService moves to the CommitLog's minimum the same way)."""
    full = steady_disk_usage(tmp_path / "full_disk", 0.8)         # over 75 %: expired files go at any hour
    master = start_node({"topics": "Rep:4", "file_reserved_hours": 0.0003, "disk_usage_file": full})
    send_many(master, "Rep", 2600, 1000)                          # ~2.8 MB: three 1 MiB files
    wait_until(lambda: field(master.node, "commitlog.min") > 0, timeout=20, message="the first file to go")
    slave = slaves(master.node)
    end = caught_up(master.node, slave)
    first = wait_until(lambda: field(slave, "commitlog.min"), timeout=10, message="the slave's cleanup to look")
    assert 0 < first < end
    assert commitlog_bytes(slave.store, end, start=first) == commitlog_bytes(master.node.store, end, start=first)
    wait_until(lambda: field(slave, "commitlog.dispatched") == end, timeout=10)
    slave.logged(f"the CommitLog starts at {first}, past 0: dispatching from there")
    assert slave.health()["healthy"]


def test_consumers_read_on_from_the_slave_when_the_master_dies(tmp_path, start_node, slaves, caplog):
    """A standalone registry, a master and its slave. A group consumes the first 100 messages
    from the master; 100 more are sent; the master is killed (-9). The registry is then made to
    list the dead master again for a while (the window in which it has not yet seen the master's
    connection close): a consumer of the same group started in that window gets exactly the
    other 100 from the slave, with the group's offsets (SlaveSynchronize), once the registry
    drops the master: a refused connection makes the client refresh its routes at once rather
    than at its 30 s poll, and a route change makes it rebalance."""
    from tests.support.nodes import launch_node
    from smartgo.broker.registration import BrokerIdentity, Registrar
    from smartgo.broker.managers.topics import read_snapshot
    from smartgo.client import AsyncProducer, AsyncPushConsumer, ConsumeResult, Message
    from smartgo.client.message import SendStatus
    from tests.support.waits import async_wait_until

    registry = launch_node(tmp_path / "registry", {}, role="registry")
    try:
        reg = f"127.0.0.1:{registry.port}"
        master = start_node({"topics": "Fail:4", "registry": reg})
        slave = slaves(master.node, {"registry": reg})

        async def consume(got: list[bytes], expected: int, timeout: float, ghost: Registrar | None = None) -> None:
            """A consumer of G until `expected` messages came. With a ghost: it registers the dead
            master before the consumer starts and leaves once the consumer was refused by it."""
            if ghost is not None:
                assert await ghost.register(snapshot) == 1
            c = AsyncPushConsumer("G", reg, listener=lambda m: got.append(m.body) or ConsumeResult.SUCCESS,
                                  consume_from="CONSUME_FROM_FIRST_OFFSET")
            c.subscribe("Fail", "*")
            await c.start()
            try:
                if ghost is not None:
                    await async_wait_until(lambda: f"{master.addr} refused a connection" in caplog.text, 10,
                                           message="the consumer to be refused by the dead master")
                    await ghost.close()              # the registry drops it as it drops a dead master
                await async_wait_until(lambda: len(got) >= expected, timeout, message=f"{expected} messages")
            finally:
                await c.close()                              # commits the group's offsets

        async def send(prefix: str) -> None:
            async with AsyncProducer("PG", reg) as p:
                for i in range(100):
                    assert (await p.send(Message("Fail", f"{prefix}{i}".encode()))).status is SendStatus.SEND_OK

        first: list[bytes] = []
        asyncio.run(send("a"))
        asyncio.run(consume(first, 100, 30))
        asyncio.run(send("b"))
        caught_up(master.node, slave)
        wait_until(lambda: committed_total(f"127.0.0.1:{slave.port}", "Fail", "G", 4) == 100, timeout=15,
                   message="the group's offsets on the slave")
        snapshot = read_snapshot(master.node.store)
        master.node.kill()

        ghost = Registrar(BrokerIdentity("DefaultCluster", "broker-a", master.addr, "127.0.0.1:1"), [reg],
                          RemotingClient())
        second: list[bytes] = []
        with caplog.at_level("INFO", logger="smartgo.client.instance"):
            asyncio.run(consume(second, 100, 15, ghost))
        assert sorted(first) == sorted(f"a{i}".encode() for i in range(100))
        assert sorted(set(second)) == sorted(f"b{i}".encode() for i in range(100))
    finally:
        registry.reap()


def test_killing_either_ha_actor_mid_stream_costs_a_reconnect_only(start_node, slaves):
    """kill -9 of the master's ha actor, then of the slave's, with a backlog in flight (the
    slave's ha actor is stopped while it builds up): each is restarted by its supervisor, the slave
    resumes from its last whole record, and the copy ends byte for byte equal."""
    master = start_node({"topics": "Rep:4"})
    slave = slaves(master.node)
    for round_, victim in enumerate((master.node, slave)):
        receiver = psutil.Process(slave.actor("ha")["pid"])
        ha = psutil.Process(victim.actor("ha")["pid"])
        receiver.suspend()
        try:
            send_many(master, "Rep", 1200, 1000, start=round_ * 1200)        # ~1.2 MB in flight
            if victim is master.node:
                ha.kill()
        finally:
            receiver.resume()
        if victim is slave:
            ha.kill()
        ha.wait(5)
        wait_until(lambda: victim.actor("ha")["pid"] != ha.pid and victim.health()["healthy"], timeout=20,
                   message="the ha actor restarted")
        assert_same_log(master.node, slave)
    assert field(slave, "commitlog.dispatched") == field(master.node, "commitlog.written")
    # a new connection after each kill (the log lines come through the supervisor: poll for them)
    wait_until(lambda: slave.log_text().count("replicating from") >= 3, timeout=10,
               message="the slave's third replication connection in its log")


def test_slave_read_enable_sends_a_consumer_reading_old_data_to_the_slave(start_node, slaves):
    """slave_read_enable with an in-memory window of 0 % (every record counts as old): the master
    suggests brokerId 1, and an SDK consumer then reads much of its backlog at the slave. A slave
    whose window holds everything suggests the master again."""
    from tests.support.broker import pull_command, stats_records
    from smartgo.client import AsyncPushConsumer, ConsumeResult
    from tests.support.waits import async_wait_until

    master = start_node({"topics": "Cold:4", "slave_read_enable": "true", "access_message_in_memory_max_ratio": 0})
    slave = slaves(master.node, {"slave_read_enable": "true", "stats_interval": 1})
    send_many(master, "Cold", 400, 100)
    caught_up(master.node, slave)
    slave_addr = f"127.0.0.1:{slave.port}"
    at_master = master.call(pull_command("Cold", 0, 0, group="G"))          # send_many: queues 0-3
    assert at_master.code == ResponseCode.SUCCESS and at_master.ext_fields["suggestWhichBrokerId"] == "1"
    wait_until(lambda: master.client.invoke(slave_addr, pull_command("Cold", 0, 0, group="G")).code
               == ResponseCode.SUCCESS, timeout=10, message="the topic on the slave")
    at_slave = master.client.invoke(slave_addr, pull_command("Cold", 0, 0, group="G"))
    assert at_slave.ext_fields["suggestWhichBrokerId"] == "0"            # recent for the slave: back

    async def consume() -> int:
        got: list[bytes] = []
        c = AsyncPushConsumer("GC", master.registry, listener=lambda m: got.append(m.body) or ConsumeResult.SUCCESS,
                              consume_from="CONSUME_FROM_FIRST_OFFSET")
        c.subscribe("Cold", "*")
        await c.start()
        try:
            await async_wait_until(lambda: len(got) >= 400, 20, message="400 messages")
        finally:
            await c.close()
        return len(got)

    assert asyncio.run(consume()) >= 400

    def read_at_slave() -> int:             # the consumer group's messages in the slave's statistics
        return sum(g["get_msgs"] for rec in stats_records(slave.store) for g in rec["groups"] if g["group"] == "GC")
    # the master answers the first pulls of old data, then the slave serves the rest
    wait_until(lambda: read_at_slave() >= 100, timeout=10, message="the group's reads at the slave")


def test_a_taken_ha_port_costs_replication_not_the_broker(tmp_path, slaves):
    """The HA port is held by someone else: the master serves clients and logs the error; once the
    port is free its ha actor listens, and a slave replicates. (Started without the harness's wait,
    which takes "address already in use" for a clash of the node's own ports and retries.)"""
    from tests.support.broker import start_broker
    from smartgo.net.client import BlockingRemotingClient
    holder = held_port_outside_ephemeral_range()      # not one a connection elsewhere could take once it is let go
    port = holder.getsockname()[1]
    node = start_broker(tmp_path / "master", {"topics": "Rep:4", "ha_port": port, "listen_host": "127.0.0.1"},
                        wait=False)
    client = BlockingRemotingClient()
    try:
        try:
            node.wait_healthy()
            served = client.invoke(f"127.0.0.1:{node.port}", send_command("Rep", b"served"), 5)
            assert served.code == ResponseCode.SUCCESS
            wait_until(lambda: f"replication port 127.0.0.1:{port} unavailable" in node.log_text(), timeout=10)
            assert node.health()["healthy"]
        finally:
            holder.close()
        wait_until(lambda: f"replication service on 127.0.0.1:{port}" in node.log_text(), timeout=15)
        slave = slaves(node)
        assert_same_log(node, slave)
    finally:
        client.close()
        node.reap()


def test_a_slave_started_before_its_master_finds_it_within_seconds(tmp_path, start_node):
    """Until a slave is connected to its master it registers every second, not every
    register_interval (30 s), so it learns where to replicate from as soon as the master is up."""
    from tests.support.nodes import launch_node
    from tests.support.broker import SMALL_NODE
    from tests.support.waits import steady_disk_usage

    registry = launch_node(tmp_path / "registry", {}, role="registry")
    slave = None
    try:
        reg = f"127.0.0.1:{registry.port}"
        usage = steady_disk_usage(tmp_path / "usage")
        slave = launch_node(tmp_path / "slave", lambda: {**SMALL_NODE, "registry": reg, "ha_port": free_port(),
                                                         "disk_usage_file": usage}, role="slave")
        assert field(slave, "ha.connected") == 0
        master = start_node({"topics": "Rep:4", "registry": reg})
        wait_until(lambda: field(slave, "ha.connected") == 1, timeout=10, message="the slave connected")
        send_many(master, "Rep", 20, 100)
        assert_same_log(master.node, slave)
    finally:
        if slave is not None:
            slave.reap()
        registry.reap()
