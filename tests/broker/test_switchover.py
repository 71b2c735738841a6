"""An operator's switchover against real nodes (CONTROLLER_ELECT_MASTER, `smartgo admin
elect-master`): under async replication and a running producer, the slave becomes the master
holding everything acknowledged, and the old master follows it with nothing to cut."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.support.schedule import delayed_command, max_offset
from tests.support.broker import group_command, send_command, update_offset_command
from smartgo.client import Admin, AsyncAdmin, AsyncProducer, AsyncPushConsumer, ConsumeResult, Message, SendStatus
from smartgo.client.errors import ClientError
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.errors import RemotingError
from smartgo.store.record import pack_host
from tests.support.waits import async_wait_until, free_port, wait_until

from .test_failover import FAILOVER, brokers, role_file, taking_sends
from .test_replication import assert_same_log

pytestmark = pytest.mark.timeout(150)


async def produce_through(reg: str, switch) -> tuple[set[bytes], dict[str, str], tuple[float, float]]:
    """Send without pause; after 300 acknowledged, run switch(); stop once 300 more were
    acknowledged after it. (the acknowledged bodies, switch's answer, (seconds switch took,
    seconds from its end to the next acknowledgement))."""
    acked: set[bytes] = set()
    state: dict = {}

    async def produce() -> None:
        async with AsyncProducer("PG", reg) as p:
            i = 0
            while len(acked) < state.get("until", 1 << 30):
                i += 1
                try:
                    r = await p.send(Message("Fo", b"m%d" % i))
                except (ClientError, RemotingError):
                    await asyncio.sleep(0.01)      # refused while the roles change: no hot loop
                    continue
                if r.status is SendStatus.SEND_OK:
                    acked.add(b"m%d" % i)
                    if "switched" in state and "gap" not in state:
                        state["gap"] = time.monotonic() - state["switched"]

    task = asyncio.create_task(produce())
    await async_wait_until(lambda: len(acked) >= 300, 30, message="300 sends before the switchover")
    began = time.monotonic()
    answer = await switch()
    state["switched"] = time.monotonic()
    state["until"] = len(acked) + 300
    await asyncio.wait_for(task, 60)
    return acked, answer, (state["switched"] - began, state["gap"])


async def consume_all(reg: str, expected: set[bytes]) -> set[bytes]:
    got: set[bytes] = set()
    c = AsyncPushConsumer("G", reg, listener=lambda m: got.add(m.body) or ConsumeResult.SUCCESS,
                          consume_from="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe("Fo", "*")
    await c.start()
    try:
        await async_wait_until(lambda: expected <= got, 30, message="every acknowledged message")
    finally:
        await c.close()
    return got


def test_a_switchover_under_load_loses_nothing_even_with_async_replication(registry, start_node, slaves):
    reg = registry.addr
    settings = {"registry": reg, **FAILOVER}            # async replication: a kill -9 would lose the tail
    master = start_node({"topics": "Fo:4", **settings})
    slave = slaves(master.node, {**settings, "slave_sync_interval": 3600})    # its first copy of the tables only
    slave_addr = f"127.0.0.1:{slave.port}"
    wait_until(lambda: taking_sends(master.node) and brokers(reg) == {0: master.addr, 1: slave_addr},
               timeout=10, message="a confirmed master and its slave registered")
    wait_until(lambda: (slave.store / "config" / "topics.json").exists(), timeout=10, message="the first copy")
    r = master.call(update_offset_command("OG", "Fo", 2, 77))      # committed after that copy
    assert r.code == ResponseCode.SUCCESS, r.remark

    async def switch() -> dict[str, str]:
        async with AsyncAdmin(reg) as admin:
            return await admin.elect_master("broker-a", broker_addr=slave_addr)

    acked, answer, (took, gap) = asyncio.run(produce_through(reg, switch))
    print(f"switchover: answered in {took:.3f}s, sends acknowledged again {gap:.3f}s after the answer")
    assert (answer["masterAddress"], answer["masterEpoch"]) == (slave_addr, "1")
    wait_until(lambda: brokers(reg) == {0: slave_addr, 1: master.addr}, timeout=20,
               message="the old master back as slave 1")
    promoted, demoted = role_file(slave), role_file(master.node)
    assert (promoted["role"], promoted["broker_id"], promoted["epoch"]) == ("master", 0, 1)
    assert (demoted["role"], demoted["broker_id"], demoted["epoch"]) == ("slave", 1, 1)
    assert_same_log(slave, master.node)                 # the old master copies the new one
    assert "cut at" not in master.node.log_text()        # it had nothing the new master lacked
    registry.logged("switchover: promoted " + slave_addr)
    slave.logged(f"with the last copy of {master.addr}'s tables")
    offset = master.client.invoke(slave_addr, group_command(RequestCode.QUERY_CONSUMER_OFFSET, "OG", topic="Fo",
                                                            queueId=2))
    assert offset.ext_fields["offset"] == "77"           # the new master has the offsets as they stood
    assert acked <= asyncio.run(consume_all(reg, acked))


def test_the_cli_switches_over_by_id_and_back_to_the_most_advanced_slave_and_refusals_change_nothing(
        registry, start_node, slaves):
    reg = registry.addr
    settings = {"registry": reg, **FAILOVER}
    master = start_node({"topics": "Fo:4", **settings})
    slave = slaves(master.node, settings)
    slave_addr = f"127.0.0.1:{slave.port}"
    wait_until(lambda: taking_sends(master.node) and brokers(reg) == {0: master.addr, 1: slave_addr},
               timeout=10, message="a confirmed master and its slave registered")

    def cli(*args: str, registries: str = reg) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "smartgo.cli", "admin", "elect-master", "-n", registries,
                               "--json", "--broker-name", "broker-a", *args], capture_output=True, text=True,
                              timeout=60)

    refused = cli("--broker-id", "7")
    assert refused.returncode != 0 and "broker-a has no broker with brokerId 7" in refused.stderr
    refused = cli("--broker", master.addr)
    assert refused.returncode != 0 and f"{master.addr} is the master of broker-a already" in refused.stderr
    assert taking_sends(master.node) and brokers(reg) == {0: master.addr, 1: slave_addr}

    done = cli("--broker-id", "1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["masterAddress"] == slave_addr
    wait_until(lambda: brokers(reg) == {0: slave_addr, 1: master.addr} and taking_sends(slave), timeout=20,
               message="the roles swapped")
    assert master.client.invoke(slave_addr, send_command("Fo", b"at the new master")).code == ResponseCode.SUCCESS

    def through_the_old_master() -> bool:
        """A client that has not re-read its route (Java's polls every 30 s) sends to the old
        master's address: now a slave, it passes the send on to the new master."""
        try:
            r = master.client.invoke(master.addr, send_command("Fo", b"stale route"))
        except RemotingError:
            return False                                # the old master restarting as a slave
        return r.code == ResponseCode.SUCCESS and r.ext_fields["msgId"].startswith(
            pack_host("127.0.0.1", slave.port).hex().upper())

    wait_until(through_the_old_master, timeout=10, message="a send at the old master's address passed on")

    # and back again, a term later, to its most advanced slave; a registry that is down is passed over
    back = cli(registries=f"127.0.0.1:{free_port()};{reg}")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout.splitlines()[-1])["masterEpoch"] == "2"
    wait_until(lambda: brokers(reg) == {0: master.addr, 1: slave_addr} and taking_sends(master.node), timeout=20,
               message="the roles swapped back")
    assert master.call(send_command("Fo", b"back home")).code == ResponseCode.SUCCESS
    assert_same_log(master.node, slave)
    assert (role_file(master.node)["epoch"], role_file(slave)["epoch"]) == (2, 2)
    listed = subprocess.run([sys.executable, "-m", "smartgo.cli", "admin", "cluster-list", "-n", reg],
                            capture_output=True, text=True, timeout=30)
    header, *lines = listed.stdout.splitlines()
    epochs = {line.split()[2]: line.split()[header.split().index("EPOCH")] for line in lines}
    assert epochs == {"0": "2", "1": "2"}, listed.stdout


def test_a_switchover_to_a_slave_that_cannot_catch_up_fails_and_the_master_holds_every_write_meanwhile(
        registry, start_node, slaves):
    """The slave replicates from a port that never answers. For the 10 s the registry waits, the
    fenced master refuses sends and holds a delayed message that falls due; then it takes sends
    and delivers again."""
    reg = registry.addr
    master = start_node({"topics": "Fo:4;D:1", "message_delay_level": "1s 2s", "registry": reg, **FAILOVER})
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()                                      # connections complete; nothing is ever read or sent
    try:
        slave = slaves(master.node, {"registry": reg, **FAILOVER,
                                     "ha_master_address": "127.0.0.1:%d" % silent.getsockname()[1]})
        slave_addr = f"127.0.0.1:{slave.port}"
        wait_until(lambda: taking_sends(master.node) and brokers(reg) == {0: master.addr, 1: slave_addr},
                   timeout=10, message="a confirmed master and its slave registered")
        r = master.call(delayed_command("D", b"later", 2))
        assert r.code == ResponseCode.SUCCESS, r.remark
        stored = time.time()
        outcome: list[BaseException] = []

        def elect() -> None:
            try:
                with Admin(reg) as admin:
                    admin.elect_master("broker-a", broker_addr=slave_addr)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=elect)
        thread.start()
        wait_until(lambda: master.board("failover.fenced") == 1, timeout=5, message="the master fenced")
        refused = master.call(send_command("Fo", b"x"))
        assert refused.code == ResponseCode.NO_PERMISSION
        wait_until(lambda: time.time() > stored + 3.5, timeout=10)           # due at +2 s, and a pause of 1 s
        assert master.board("failover.fenced") == 1 and max_offset(master.call, "D", 0) == 0   # held
        thread.join(30)
        assert len(outcome) == 1 and "did not catch up" in str(outcome[0])
        wait_until(lambda: master.board("failover.fenced") == 0 and max_offset(master.call, "D", 0) == 1,
                   timeout=10, message="the fence lifted and the delayed message delivered")
        assert master.call(send_command("Fo", b"y")).code == ResponseCode.SUCCESS
        assert brokers(reg) == {0: master.addr, 1: slave_addr}
    finally:
        silent.close()
