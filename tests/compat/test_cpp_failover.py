"""The RocketMQ C++ client (PyPI `rocketmq` 0.4.4) through an automatic failover: after the master
is killed (-9) and the registry has promoted its slave, a C++ producer sends to the new master and
the C++ consumer group reads exactly the messages sent since, from its copied offsets. To the
client a promotion is a route whose brokerId 0 has moved to another address."""

from __future__ import annotations

import pytest

from smartgo.actors.testing import launch_node
from smartgo.broker.testing import committed_total, start_broker, start_slave
from smartgo.testing import wait_until

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
