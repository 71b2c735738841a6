"""The failover registry's decisions without the network: which registration is the master,
who is sent back as a slave and cut where, and which slave an election promotes."""

from __future__ import annotations

import asyncio
import json

import pytest

from smartgo.net import fastjson
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import RemotingError
from smartgo.registry import controller as controller_module
from smartgo.registry.controller import NO_OFFSET, Demotion, FailoverController, SwitchoverError
from smartgo.registry.kv_config import KVConfigManager
from smartgo.registry.processor import RegistryProcessors
from smartgo.registry.route_info import DataVersion, RegisterBrokerBody, RouteInfoManager

from .conftest import FakeClock

pytestmark = pytest.mark.timeout(30)

BODY = RegisterBrokerBody(DataVersion(), {})


class FakeBrokers:
    """Answers the controller's calls: each address's CommitLog end (None: no answer) and
    whether it takes a promotion."""

    def __init__(self, ends: dict[str, int | None], refuse: frozenset[str] = frozenset()) -> None:
        self.ends = ends
        self.refuse = refuse
        self.notified: list[tuple[str, dict]] = []
        self.masters: dict[str, tuple[str, int]] = {}       # address -> (brokerRole, slaveAckedOffset)
        self.on_notify = lambda addr: None
        self.silent: set[str] = set()                       # take the notice, close before answering
        self.fenced: dict[str, int] = {}                    # a fenced master: the looks until it stops writing
        self.on_look = lambda addr: None
        self.garbled: dict[str, str] = {}                   # a failoverFencedEnd that is not a number

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        if cmd.code == RequestCode.GET_BROKER_RUNTIME_INFO:
            if self.ends.get(addr) is None:
                raise RemotingError(f"{addr} refused a connection")
            self.on_look(addr)
            role, acked = self.masters.get(addr, ("SLAVE", 0))
            looks = self.fenced.get(addr)
            if looks is not None:
                self.fenced[addr] = looks - 1
            final = self.ends[addr] if looks is not None and looks <= 0 else -1
            final = self.garbled.get(addr, final)
            return cmd.make_response(ResponseCode.SUCCESS, body=fastjson.dumps({"table": {
                "commitLogMaxOffset": str(self.ends[addr]), "brokerRole": role, "slaveAckedOffset": str(acked),
                "failoverFencedEnd": str(final)}}))
        assert cmd.code == RequestCode.NOTIFY_BROKER_ROLE_CHANGED
        self.notified.append((addr, dict(cmd.ext_fields)))
        if "syncFrom" not in cmd.ext_fields:
            self.fenced.setdefault(addr, 0)                 # a switchover's fence: it stops writing at once
        self.on_notify(addr)
        if addr in self.silent:
            raise RemotingError(f"{addr} closed the connection before the response to code 1008 arrived")
        if addr in self.refuse:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "not a slave")
        return cmd.make_response(ResponseCode.SUCCESS)

    async def close(self) -> None:
        pass


def controller(tmp_path, ends=None, refuse=frozenset(), unclean=False):
    clock = FakeClock()
    routes = RouteInfoManager(clock)
    brokers = FakeBrokers(ends or {}, refuse)
    return (FailoverController(routes, tmp_path, 2.0, clock=clock, client=brokers, unclean=unclean), routes, clock,
            brokers)


def register(c, routes, addr: str, broker_id: int, epoch: int = 0, start: int = NO_OFFSET) -> Demotion | None:
    demotion = c.on_register("broker-a", addr, broker_id, epoch, start)
    if demotion is None:
        routes.register_broker("C", addr, "broker-a", broker_id, addr + "1", BODY, addr)
    return demotion


def test_the_first_master_is_taken_and_an_old_one_is_sent_back_with_its_cut(tmp_path) -> None:
    c, routes, _, _ = controller(tmp_path)
    assert register(c, routes, "m:1", 0) is None
    assert register(c, routes, "s:1", 1) is None
    assert (c.terms["broker-a"].epoch, c.terms["broker-a"].master) == (0, "m:1")
    routes.on_channel_destroy("m:1")                              # the master died; s was promoted
    routes.on_channel_destroy("s:1")
    assert register(c, routes, "s:1", 0, epoch=1, start=5000) is None
    assert c.terms["broker-a"].starts == {1: 5000} and c.terms["broker-a"].epoch == 1
    demotion = register(c, routes, "m:1", 0, epoch=0)             # the old master comes back
    assert demotion == Demotion("s:1", 1, 1, 5000)
    assert demotion.ext("s:11")["truncateOffset"] == "5000" and demotion.ext("s:11")["demote"] == "true"
    assert routes.broker_addr_table["broker-a"].broker_addrs == {0: "s:1"}      # not routed
    other = register(c, routes, "x:1", 0, epoch=1)                # the same epoch from another address
    assert other is not None and other.master == "s:1" and other.truncate_to == NO_OFFSET
    assert register(c, routes, "m:1", 1, epoch=1) is None         # as a slave it is welcome
    assert register(c, routes, "x:1", 0, epoch=2) is None         # a later epoch wins (a lost state file)
    assert c.terms["broker-a"].master == "x:1"


def test_the_state_survives_a_registry_restart_and_a_corrupt_file_is_survived(tmp_path, caplog) -> None:
    c, routes, _, _ = controller(tmp_path)
    register(c, routes, "s:1", 0, epoch=3, start=77)
    again, _, _, _ = controller(tmp_path)
    again.load()
    assert (again.terms["broker-a"].epoch, again.terms["broker-a"].master, again.terms["broker-a"].starts) == \
        (3, "s:1", {3: 77})
    (tmp_path / "failover.json").write_text("{not json")
    broken, _, _, _ = controller(tmp_path)
    broken.load()
    assert broken.terms == {} and "failover state" in caplog.text and "is corrupt" in caplog.text


def test_an_election_waits_the_delay_and_promotes_the_most_advanced_answering_slave(tmp_path) -> None:
    c, routes, clock, brokers = controller(tmp_path, {"s1:1": 900, "s2:1": 1200, "s3:1": None})
    register(c, routes, "m:1", 0)
    for i, addr in enumerate(("s1:1", "s2:1", "s3:1"), start=1):
        register(c, routes, addr, i)
    asyncio.run(c.check())
    assert brokers.notified == []                                  # the master is there
    routes.on_channel_destroy("m:1")
    asyncio.run(c.check())
    clock.advance(1.9)
    asyncio.run(c.check())
    assert brokers.notified == []                                  # not yet failover_delay
    clock.advance(0.2)
    asyncio.run(c.check())
    assert brokers.notified == [("s2:1", {"masterAddress": "s2:1", "masterEpoch": "1", "masterBrokerId": "0"})]
    assert (c.terms["broker-a"].epoch, c.terms["broker-a"].master) == (1, "s2:1")
    assert json.loads((tmp_path / "failover.json").read_text())["broker-a"]["epoch"] == 1
    asyncio.run(c.check())
    assert len(brokers.notified) == 1                              # the new master gets failover_delay to register


def test_a_refused_promotion_changes_nothing_and_is_tried_again(tmp_path) -> None:
    c, routes, clock, brokers = controller(tmp_path, {"s1:1": 900}, refuse=frozenset({"s1:1"}))
    register(c, routes, "s1:1", 1)
    asyncio.run(c.check())
    clock.advance(2.0)
    asyncio.run(c.check())
    assert len(brokers.notified) == 1 and c.terms["broker-a"].epoch == 0
    clock.advance(2.0)
    asyncio.run(c.check())
    assert len(brokers.notified) == 2 and c.terms["broker-a"].epoch == 0


def test_brokers_without_failover_are_never_promoted(tmp_path) -> None:
    c, routes, clock, brokers = controller(tmp_path, {"s1:1": 900})
    routes.register_broker("C", "s1:1", "broker-a", 1, "s1:11", BODY, "s1:1")      # registered without failover
    asyncio.run(c.check())
    clock.advance(5.0)
    asyncio.run(c.check())
    assert brokers.notified == [] and c.terms == {}


def test_a_master_that_still_answers_is_not_replaced(tmp_path, caplog) -> None:
    """Its connection to this registry dropped (or the registry restarted) but it lives: it
    registers again within its register_interval, and no slave takes its place meanwhile."""
    c, routes, clock, brokers = controller(tmp_path, {"m:1": 700, "s1:1": 700})
    register(c, routes, "m:1", 0)
    register(c, routes, "s1:1", 1)
    routes.on_channel_destroy("m:1")
    for _ in range(3):
        asyncio.run(c.check())
        clock.advance(2.0)
    assert brokers.notified == [] and caplog.text.count("is not registered but answers") == 1
    brokers.ends["m:1"] = None                                    # now it is gone
    asyncio.run(c.check())
    assert [addr for addr, _ in brokers.notified] == ["s1:1"]


def registration(processors, addr: str, broker_id: int = 0, **ext: str) -> RemotingCommand:
    """REGISTER_BROKER of addr (broker-a, no topics) through the registry's processor."""
    body = fastjson.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {},
                                                           "dataVersion": {"timestamp": 0, "counter": 0}}})
    request = RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields={
        "brokerName": "broker-a", "brokerAddr": addr, "clusterName": "C", "brokerId": str(broker_id),
        "haServerAddr": addr + "1", **ext}, body=body)
    return asyncio.run(processors.register_broker(addr, request))


def test_a_master_without_failover_cannot_take_a_failover_broker_names_route(tmp_path) -> None:
    """Through the processor: a failover master holds broker-a; the old master, restarted without
    failover_enable, is refused instead of taking brokerId 0 in the route."""
    c, routes, _, _ = controller(tmp_path)
    register(c, routes, "s:1", 0, epoch=1, start=100)
    processors = RegistryProcessors(routes, KVConfigManager(tmp_path), c)
    refused = registration(processors, "m:1")
    assert refused.code == ResponseCode.SYSTEM_ERROR and "s:1 is the master of broker-a" in refused.remark
    assert routes.broker_addr_table["broker-a"].broker_addrs == {0: "s:1"}
    assert registration(processors, "s:1").code == ResponseCode.SUCCESS    # the failover master itself, restarted plain


def test_a_registry_that_does_not_decide_keeps_the_route_from_an_older_master(tmp_path) -> None:
    """A returning old master registers with every registry before the deciding one demotes it:
    the others must not give it brokerId 0 (and lose the new master's entry when it moves to a
    slave id)."""
    routes = RouteInfoManager(FakeClock())
    processors = RegistryProcessors(routes, KVConfigManager(tmp_path))
    assert registration(processors, "s:1", failoverEpoch="1").code == ResponseCode.SUCCESS
    refused = registration(processors, "m:1", failoverEpoch="0")
    assert refused.code == ResponseCode.SYSTEM_ERROR and "s:1 is the master of broker-a at epoch 1" in refused.remark
    assert "failoverEpoch" not in (refused.ext_fields or {})     # no demotion from a registry that does not decide
    assert registration(processors, "m:1", 1, failoverEpoch="1").code == ResponseCode.SUCCESS
    assert routes.broker_addr_table["broker-a"].broker_addrs == {0: "s:1", 1: "m:1"}
    assert registration(processors, "x:1", failoverEpoch="2").code == ResponseCode.SUCCESS    # a later term
    assert registration(processors, "y:1").code == ResponseCode.SUCCESS      # without failover: 4.x's rules
    assert routes.broker_addr_table["broker-a"].broker_addrs == {0: "y:1", 1: "m:1"}


def test_an_old_master_registering_during_the_promotion_is_sent_back(tmp_path) -> None:
    """The new term is set before the promotion notice goes out: the old master, back at that very
    moment, does not get its route back under the old epoch."""
    c, routes, clock, brokers = controller(tmp_path, {"s1:1": 900})
    register(c, routes, "m:1", 0)
    register(c, routes, "s1:1", 1)
    routes.on_channel_destroy("m:1")
    seen: list[Demotion | None] = []
    notify = brokers.invoke

    async def old_master_returns(addr, cmd, timeout):
        if cmd.code == RequestCode.NOTIFY_BROKER_ROLE_CHANGED:
            seen.append(register(c, routes, "m:1", 0, epoch=0))
        return await notify(addr, cmd, timeout)
    brokers.invoke = old_master_returns
    asyncio.run(c.check())
    clock.advance(2.0)
    asyncio.run(c.check())
    # slave 1 is 0 now: the old master is slave 1 in its place
    assert seen == [Demotion("s1:1", 1, 1, NO_OFFSET)] and c.terms["broker-a"].master == "s1:1"


def test_a_slave_of_an_earlier_term_is_told_where_the_new_term_began(tmp_path) -> None:
    c, routes, _, _ = controller(tmp_path)
    assert c.answer("broker-a", 0) == {"failoverEpoch": "0"}                 # nothing known yet
    register(c, routes, "s:1", 0, epoch=2)                                  # the start of term 2 not known
    assert c.answer("broker-a", 1) == {"failoverEpoch": "1"}                # ask again later
    register(c, routes, "s:1", 0, epoch=2, start=7000)
    assert c.answer("broker-a", 1) == {"failoverEpoch": "2", "truncateOffset": "7000"}
    assert c.answer("broker-a", 2) == {"failoverEpoch": "2"}                # a follower of this term
    c.terms["broker-a"].starts[1] = 3000
    assert c.answer("broker-a", 0) == {"failoverEpoch": "2", "truncateOffset": "3000"}   # the earliest divergence


@pytest.mark.parametrize("role, unclean, promoted", [("SYNC_MASTER", False, ["s2:1"]),
                                                      ("SYNC_MASTER", True, ["s1:1"]),
                                                      ("ASYNC_MASTER", False, ["s1:1"])])
def test_a_slave_lacking_what_a_sync_master_acknowledged_is_not_promoted(tmp_path, caplog, role, unclean,
                                                                        promoted) -> None:
    """The sync master had 1,200 bytes acknowledged by s2; s2 is down when the master dies, s1 holds
    900: the registry waits for s2 (unless told to promote anyway). An async master acknowledged
    nothing on its slaves' behalf: no wait."""
    c, routes, clock, brokers = controller(tmp_path, {"m:1": 1200, "s1:1": 900, "s2:1": 1200}, unclean=unclean)
    brokers.masters["m:1"] = (role, 1200)
    register(c, routes, "m:1", 0)
    register(c, routes, "s1:1", 1)
    register(c, routes, "s2:1", 2)
    asyncio.run(c.check())                                        # polls the live master
    routes.on_channel_destroy("s2:1")
    routes.on_channel_destroy("m:1")
    brokers.ends["m:1"] = None
    for _ in range(3):
        clock.advance(2.0)
        asyncio.run(c.check())
    if promoted != ["s1:1"]:
        assert brokers.notified == [] and caplog.text.count("no slave that is up holds all it acknowledged") == 1
        register(c, routes, "s2:1", 2)                            # s2 is back
        clock.advance(2.0)
        asyncio.run(c.check())
    assert [addr for addr, _ in brokers.notified] == promoted


def test_old_masters_back_at_the_same_time_get_different_broker_ids(tmp_path) -> None:
    c, routes, _, _ = controller(tmp_path)
    register(c, routes, "a:1", 0)
    routes.on_channel_destroy("a:1")
    register(c, routes, "b:1", 0, epoch=1, start=100)             # b took over from a, then c from b
    routes.on_channel_destroy("b:1")
    register(c, routes, "c:1", 0, epoch=2, start=200)
    first, second = register(c, routes, "a:1", 0), register(c, routes, "b:1", 0, epoch=1)
    assert (first.broker_id, first.truncate_to) == (1, 100)       # neither has registered as a slave yet
    assert (second.broker_id, second.truncate_to) == (2, 200)
    assert register(c, routes, "a:1", 0).broker_id == 1          # a's next registration before it restarts
    assert register(c, routes, "a:1", 1, epoch=2) is None          # back as slave 1: its promise is kept
    assert register(c, routes, "d:1", 0, epoch=1).broker_id == 3    # 1 is a's, 2 still b's
    assert register(c, routes, "b:1", 2, epoch=2) is None
    assert routes.broker_addr_table["broker-a"].broker_addrs == {0: "c:1", 1: "a:1", 2: "b:1"}


def test_a_switchover_fences_the_master_waits_for_the_slave_and_promotes_it(tmp_path) -> None:
    c, routes, _, brokers = controller(tmp_path, {"m:1": 400, "s:1": 300})
    register(c, routes, "m:1", 0, start=0)
    register(c, routes, "s:1", 1)
    answers = []

    def notified(addr: str) -> None:
        answers.append(c.answer("broker-a", 0).get("switching"))
        brokers.ends["s:1"] = 400                                # the fenced master's last bytes arrive

    brokers.on_notify = notified
    term = asyncio.run(c.switchover("broker-a", "s:1"))
    assert (term.epoch, term.master, term.starts) == (1, "s:1", {0: 0, 1: 400})
    fence, promotion = brokers.notified
    assert fence == ("m:1", {"masterAddress": "s:1", "masterEpoch": "1", "masterBrokerId": "0"})
    assert promotion == ("s:1", {"masterAddress": "s:1", "masterEpoch": "1", "masterBrokerId": "0", "syncFrom": "m:1"})
    assert answers == ["true", "true"]                          # the master's registrations kept it fenced
    assert "switching" not in c.answer("broker-a", 1)
    assert json.loads((tmp_path / "failover.json").read_text())["broker-a"]["epoch"] == 1
    # m registers (every second while fenced) before s has restarted as master: s's slave id is m's
    assert register(c, routes, "m:1", 0) == Demotion("s:1", 1, 1, 400)
    routes.on_channel_destroy("s:1")                             # s restarts as master; m comes back
    assert register(c, routes, "s:1", 0, epoch=1, start=400) is None
    assert register(c, routes, "m:1", 0) == Demotion("s:1", 1, 1, 400)    # its cut is its own end: nothing


def test_a_switchover_takes_the_master_end_only_once_its_commit_actor_refuses_writes(tmp_path, monkeypatch) -> None:
    """A send that passed a net actor's fence check lands after the fence: the end the slave must
    hold is the one the master reports once nothing more can land (failoverFencedEnd), however
    long its end stood still before."""
    monkeypatch.setattr(controller_module, "SWITCH_POLL", 0.001)
    c, routes, _, brokers = controller(tmp_path, {"m:1": 400, "s:1": 400})
    register(c, routes, "m:1", 0, start=0)
    register(c, routes, "s:1", 1)
    looks: list[str] = []

    def look(addr: str) -> None:
        if addr == "m:1":
            looks.append(addr)
            if len(looks) == 5:
                brokers.ends["m:1"] = 500                    # a late send lands, its end still for 4 looks
            if len(looks) == 6:
                brokers.ends["s:1"] = 500                    # and is copied

    brokers.on_look = look
    brokers.fenced["m:1"] = 5                                # its commit actor sees the fence at the 6th look
    term = asyncio.run(c.switchover("broker-a", "s:1"))
    assert len(looks) == 6 and term.starts == {0: 0, 1: 500}


@pytest.mark.parametrize("slave_end,never_stops,garbled,refusal", [
    (300, False, None, r"s:1 did not catch up with m:1 within 0.02s \(CommitLog ends 300 "),
    (400, True, None, r"m:1 did not stop writing within 0.02s; it takes sends again"),
    (400, False, "4O0", r"m:1 answered the CommitLog end '4O0'")], ids=["slave-lags", "master-writes", "garbled"])
def test_a_switchover_that_cannot_finish_changes_nothing(tmp_path, monkeypatch, slave_end, never_stops, garbled,
                                                        refusal) -> None:
    monkeypatch.setattr(controller_module, "SWITCH_POLL", 0.001)
    monkeypatch.setattr(controller_module, "SWITCH_TIMEOUT", 0.02)
    c, routes, _, brokers = controller(tmp_path, {"m:1": 400, "s:1": slave_end})
    register(c, routes, "m:1", 0)
    register(c, routes, "s:1", 1)
    if never_stops:
        brokers.fenced["m:1"] = 1 << 30                          # its commit actor never reports the fence
    if garbled is not None:
        brokers.garbled["m:1"] = garbled
    with pytest.raises(SwitchoverError, match=refusal):
        asyncio.run(c.switchover("broker-a", "s:1"))
    assert [addr for addr, _ in brokers.notified] == ["m:1"]     # fenced, never promoted
    assert (c.terms["broker-a"].epoch, c.terms["broker-a"].master) == (0, "m:1")
    assert c.answer("broker-a", 0) == {"failoverEpoch": "0"}    # its next registration lifts the fence


def test_a_switchover_is_refused_for_a_broker_that_is_not_a_live_slave(tmp_path) -> None:
    c, routes, _, brokers = controller(tmp_path, {"m:1": 400, "s:1": 400})
    register(c, routes, "m:1", 0)
    register(c, routes, "s:1", 1)
    routes.register_broker("C", "p:1", "broker-a", 2, "p:11", BODY, "p:1")    # failover_enable off
    for target, why in (("m:1", "is the master of broker-a already"), ("x:1", "is not a live failover broker"),
                        ("p:1", "is not a live failover broker")):
        with pytest.raises(SwitchoverError, match=why):
            asyncio.run(c.switchover("broker-a", target))
    brokers.refuse = frozenset({"m:1"})
    with pytest.raises(SwitchoverError, match="asking m:1 to stop taking sends refused: not a slave"):
        asyncio.run(c.switchover("broker-a", "s:1"))
    assert brokers.notified[-1][0] == "m:1" and c.terms["broker-a"].master == "m:1"


def test_a_switchover_without_a_master_promotes_the_named_slave(tmp_path) -> None:
    c, routes, _, brokers = controller(tmp_path, {"s:1": 100, "t:1": 300})
    register(c, routes, "m:1", 0)
    register(c, routes, "s:1", 1)
    register(c, routes, "t:1", 2)
    routes.on_channel_destroy("m:1")
    term = asyncio.run(c.switchover("broker-a", "s:1"))         # not the most advanced: the operator's choice
    assert (term.epoch, term.master) == (1, "s:1") and [a for a, _ in brokers.notified] == ["s:1"]


def test_a_switchover_without_a_named_slave_takes_the_most_advanced(tmp_path) -> None:
    c, routes, _, brokers = controller(tmp_path, {"m:1": 400, "s:1": 300, "t:1": 400})
    register(c, routes, "m:1", 0)
    register(c, routes, "s:1", 1)
    register(c, routes, "t:1", 2)
    routes.register_broker("C", "p:1", "broker-a", 3, "p:11", BODY, "p:1")    # not a failover broker
    brokers.ends["p:1"] = 900
    term = asyncio.run(c.switchover("broker-a", None))
    assert term.master == "t:1" and [a for a, _ in brokers.notified] == ["m:1", "t:1"]
    routes.on_channel_destroy("t:1")
    routes.on_channel_destroy("s:1")
    with pytest.raises(SwitchoverError, match="broker-a has no live failover slave that answers"):
        asyncio.run(c.switchover("broker-a", None))


def test_a_promotion_without_an_answer_keeps_the_new_term(tmp_path, caplog) -> None:
    """The slave's node restart into the role can close the connection before its answer leaves:
    going back to the old term would let a fenced master take sends beside the new one."""
    c, routes, _, brokers = controller(tmp_path, {"m:1": 400, "s:1": 400})
    register(c, routes, "m:1", 0)
    register(c, routes, "s:1", 1)
    brokers.silent.add("s:1")
    term = asyncio.run(c.switchover("broker-a", "s:1"))
    assert (term.epoch, term.master, term.starts.get(1)) == (1, "s:1", 400)
    assert "no answer from s:1 to its promotion" in caplog.text
    assert register(c, routes, "m:1", 0).master == "s:1"       # the old master is sent back, not unfenced
