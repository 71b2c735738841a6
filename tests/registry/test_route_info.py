"""RouteInfoManager semantics without the network (RocketMQ's RouteInfoManager rules)."""

from __future__ import annotations

from smartgo.registry.route_info import (DataVersion, RegisterBrokerBody, RouteInfoManager,
                                         TopicConfig)

from .conftest import FakeClock


def body(topics: dict[str, int], counter: int = 1) -> RegisterBrokerBody:
    return RegisterBrokerBody(DataVersion(1000, counter), {t: TopicConfig(t, q, q) for t, q in topics.items()})


def test_master_registration_builds_the_four_tables() -> None:
    routes = RouteInfoManager(FakeClock())
    result = routes.register_broker("C", "a:10911", "broker-a", 0, "a:10912", body({"T": 4, "U": 2}), "chan-a")
    assert result.master_addr is None and result.ha_server_addr is None
    assert routes.cluster_addr_table == {"C": {"broker-a"}}
    assert routes.broker_addr_table["broker-a"].broker_addrs == {0: "a:10911"}
    assert routes.topic_queue_table["T"]["broker-a"].read_queue_nums == 4
    assert routes.broker_live_table["a:10911"].ha_server_addr == "a:10912"
    route = routes.pickup_topic_route("T")
    assert route is not None and [b.broker_name for b in route.broker_datas] == ["broker-a"]
    assert routes.pickup_topic_route("missing") is None


def test_slaves_never_change_queue_data_and_learn_their_master() -> None:
    routes = RouteInfoManager(FakeClock())
    orphan = routes.register_broker("C", "s:10911", "broker-a", 1, "s:10912", body({"T": 8}), "chan-s")
    assert orphan.master_addr is None                   # no master yet
    assert "T" not in routes.topic_queue_table          # slave topics are ignored
    routes.register_broker("C", "m:10911", "broker-a", 0, "m:10912", body({"T": 4}), "chan-m")
    again = routes.register_broker("C", "s:10911", "broker-a", 1, "s:10912", body({"T": 8}, 9), "chan-s")
    assert (again.master_addr, again.ha_server_addr) == ("m:10911", "m:10912")
    assert routes.topic_queue_table["T"]["broker-a"].read_queue_nums == 4
    assert routes.broker_addr_table["broker-a"].broker_addrs == {0: "m:10911", 1: "s:10911"}


def test_queue_data_changes_only_with_the_data_version() -> None:
    routes = RouteInfoManager(FakeClock())
    routes.register_broker("C", "m:1", "b", 0, "m:2", body({"T": 4}, counter=1), None)
    routes.register_broker("C", "m:1", "b", 0, "m:2", body({"T": 16}, counter=1), None)
    assert routes.topic_queue_table["T"]["b"].read_queue_nums == 4       # same version: ignored
    routes.register_broker("C", "m:1", "b", 0, "m:2", body({"T": 16, "New": 1}, counter=2), None)
    assert routes.topic_queue_table["T"]["b"].read_queue_nums == 16
    routes.register_broker("C", "m:1", "b", 0, "m:2", body({"Only": 1}, counter=3), None)
    assert set(routes.topic_queue_table) == {"T", "New", "Only"}         # increments keep old topics


def test_promoted_slave_keeps_one_entry_per_address() -> None:
    routes = RouteInfoManager(FakeClock())
    routes.register_broker("C", "s:1", "b", 1, "s:2", body({}), None)
    routes.register_broker("C", "s:1", "b", 0, "s:2", body({"T": 4}), None)
    assert routes.broker_addr_table["b"].broker_addrs == {0: "s:1"}
    assert "T" in routes.topic_queue_table


def test_unregister_removes_queues_only_with_the_last_address() -> None:
    routes = RouteInfoManager(FakeClock())
    routes.register_broker("C", "m:1", "b", 0, "m:2", body({"T": 4}), None)
    routes.register_broker("C", "s:1", "b", 1, "s:2", body({}), None)
    routes.unregister_broker("C", "m:1", "b", 0)
    assert routes.pickup_topic_route("T") is not None       # the slave still serves reads
    routes.unregister_broker("C", "s:1", "b", 7)             # wrong id: nothing happens
    assert routes.broker_addr_table["b"].broker_addrs == {1: "s:1"}
    routes.unregister_broker("C", "s:1", "b", 1)
    assert routes.topic_queue_table == {} and routes.broker_addr_table == {} and routes.cluster_addr_table == {}
    assert routes.broker_live_table == {}


def test_expiry_and_connection_loss() -> None:
    clock = FakeClock()
    routes = RouteInfoManager(clock)
    routes.register_broker("C", "a:1", "a", 0, "a:2", body({"T": 4}), "chan-a")
    routes.register_broker("C", "b:1", "b", 0, "b:2", body({"T": 4}), "chan-b")
    clock.advance(100)
    routes.update_broker_info_update_timestamp("b:1")       # QUERY_DATA_VERSION counts as a heartbeat
    clock.advance(21)
    assert routes.scan_not_active_brokers(120) == [("a:1", "chan-a")]
    assert [q.broker_name for q in routes.topic_queue_table["T"].values()] == ["b"]
    assert routes.on_channel_destroy("unknown") is None
    assert routes.on_channel_destroy("chan-b") == "b:1"
    assert routes.topic_queue_table == {} and routes.broker_live_table == {}


def test_a_new_connection_takes_over_the_broker() -> None:
    routes = RouteInfoManager(FakeClock())
    routes.register_broker("C", "a:1", "a", 0, "a:2", body({"T": 4}), "old")
    routes.register_broker("C", "a:1", "a", 0, "a:2", body({"T": 4}), "new")
    assert routes.on_channel_destroy("old") is None          # a stale connection closing changes nothing
    assert routes.pickup_topic_route("T") is not None


def test_admin_operations() -> None:
    routes = RouteInfoManager(FakeClock())
    routes.register_broker("C1", "a:1", "a", 0, "a:2", body({"T": 4, "U": 1}), None)
    routes.register_broker("C2", "b:1", "b", 0, "b:2", body({"T": 4, "V": 1}), None)
    assert sorted(routes.topics_by_cluster("C1")) == ["T", "U"] and routes.topics_by_cluster("none") == []
    version = routes.version
    assert routes.wipe_write_perm_of_broker("a") == 2
    assert routes.topic_queue_table["T"]["a"].perm == 4 and routes.topic_queue_table["T"]["b"].perm == 6
    assert routes.version > version
    routes.delete_topic("T", "C1")
    assert list(routes.topic_queue_table["T"]) == ["b"]
    routes.delete_topic("T")
    assert sorted(routes.all_topics()) == ["U", "V"]
    assert routes.query_broker_topic_config("a:1") == DataVersion(1000, 1)
    assert routes.is_broker_topic_config_changed("a:1", DataVersion(1000, 2))
    assert not routes.is_broker_topic_config_changed("a:1", DataVersion(1000, 1))


def test_a_wipe_holds_through_the_brokers_registrations_until_added_back_or_its_master_restarts() -> None:
    routes = RouteInfoManager(FakeClock())
    routes.register_broker("C", "a:1", "a", 0, "a:2", body({"T": 4}), "chan")
    routes.register_broker("C", "b:1", "b", 0, "b:2", body({"T": 4}), None)
    assert routes.wipe_write_perm_of_broker("a") == 1
    routes.register_broker("C", "a:1", "a", 0, "a:2", body({"T": 4}), "chan")                 # every 30 s
    routes.register_broker("C", "a:1", "a", 0, "a:2", body({"T": 4, "U": 2}, counter=2), "chan")   # a topic change
    perms = lambda topic: {n: q.perm for n, q in routes.topic_queue_table[topic].items()}  # noqa: E731
    assert perms("T") == {"a": 4, "b": 6} and perms("U") == {"a": 4}          # 4.x would give U, and T, back WRITE
    version = routes.version
    assert routes.add_write_perm_of_broker("a") == 2 and routes.version > version
    assert perms("T") == {"a": 6, "b": 6} and perms("U") == {"a": 6}
    routes.register_broker("C", "a:1", "a", 0, "a:2", body({"T": 4, "U": 2}, counter=3), "chan")
    assert perms("U") == {"a": 6}
    routes.wipe_write_perm_of_broker("a")
    routes.unregister_broker("C", "a:1", "a", 0)                             # a clean stop, or a crash:
    routes.register_broker("C", "a:1", "a", 0, "a:2", body({"T": 4}, counter=4), "again")
    assert perms("T") == {"a": 6, "b": 6}                                   # back writable, as with 4.x
    routes.wipe_write_perm_of_broker("a")
    routes.on_channel_destroy("again")
    routes.register_broker("C", "a:1", "a", 0, "a:2", body({"T": 4}, counter=5), "third")
    assert perms("T") == {"a": 6, "b": 6} and routes.wipe_write_perm_of_broker("nobody") == 0
