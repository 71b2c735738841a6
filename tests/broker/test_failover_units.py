"""The broker's side of automatic failover without nodes: the role file over --role, and the
role manager's answers to promotions and demotions, garbled ones included."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from smartgo.broker.ha import failover
from smartgo.broker.channel import ClientRef
from smartgo.broker.ha.failover import RoleState
from smartgo.broker.recovery import Recovered, save as save_recovered
from smartgo.broker.ha.role_manager import RoleManager
from smartgo.config import NodeConfig
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from tests.support.waits import free_port

pytestmark = pytest.mark.timeout(30)


def node_config(tmp_path: Path, role: str = "slave", enable: bool = True, **kw) -> NodeConfig:
    return NodeConfig(role=role, store_dir=str(tmp_path / "store"), failover_enable=enable, **kw).resolved(10911)


class StubBroker:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.log = logging.getLogger("test.failover")
        self.sent: list[dict] = []
        self.ctx = SimpleNamespace(run_path=config.run_path, control=SimpleNamespace(send=self.sent.append))
        self.registrar = SimpleNamespace(registries=["127.0.0.1:9876"])
        self.written = 0
        self.board = SimpleNamespace(scalars=lambda: {"commitlog.written": self.written})
        self.permission_published = 0
        self.tasks: list = []

    def publish_permission(self) -> None:
        self.permission_published += 1

    def spawn(self, coro, name: str) -> None:
        self.tasks.append(coro)

    def apply_master_state(self, state) -> None:
        raise AssertionError("no master answered: nothing to apply")


def notify(epoch: str) -> RemotingCommand:
    return RemotingCommand(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext_fields={
        "masterAddress": "127.0.0.1:10911", "masterEpoch": epoch, "masterBrokerId": "0"})


REGISTRY = ClientRef("net0", 1, "127.0.0.1:9876")


def test_the_role_file_wins_over_the_command_line_only_with_failover(tmp_path) -> None:
    cfg = node_config(tmp_path, replication="sync")
    assert failover.apply(cfg).replication == "async"          # a slave follows; sync is for its master terms
    failover.save(cfg.store_path, RoleState("master", 0, 2, 4096))
    promoted = failover.apply(cfg)
    assert (promoted.role, promoted.broker_id, promoted.replication) == ("master", 0, "sync")
    off = node_config(tmp_path, enable=False)
    assert failover.apply(off) is off
    (cfg.store_path / failover.ROLE_FILE).write_text('{"role": "master", "broker_id": 3}')   # inconsistent
    assert not (cfg.store_path / (failover.ROLE_FILE + ".bak")).exists()     # one save: no backup yet
    assert failover.apply(cfg).role == "slave"                 # a corrupt file is logged and ignored


def test_a_promotion_is_written_and_the_node_restarted(tmp_path) -> None:
    cfg = node_config(tmp_path)
    broker = StubBroker(cfg)
    roles = RoleManager(broker)
    assert not roles.fenced and roles.register_fields() == {"failoverEpoch": "0"}
    assert roles.notify_role_changed(REGISTRY, notify("0")).code == ResponseCode.SYSTEM_ERROR   # not a later epoch
    assert roles.notify_role_changed(REGISTRY, notify("1")).code == ResponseCode.SUCCESS
    assert failover.load(cfg.store_path) == RoleState("master", 0, 1)
    assert broker.sent == [{"op": "restart", "reason": "promoted to master at epoch 1 by 127.0.0.1:9876"}]
    assert roles.notify_role_changed(REGISTRY, notify("2")).code == ResponseCode.SYSTEM_ERROR   # already changing


def test_a_new_master_records_where_its_term_began_and_is_fenced_until_confirmed(tmp_path, caplog) -> None:
    cfg = node_config(tmp_path)
    failover.save(cfg.store_path, RoleState("master", 0, 1))
    cfg.run_path.mkdir(parents=True)
    save_recovered(cfg.run_path, Recovered(8192, 0, 0, False))
    broker = StubBroker(failover.apply(cfg))
    roles = RoleManager(broker)
    roles.start()
    assert roles.fenced and failover.load(cfg.store_path).epoch_start == 8192
    assert roles.register_fields() == {"failoverEpoch": "1", "epochStart": "8192"}
    with caplog.at_level("ERROR", logger="test.failover"):
        for _ in range(3):
            roles.on_registered(None)                          # no failover registry answered
    assert roles.fenced and broker.permission_published == 0
    assert caplog.text.count("no failover registry has confirmed this master") == 1   # once a minute
    roles.on_registered({"failoverEpoch": "1"})
    assert not roles.fenced and broker.permission_published == 1


def test_a_demotion_is_written_with_its_cut_and_a_garbled_one_is_refused(tmp_path, caplog) -> None:
    cfg = node_config(tmp_path, role="master")
    broker = StubBroker(cfg)
    roles = RoleManager(broker)
    roles.on_registered({"demote": "true", "failoverEpoch": "1", "brokerId": "x1", "masterAddr": "b:1"})
    assert broker.sent == [] and "unreadable demotion" in caplog.text
    roles.on_registered({"demote": "true", "failoverEpoch": "1", "brokerId": "2", "truncateOffset": "4096",
                         "masterAddr": "b:1"})
    assert failover.load(cfg.store_path) == RoleState("slave", 2, 1, truncate_to=4096)
    assert broker.sent[0]["op"] == "restart" and "b:1 is the master at epoch 1" in broker.sent[0]["reason"]


def test_a_broker_without_failover_refuses_promotions_and_sends_no_epoch(tmp_path) -> None:
    roles = RoleManager(StubBroker(node_config(tmp_path, enable=False)))
    response = roles.notify_role_changed(REGISTRY, notify("1"))
    assert response.code == ResponseCode.SYSTEM_ERROR and "failover_enable is off" in response.remark
    assert roles.register_fields() == {} and not roles.fenced


def test_a_slave_learns_a_later_term_and_cuts_only_what_the_new_master_never_had(tmp_path) -> None:
    cfg = node_config(tmp_path)
    cfg.run_path.mkdir(parents=True)
    save_recovered(cfg.run_path, Recovered(0, 0, 0, False))
    broker = StubBroker(cfg)
    roles = RoleManager(broker)
    roles.on_registered({"failoverEpoch": "1"})                             # the term's start not known yet
    assert failover.load(cfg.store_path) is None and roles.state.epoch == 0
    broker.written = 4096
    roles.on_registered({"failoverEpoch": "1", "truncateOffset": "4096"})   # holds no more than the new master
    assert failover.load(cfg.store_path) == RoleState("slave", 1, 1) and broker.sent == []
    assert roles.register_fields() == {"failoverEpoch": "1"}
    broker.written = 9000
    roles.on_registered({"failoverEpoch": "3", "truncateOffset": "8192"})   # away at an election, ahead of it
    assert failover.load(cfg.store_path) == RoleState("slave", 1, 3, truncate_to=8192)
    assert broker.sent[0]["op"] == "restart" and "up to 9000" in broker.sent[0]["reason"]


def test_a_slave_whose_replication_has_not_published_yet_judges_by_its_recovered_end(tmp_path) -> None:
    cfg = node_config(tmp_path)
    cfg.run_path.mkdir(parents=True)
    save_recovered(cfg.run_path, Recovered(9000, 0, 0, False))
    broker = StubBroker(cfg)                                # board: commitlog.written still 0
    RoleManager(broker).on_registered({"failoverEpoch": "1", "truncateOffset": "8192"})
    assert failover.load(cfg.store_path) == RoleState("slave", 1, 1, truncate_to=8192)


def test_a_master_handed_over_is_fenced_until_the_switchover_ends(tmp_path) -> None:
    cfg = node_config(tmp_path, role="master")
    broker = StubBroker(cfg)
    roles = RoleManager(broker)
    roles.on_registered({"failoverEpoch": "0"})               # a confirmed master
    assert not roles.fenced and broker.permission_published == 1
    assert roles.notify_role_changed(REGISTRY, notify("0")).code == ResponseCode.SYSTEM_ERROR   # not a later epoch
    assert not roles.fenced
    assert roles.notify_role_changed(REGISTRY, notify("1")).code == ResponseCode.SUCCESS
    assert roles.fenced and broker.permission_published == 2 and broker.sent == []     # no restart: it still serves
    assert failover.load(cfg.store_path) is None                                         # nor a new role
    roles.on_registered({"failoverEpoch": "0", "switching": "true"})
    assert roles.fenced                                        # the registry waits for the slave
    roles.on_registered({"failoverEpoch": "0"})                # the switchover failed: sends again
    assert not roles.fenced and broker.permission_published == 3


def test_a_slave_promoted_by_a_switchover_copies_the_old_masters_tables_first(tmp_path, caplog) -> None:
    cfg = node_config(tmp_path)
    broker = StubBroker(cfg)
    roles = RoleManager(broker)
    request = notify("1")
    request.ext_fields["syncFrom"] = f"127.0.0.1:{free_port()}"      # gone meanwhile: the copy fails
    assert roles.notify_role_changed(REGISTRY, request).code == ResponseCode.SUCCESS
    assert broker.sent == [] and len(broker.tasks) == 1          # not before the copy
    assert roles.notify_role_changed(REGISTRY, notify("2")).code == ResponseCode.SYSTEM_ERROR   # changing
    asyncio.run(broker.tasks[0])
    assert "no last copy of" in caplog.text and failover.load(cfg.store_path) == RoleState("master", 0, 1)
    assert broker.sent[0]["op"] == "restart" and "with the last copy of" in broker.sent[0]["reason"]
