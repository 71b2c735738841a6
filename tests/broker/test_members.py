"""The persisted member table (members.py) and the presumed members a restarted broker actor
serves from it (ClientTable.restore / expire_presumed), on an injected clock."""

from __future__ import annotations

import logging

from smartgo.broker.channel import ClientRef
from smartgo.broker.managers.clients import ClientTable
from smartgo.broker.managers.members import FILE, MemberFile
from tests.support.broker import heartbeat_body
from smartgo.common.heartbeat import parse_heartbeat

from .test_control_units import Clock

TTL = 35.0


def beat(table: ClientTable, conn: int, client_id: str, consumers: dict[str, dict[str, str]]):
    hb = parse_heartbeat(heartbeat_body(client_id, consumers, version=7))
    return table.heartbeat(ClientRef("net-0", conn, f"127.0.0.1:{conn}"), hb, 3, 409)


def saved_table(tmp_path, clock: Clock) -> ClientTable:
    """Members a@1 and b@2 of G (topic T, tag A) and c@3 of H, saved; a new table restored from the file."""
    before = ClientTable()
    beat(before, 1, "a@1", {"G": {"T": "A"}})
    beat(before, 2, "b@2", {"G": {"T": "A"}})
    beat(before, 3, "c@3", {"H": {"T": "*"}})
    assert MemberFile(tmp_path).save(before.consumers.values())
    after = ClientTable(clock=clock)
    after.restore(MemberFile(tmp_path).load(), TTL)
    return after


def test_restored_members_are_listed_and_their_subscriptions_serve(tmp_path):
    table = saved_table(tmp_path, Clock())
    assert table.consumer_ids("G") == ["a@1", "b@2"] and table.consumer_ids("H") == ["c@3"]
    sub = table.subscription("G", "T")
    assert (sub.sub_string, sub.tags_set, sub.sub_version) == ("A", ["A"], 7)
    assert table.consumers["G"].message_model == "CLUSTERING"
    assert table.consumer_channels("G") == [] and table.consumer_refs("G") == []     # no connection: not notified
    assert table.presumed_count() == 3


def test_a_real_heartbeat_replaces_a_presumed_member_without_a_notification(tmp_path):
    table = saved_table(tmp_path, Clock())
    changes = beat(table, 9, "a@1", {"G": {"T": "A"}})
    assert changes.notify == set() and changes.state == set()       # the id list and the state stay
    assert table.consumer_ids("G") == ["a@1", "b@2"]
    assert [ch.client_id for ch in table.consumer_channels("G")] == ["a@1"]
    assert table.presumed_count() == 2
    assert beat(table, 10, "new@4", {"G": {"T": "A"}}).notify == {"G"}     # a new member is news


def test_presumed_members_leave_at_the_ttl(tmp_path):
    clock = Clock()
    table = saved_table(tmp_path, clock)
    beat(table, 9, "a@1", {"G": {"T": "A"}})
    clock.now += TTL - 1
    assert not table.expire_presumed() and table.consumer_ids("G") == ["a@1", "b@2"]
    clock.now += 1
    table.dirty = False
    changes = table.expire_presumed()
    assert changes.notify == {"G"}                      # a@1 stays and is told b@2 left
    assert changes.state == {"H"}                       # nobody came back for H: its subscriptions go
    assert table.consumer_ids("G") == ["a@1"] and "H" not in table.consumers
    assert table.dirty and table.presumed_count() == 0
    assert not table.expire_presumed()                  # once


def test_the_last_real_member_leaving_keeps_a_group_with_presumed_ones(tmp_path):
    table = saved_table(tmp_path, Clock())
    beat(table, 9, "a@1", {"G": {"T": "A"}})
    changes = table.connection_closed("net-0", 9)
    assert changes.notify == {"G"} and table.consumer_ids("G") == ["b@2"]
    assert table.subscription("G", "T") is not None


def test_a_presumed_member_that_unregisters_leaves_at_once(tmp_path):
    """A client that stops before it heartbeat the restarted broker: its UNREGISTER_CLIENT comes
    on a new connection, which is no member; the id it names is."""
    table = saved_table(tmp_path, Clock())
    ref = ClientRef("net-0", 20, "127.0.0.1:20")
    assert table.unregister(ref, None, "G", "b@2").notify == {"G"}
    assert table.consumer_ids("G") == ["a@1"]
    assert table.unregister(ref, None, "H", "c@3").state == {"H"} and "H" not in table.consumers
    assert not table.unregister(ref, None, "G", "nobody@9")


def test_the_file_is_written_only_when_the_table_changed(tmp_path):
    table = ClientTable()
    members = MemberFile(tmp_path)
    beat(table, 1, "a@1", {"G": {"T": "A"}})
    assert table.dirty and members.save(table.consumers.values())
    table.dirty = False
    beat(table, 1, "a@1", {"G": {"T": "A"}})            # a steady heartbeat
    assert not table.dirty and not members.save(table.consumers.values())
    beat(table, 2, "b@2", {"G": {"T": "A"}})
    assert table.dirty and members.save(table.consumers.values())
    assert [g.client_ids for g in MemberFile(tmp_path).load()] == [("a@1", "b@2")]


def test_a_corrupt_file_is_logged_and_read_as_no_members(tmp_path, caplog):
    (tmp_path / FILE).parent.mkdir(parents=True)
    (tmp_path / FILE).write_bytes(b'{"consumerGroups": {"G": {"clientIds": [], "messageModel": 5}}')
    with caplog.at_level(logging.ERROR, "smartgo.common.persist"):
        assert MemberFile(tmp_path).load() == []
    assert f"consumer members {tmp_path / FILE} is corrupt" in caplog.text
    for body in (b"not json", b'{"consumerGroups": {"G": {"clientIds": [], "messageModel": 5}}}',
                 b'{"consumerGroups": {"G": {"clientIds": ["x"], "messageModel": "SIDEWAYS"}}}',
                 b'{"consumerGroups": []}'):
        (tmp_path / FILE).write_bytes(body)
        caplog.clear()
        with caplog.at_level(logging.ERROR, "smartgo.common.persist"):
            assert MemberFile(tmp_path).load() == [], body
        assert "is corrupt" in caplog.text, body
    table = ClientTable()
    table.restore(MemberFile(tmp_path).load(), TTL)
    assert table.consumers == {} and table.consumer_ids("G") == []
