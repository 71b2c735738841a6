"""The RocketMQ C++ client (PyPI `rocketmq` 0.4.4) through an automatic failover: after the master
is killed (-9) and the registry has promoted its slave, a C++ producer sends to the new master and
the C++ consumer group reads exactly the messages sent since, from its copied offsets. To the
client a promotion is a route whose brokerId 0 has moved to another address."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.nodes import launch_node
from tests.support.broker import committed_total, offset_command, start_broker, start_slave
from smartgo.client import Admin
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import RequestCode
from tests.support.waits import wait_until

from ..broker.test_failover import FAILOVER, brokers, taking_sends
from .conftest import cpp

pytestmark = pytest.mark.timeout(150)


def test_cpp_clients_go_on_at_the_promoted_slave(cpp_home, tmp_path):
    registry_node = launch_node(tmp_path / "registry", {**FAILOVER, "failover_delay": 1.0}, role="registry")
    nodes = [registry_node]
    try:
        registry = f"127.0.0.1:{registry_node.port}"
        master = start_broker(tmp_path / "master", {"topics": "CppFo:4", "registry": registry,
                                                    "replication": "sync", **FAILOVER})
        nodes.append(master)
        slave = start_slave(tmp_path / "slave", master, {"registry": registry, **FAILOVER})
        nodes.append(slave)
        slave_addr = f"127.0.0.1:{slave.port}"
        wait_until(lambda: taking_sends(master), timeout=10, message="the registry to confirm the master")
        push = {"op": "push", "topic": "CppFo", "group": "CG_CPP_FO", "expect": 100, "timeoutS": 60, "settleS": 1}
        first_sent = cpp(cpp_home, registry, [{"op": "send", "topic": "CppFo", "n": 100}])[0]
        first = cpp(cpp_home, registry, [push])[0]
        wait_until(lambda: committed_total(slave_addr, "CppFo", "CG_CPP_FO", 4) == 100, timeout=20,
                   message="the group's offsets on the slave")
        master.kill()

        wait_until(lambda: brokers(registry) == {0: slave_addr} and taking_sends(slave), timeout=30,
                   message="the slave promoted")
        second_sent = cpp(cpp_home, registry, [{"op": "send", "topic": "CppFo", "n": 100}])[0]
        second = cpp(cpp_home, registry, [push], timeout=120)[0]
        assert all(r["status"] == 0 for r in first_sent + second_sent)          # SEND_OK
        assert sorted(m["msgId"] for m in first) == sorted(r["msgId"] for r in first_sent)
        assert sorted(m["msgId"] for m in second) == sorted(r["msgId"] for r in second_sent)
    finally:
        for node in nodes:
            node.reap()


def test_a_cpp_producer_kept_running_through_a_switchover_sends_again_within_seconds(cpp_home, tmp_path):
    """Through `elect-master` the C++ client keeps sending to the old master's address until it
    re-reads its route; a moment later that is the new master's slave, which passes the sends on
    (slave_forward_writes). Sends fail only while the old master is fenced and restarts (~0.4 s
    here; ~2 s without the forwarding, when this client's own route refresh is what ends it), and
    every SEND_OK is consumed afterwards."""
    registry_node = launch_node(tmp_path / "registry", {**FAILOVER}, role="registry")
    nodes = [registry_node]
    try:
        registry = f"127.0.0.1:{registry_node.port}"
        master = start_broker(tmp_path / "master", {"topics": "CppSw:4", "registry": registry, **FAILOVER})
        nodes.append(master)
        slave = start_slave(tmp_path / "slave", master, {"registry": registry, **FAILOVER})
        nodes.append(slave)
        slave_addr = f"127.0.0.1:{slave.port}"
        wait_until(lambda: taking_sends(master) and brokers(registry) == {0: f"127.0.0.1:{master.port}",
                                                                          1: slave_addr},
                   timeout=10, message="a confirmed master and its slave registered")
        results: list = []
        sender = threading.Thread(target=lambda: results.extend(cpp(cpp_home, registry, [
            {"op": "sendFor", "topic": "CppSw", "seconds": 14, "intervalMs": 50}], timeout=60)[0]))
        sender.start()
        try:
            wait_until(lambda: max_offsets(master, "CppSw") >= 20, timeout=20, message="the C++ producer sending")
            with Admin(registry) as admin:
                switched = time.time()
                assert admin.elect_master("broker-a", broker_addr=slave_addr)["masterAddress"] == slave_addr
        finally:
            sender.join(60)
        assert results and not sender.is_alive()
        after = [r for r in results if r["at"] > switched]
        failed = [r for r in after if "error" in r]
        ok = [r for r in after if "error" not in r]
        print(f"C++ sends after the switchover: {len(ok)} SEND_OK, {len(failed)} failed, the last failure "
              f"{max((r['at'] for r in failed), default=switched) - switched:.2f}s after it")
        assert all(r["status"] == 0 for r in results if "error" not in r)
        assert all(r["at"] - switched < 5 for r in failed), failed[-3:]     # not its 30 s route poll
        assert len(ok) > 50 and ok[-1]["at"] - switched > 10                   # and SEND_OK from then on
        assert all("error" not in r for r in results if r["at"] < switched - 0.5)
        acked = {r["msgId"] for r in results if "error" not in r}
        push = {"op": "push", "topic": "CppSw", "group": "CG_CPP_SW", "expect": len(acked), "timeoutS": 60}
        consumed = {m["msgId"] for m in cpp(cpp_home, registry, [push], timeout=120)[0]}
        assert acked <= consumed                                            # nothing acknowledged was lost
    finally:
        for node in nodes:
            node.reap()


def max_offsets(node, topic: str) -> int:
    with BlockingRemotingClient() as client:
        return sum(int(client.invoke(f"127.0.0.1:{node.port}", offset_command(RequestCode.GET_MAX_OFFSET, topic, q))
                       .ext_fields["offset"]) for q in range(4))
