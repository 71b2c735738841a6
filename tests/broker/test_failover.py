"""Automatic failover against real nodes: a failover registry promotes the slave when its master
dies (kill -9), clients go on at the new master with nothing acknowledged lost, and the old
master comes back as a slave, its unreplicated tail cut, its CommitLog again the master's."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.nodes import launch_node
from tests.support.broker import (FREE_PORT, committed_total, metric_value, offset_command, parse_metrics,
                                    restart_broker, scrape_metrics, send_command)
from smartgo.client import Admin, AsyncProducer, AsyncPushConsumer, ConsumeResult, Message, SendStatus
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import pack_host
from tests.support.waits import async_wait_until, wait_until

from .test_replication import assert_same_log, caught_up, field

pytestmark = pytest.mark.timeout(150)

FAILOVER = {"failover_enable": "true"}


def brokers(registry_addr: str) -> dict[int, str]:
    """broker-a's brokerId -> address, as the registry routes it."""
    with Admin(registry_addr) as admin:
        broker = admin.cluster_info().brokers.get("broker-a")
    return dict(broker.broker_addrs) if broker is not None else {}


def taking_sends(node) -> bool:
    report = node.health()
    return report is not None and report["healthy"] and report["fields"]["flag.read_only"] == 0


def max_offset(client, addr: str, queue_id: int) -> int:
    r = client.invoke(addr, offset_command(RequestCode.GET_MAX_OFFSET, "Fo", queue_id))
    assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    return int(r.ext_fields["offset"])


def role_metric(port: int) -> dict[str, str]:
    """The labels of the node's smartgo_broker_role sample (and it is not fenced)."""
    status, _, text = scrape_metrics(port)
    samples = parse_metrics(text)
    [labels] = [dict(labels) for name, labels in samples if name == "smartgo_broker_role"]
    assert status == 200 and metric_value(samples, "smartgo_failover_fenced") == 0
    return {k: labels[k] for k in ("role", "broker_id", "epoch")}


def runtime(registry_addr: str, addr: str) -> dict[str, str]:
    with Admin(registry_addr) as admin:
        return admin.broker_runtime_info(addr)


def role_epoch(node) -> int:
    path = node.store / "config" / "role.json"
    return json.loads(path.read_text())["epoch"] if path.exists() else -1


def role_file(node) -> dict:
    return json.loads((node.store / "config" / "role.json").read_text())


async def send(registry_addr: str, prefix: str, count: int) -> None:
    async with AsyncProducer("PG", registry_addr) as p:
        for i in range(count):
            assert (await p.send(Message("Fo", f"{prefix}{i}".encode()))).status is SendStatus.SEND_OK


async def consume(registry_addr: str, expected: int) -> list[bytes]:
    got: list[bytes] = []
    c = AsyncPushConsumer("G", registry_addr, listener=lambda m: got.append(m.body) or ConsumeResult.SUCCESS,
                          consume_from="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe("Fo", "*")
    await c.start()
    try:
        await async_wait_until(lambda: len(set(got)) >= expected, 30, message=f"{expected} messages")
    finally:
        await c.close()
    return got


def test_a_dead_master_is_replaced_by_a_slave_the_other_follows_and_nothing_acknowledged_is_lost(
        registry, start_node, slaves):
    reg = registry.addr
    settings = {"registry": reg, "replication": "sync", **FAILOVER}    # on a slave: the setting of its terms
    master = start_node({"topics": "Fo:4", **settings})
    first = slaves(master.node, {**settings, "metrics_port": FREE_PORT, "metrics_host": "127.0.0.1"})
    second = slaves(master.node, {**settings, "broker_id": 2})
    first_addr, second_addr = f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"
    wait_until(lambda: taking_sends(master.node) and brokers(reg) == {0: master.addr, 1: first_addr, 2: second_addr},
               timeout=10, message="a confirmed master and both slaves registered")
    asyncio.run(send(reg, "a", 200))                 # replication=sync: every SEND_OK is on a slave too
    assert sorted(asyncio.run(consume(reg, 200))) == sorted(f"a{i}".encode() for i in range(200))
    for slave in (first, second):
        caught_up(master.node, slave)
    wait_until(lambda: all(committed_total(addr, "Fo", "G", 4) == 200 for addr in (first_addr, second_addr)),
               timeout=15, message="the group's offsets copied to the slaves")
    assert role_metric(first.metrics_port) == {"role": "slave", "broker_id": "1", "epoch": "0"}
    end = field(master.node, "commitlog.written")
    wait_until(lambda: runtime(reg, master.addr)["slaveAckedOffset"] == str(end), timeout=10,
               message="the master's runtime info to show what its slaves acknowledged")
    assert runtime(reg, master.addr)["brokerRole"] == "SYNC_MASTER"
    assert runtime(reg, first_addr)["brokerRole"] == "SLAVE"
    master.node.kill()

    wait_until(lambda: brokers(reg) == {0: first_addr, 2: second_addr} and taking_sends(first), timeout=30,
               message="the first slave promoted and taking sends")
    assert role_metric(first.metrics_port) == {"role": "master", "broker_id": "0", "epoch": "1"}
    assert role_file(first)["role"] == "master" and role_file(first)["epoch"] == 1
    first.logged("promoted to master at epoch 1")
    registry.logged(f"broker-a: master gone for 1s; promoted {first_addr}")   # equal ends: lowest id
    wait_until(lambda: field(first, "ha.slaves") == 1, timeout=30, message="the other slave following the new master")
    asyncio.run(send(reg, "b", 100))                 # SEND_OK: the other slave has them too
    got = asyncio.run(consume(reg, 100))
    assert sorted(got) == sorted(f"b{i}".encode() for i in range(100))      # on from the copied offsets
    assert_same_log(first, second)
    wait_until(lambda: role_epoch(second) == 1, timeout=10, message="the other slave to record the new term")


def test_an_old_master_comes_back_as_a_slave_with_its_unreplicated_tail_cut(registry, start_node, slaves, tmp_path):
    """Two registries, as 4.x deployments run them; only the first decides."""
    plain = launch_node(tmp_path / "plain-registry", {}, role="registry")
    try:
        old_master_returns(registry, f"127.0.0.1:{plain.port}", start_node, slaves)
    finally:
        plain.reap()


def old_master_returns(registry, plain: str, start_node, slaves) -> None:
    reg = registry.addr
    both = f"{reg};{plain}"
    master = start_node({"topics": "Fo:4", "registry": both, "replication": "sync", "sync_flush_timeout": 1.0,
                         **FAILOVER})
    slave = slaves(master.node, {"registry": both, **FAILOVER})
    wait_until(lambda: taking_sends(master.node), timeout=10, message="the registry to confirm the master")
    for i in range(50):
        r = master.call(send_command("Fo", b"x%d" % i, queue_id=i % 4))
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    replicated = caught_up(master.node, slave)
    assert slave.stop() == 0
    for i in range(5):                               # stored on the master alone: never acknowledged as SEND_OK
        r = master.call(send_command("Fo", b"tail%d" % i, queue_id=0))
        assert r.code == ResponseCode.SLAVE_NOT_AVAILABLE, (r.code, r.remark)
    tail_end = field(master.node, "commitlog.written")
    assert tail_end > replicated
    master.node.kill()

    slave = restart_broker(slave, role="slave")
    slaves.made.append(slave)
    slave_addr = f"127.0.0.1:{slave.port}"
    wait_until(lambda: brokers(reg) == {0: slave_addr} and taking_sends(slave), timeout=30,
               message="the slave promoted")
    assert role_file(slave)["epoch_start"] == replicated
    for i in range(20):
        r = master.client.invoke(slave_addr, send_command("Fo", b"y%d" % i, queue_id=i % 4))
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)

    old = restart_broker(master.node)                # its command line still says master
    slaves.made.append(old)
    old_addr = master.addr
    wait_until(lambda: brokers(reg) == {0: slave_addr, 1: old_addr}, timeout=30,
               message="the old master registered as a slave")
    assert brokers(plain) == {0: slave_addr, 1: old_addr}         # never routed there as master again
    assert role_file(old) == {"role": "slave", "broker_id": 1, "epoch": 1, "epoch_start": -1, "truncate_to": -1}
    old.logged(f"commitlog cut from {tail_end} to {replicated}", "demoted")
    end = assert_same_log(slave, old)                # the tail is gone; the new master's messages replicated
    assert end > replicated
    wait_until(lambda: field(old, "commitlog.dispatched") == end, timeout=10, message="the old master's dispatch")
    queues = [max_offset(master.client, addr, q) for addr in (slave_addr, old_addr) for q in range(4)]
    assert queues[:4] == queues[4:] == [18, 18, 17, 17]     # 50 + 20 messages; the tail's offsets reused
    # a client with the old route: its send reaches the new master through the old one, now its slave
    passed = master.client.invoke(old_addr, send_command("Fo", b"stale route", queue_id=0))
    assert passed.code == ResponseCode.SUCCESS, (passed.code, passed.remark)
    assert passed.ext_fields["msgId"].startswith(pack_host("127.0.0.1", slave.port).hex().upper())
    assert passed.ext_fields["queueOffset"] == "18"


def test_a_failover_master_takes_no_sends_until_a_failover_registry_confirms_it(tmp_path, start_node):
    plain = launch_node(tmp_path / "plain-registry", {}, role="registry")
    try:
        master = start_node({"topics": "Fo:4", "registry": f"127.0.0.1:{plain.port}", **FAILOVER})
        wait_until(lambda: "no failover registry has confirmed this master" in master.node.log_text(), timeout=10,
                   message="the fence's log line")
        r = master.call(send_command("Fo", b"fenced"))
        assert r.code == ResponseCode.NO_PERMISSION, (r.code, r.remark)
        assert field(master.node, "flag.read_only") == 1
    finally:
        plain.reap()


def test_a_failover_master_started_before_its_registry_is_confirmed_within_seconds(registry, start_node):
    """A fenced master registers every second, not every register_interval (30 s)."""
    assert registry.stop() == 0
    master = start_node({"topics": "Fo:4", "registry": registry.addr, **FAILOVER})
    assert field(master.node, "flag.read_only") == 1
    registry.registry_port = registry.port              # restart_broker's bookkeeping
    again = restart_broker(registry, role="registry")
    try:
        wait_until(lambda: taking_sends(master.node), timeout=10, message="the registry to confirm the master")
        assert master.call(send_command("Fo", b"confirmed")).code == ResponseCode.SUCCESS
    finally:
        again.reap()


def test_with_acl_the_registry_signs_and_a_promotion_needs_an_admin_account(tmp_path, start_node, slaves):
    """NOTIFY_BROKER_ROLE_CHANGED is admin-only on an ACL broker: unsigned it is refused, so the
    failover registry signs its calls with its own account (acl_access_key)."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    node = launch_node(tmp_path / "registry", {**FAILOVER, "failover_delay": 1.0, "acl_access_key": "ops-access",
                                               "acl_secret_key": "ops-secret-1"}, role="registry")
    try:
        reg = f"127.0.0.1:{node.port}"
        guarded = {"registry": reg, "acl_enable": "true", "acl_file": str(acl), **FAILOVER}
        master = start_node({"topics": "Fo:4", **guarded})
        slave = slaves(master.node, {**guarded, "acl_access_key": "ops-access", "acl_secret_key": "ops-secret-1"})
        slave_addr = f"127.0.0.1:{slave.port}"
        refused = master.client.invoke(slave_addr, RemotingCommand(RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                                                                   ext_fields={"masterEpoch": "7"}))
        assert refused.code != ResponseCode.SUCCESS and role_file_missing(slave)     # unsigned: no promotion
        wait_until(lambda: taking_sends(master.node), timeout=10, message="the registry to confirm the master")
        master.node.kill()
        wait_until(lambda: brokers(reg) == {0: slave_addr} and taking_sends(slave), timeout=30,
                   message="the slave promoted through its ACL")
        assert role_file(slave)["epoch"] == 1
    finally:
        node.reap()


ACL = """
accounts:
  - accessKey: ops-access
    secretKey: ops-secret-1
    admin: true
"""


def role_file_missing(node) -> bool:
    return not (node.store / "config" / "role.json").exists()


def test_a_slave_away_at_the_election_comes_back_with_what_the_new_master_never_had_cut(registry, start_node,
                                                                                        slaves):
    """Async replication: the second slave copied 20 messages the first never had, then stopped;
    the master died and the first was promoted. The second, back, is told where the new term began,
    cuts what only the old master and it held, and follows the new master byte for byte."""
    reg = registry.addr
    settings = {"registry": reg, **FAILOVER}
    master = start_node({"topics": "Fo:4", **settings})
    first, second = slaves(master.node, settings), slaves(master.node, {**settings, "broker_id": 2})
    wait_until(lambda: taking_sends(master.node), timeout=10, message="the registry to confirm the master")
    send_raw(master, "x", 50)
    both = caught_up(master.node, first)
    caught_up(master.node, second)
    assert first.stop() == 0
    send_raw(master, "y", 20)
    ahead = caught_up(master.node, second)
    assert second.stop() == 0
    master.node.kill()

    first = restart_broker(first, role="slave")
    slaves.made.append(first)
    first_addr = f"127.0.0.1:{first.port}"
    wait_until(lambda: brokers(reg).get(0) == first_addr and taking_sends(first), timeout=30,
               message="the first slave promoted")
    assert role_file(first)["epoch_start"] == both
    second = restart_broker(second, role="slave")
    slaves.made.append(second)
    wait_until(lambda: role_epoch(second) == 1 and f"commitlog cut from {ahead} to {both}" in second.log_text(),
               timeout=30, message="the second slave cut back to the new term's start")
    send_raw(master, "z", 10, first_addr)
    assert assert_same_log(first, second) > both


def send_raw(broker, prefix: str, count: int, addr: str | None = None) -> None:
    for i in range(count):
        cmd = send_command("Fo", f"{prefix}{i}".encode(), queue_id=i % 4)
        r = broker.client.invoke(addr, cmd) if addr else broker.call(cmd)
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
