"""`smartgo admin topic-cluster-list / check-msg-send-rt / send-msg-status / allocate-mq` (mqadmin's
client-side tools) in-process against one real node: the answers match the node, the sends are
really stored, and a topic or broker the registry does not know is one line on stderr (and is not
auto-created); and `registry-config` / `registry-config-update` against the node's registry."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import pytest

from tests.support.broker import start_broker
from smartgo.cli import admin_tools
from smartgo.cli.errors import CliError
from smartgo.cli.main import main
from smartgo.client import Admin, MessageQueue
from tests.support.waits import wait_until

CLUSTER, BROKER_NAME = "ToolsCluster", "broker-tools"
TOPIC, QUEUES, READ_ONLY = "Orders", 8, "Archive"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[tuple[str, Admin]]:
    """(registry address, blocking admin) of one node serving TOPIC and a read-only topic, once
    the registry routes them and the broker's own topic."""
    node = start_broker(tmp_path_factory.mktemp("tools") / "node", {
        "cluster_name": CLUSTER, "broker_name": BROKER_NAME, "topics": f"{TOPIC}:{QUEUES};{READ_ONLY}:2:4"})
    try:
        registry = f"127.0.0.1:{node.registry_port}"        # type: ignore[attr-defined]
        with Admin(registry) as admin:
            wait_until(lambda: {TOPIC, READ_ONLY, BROKER_NAME} <= set(admin.topic_list()), 30, 0.1,
                       "the node's topics in the registry")
            yield registry, admin
    finally:
        node.reap()


def admin_cli(capsys, registry: str, *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "admin", *argv, "-n", registry)


def test_topic_cluster_list_names_the_nodes_cluster(node, capsys):
    registry, _ = node
    status, out, err = admin_cli(capsys, registry, "topic-cluster-list", "--topic", TOPIC, "--json")
    assert status == 0, err
    assert json.loads(out) == {"topic": TOPIC, "clusters": {CLUSTER: [BROKER_NAME]}}
    status, out, err = admin_cli(capsys, registry, "topic-cluster-list", "--topic", TOPIC)
    assert status == 0, err
    assert out.split() == ["CLUSTER", "BROKERS", CLUSTER, BROKER_NAME]


def test_allocate_mq_gives_every_queue_to_one_client_in_contiguous_balanced_blocks(node, capsys):
    """mqadmin allocateMQ's JSON; AllocateMessageQueueAveragely over sorted ids: 8 queues for 3
    clients are 3 + 3 + 2, in order; an id given twice counts once."""
    registry, _ = node
    status, out, err = admin_cli(capsys, registry, "allocate-mq", "--topic", TOPIC, "--ip-list", "c3,c1, c2,c1",
                                 "--json")
    assert status == 0, err
    result = {cid: [MessageQueue.from_json(mq) for mq in mqs] for cid, mqs in json.loads(out)["result"].items()}
    assert sorted(result) == ["c1", "c2", "c3"]
    given = [mq for mqs in result.values() for mq in mqs]
    assert sorted(given) == [MessageQueue(TOPIC, BROKER_NAME, q) for q in range(QUEUES)]     # each once
    assert {cid: [mq.queue_id for mq in mqs] for cid, mqs in result.items()} == {
        "c1": [0, 1, 2], "c2": [3, 4, 5], "c3": [6, 7]}
    status, out, err = admin_cli(capsys, registry, "allocate-mq", "--topic", TOPIC, "-i", "only")
    assert status == 0, err
    assert out.splitlines()[1].split() == ["only", str(QUEUES), *(f"{BROKER_NAME}:{q}" for q in range(QUEUES))]


def test_check_msg_send_rt_sends_amount_messages_round_robin(node, capsys):
    registry, admin = node
    amount, size = 10, 64
    status, out, err = admin_cli(capsys, registry, "check-msg-send-rt", "--topic", TOPIC, "--amount", str(amount),
                                 "--size", str(size), "--json")
    assert status == 0, err
    doc = json.loads(out)
    sends = doc["sends"]
    assert len(sends) == amount and {s["status"] for s in sends} == {"SEND_OK"}
    assert [s["queue_id"] for s in sends] == [i % QUEUES for i in range(amount)]      # checkMsgSendRT's selector
    assert all(s["rt_ms"] > 0 for s in sends)
    assert doc["avg_rt_ms"] == pytest.approx(sum(s["rt_ms"] for s in sends[1:]) / (amount - 1), abs=1e-3)
    stored = admin.query_by_id(sends[-1]["offset_msg_id"])
    assert [(m.topic, m.queue_id, m.body) for m in stored] == [(TOPIC, 1, b"a" * size)]
    status, out, err = admin_cli(capsys, registry, "check-msg-send-rt", "--topic", TOPIC, "--amount", "3")
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == 5 and all("SEND_OK" in line for line in lines[1:4]) and lines[4].startswith("avg RT ")


def test_send_msg_status_sends_to_the_brokers_own_topic(node, capsys):
    registry, _ = node
    status, out, err = admin_cli(capsys, registry, "send-msg-status", "--broker-name", BROKER_NAME, "--count", "5",
                                 "--size", "16", "--json")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["topic"] == BROKER_NAME and len(doc["sends"]) == 5
    assert {(s["status"], s["topic"], s["broker_name"], s["queue_id"]) for s in doc["sends"]} == {
        ("SEND_OK", BROKER_NAME, BROKER_NAME, 0)}
    offsets = [s["queue_offset"] for s in doc["sends"]]
    assert offsets == list(range(offsets[0], offsets[0] + 5))        # one after the other, in one queue


@pytest.mark.parametrize("argv, says", [
    (("check-msg-send-rt", "--topic", "NoSuchTopic"), "NoSuchTopic"),
    (("allocate-mq", "--topic", "NoSuchTopic", "--ip-list", "a,b"), "NoSuchTopic"),
    (("topic-cluster-list", "--topic", "NoSuchTopic"), "NoSuchTopic"),
    (("send-msg-status", "--broker-name", "broker-nope"), "no broker named broker-nope"),
    (("check-msg-send-rt", "--topic", READ_ONLY), "no writable queue"),
])
def test_unknown_topic_or_broker_is_one_line_and_creates_nothing(node, capsys, argv, says):
    registry, admin = node
    status, out, err = admin_cli(capsys, registry, *argv)
    assert status == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err
    assert not {"NoSuchTopic", "broker-nope"} & set(admin.topic_list())       # no auto-creation through TBW102


@pytest.mark.parametrize("argv, says", [
    (("check-msg-send-rt", "--topic", TOPIC, "--amount", "0"), "'0' is not a whole number >= 1"),
    (("send-msg-status", "--broker-name", BROKER_NAME, "--size=-1"), "'-1' is not a whole number >= 1"),
    (("send-msg-status", "--broker-name", BROKER_NAME, "--count", "x"), "'x' is not a whole number >= 1"),
    (("allocate-mq", "--topic", TOPIC, "--ip-list", " , "), "give at least one client id"),
])
def test_the_parser_refuses_nothing_to_send_or_no_client(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["admin", *argv])
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_a_failed_send_is_shown_and_makes_the_status_non_zero(capsys):
    """A failing send does not stop the check: it is a FAILED row, and the command ends with one
    line saying how many failed (exit status 1)."""
    mq = MessageQueue(TOPIC, BROKER_NAME, 0)
    sends = [admin_tools._Timed(mq, None, "connection refused", 3.0), admin_tools._Timed(mq, None, "timed out", 5.0)]
    with pytest.raises(CliError, match="2 of 2 sends to Orders failed"):
        admin_tools._show_sends(argparse.Namespace(json=False), TOPIC, sends)
    rows = capsys.readouterr().out.splitlines()
    assert "FAILED" in rows[1] and "connection refused" in rows[1] and rows[-1].startswith("avg RT 5.00 ms")



def test_registry_config_commands_switch_order_routes_and_refuse_fixed_settings(node, capsys):
    """`registry-config` / `registry-config-update` (mqadmin getNamesrvConfig / updateNamesrvConfig)
    against the node's embedded registry: orderMessageEnable takes ORDER_TOPIC_CONFIG out of the
    route and back; a setting only a restart changes is one line on stderr."""
    registry, admin = node
    status, out, err = admin_cli(capsys, registry, "registry-config", "--json")
    assert status == 0, err
    assert json.loads(out)["registries"][registry]["orderMessageEnable"] == "true"
    admin.put_kv_config("ORDER_TOPIC_CONFIG", TOPIC, f"{BROKER_NAME}:2")
    try:
        assert admin.topic_route(TOPIC).order_topic_conf == f"{BROKER_NAME}:2"
        status, out, err = admin_cli(capsys, registry, "registry-config-update", "-k", "orderMessageEnable",
                                     "-v", "false")
        assert (status, out.strip()) == (0, f"orderMessageEnable=false at {registry}"), err
        assert admin.topic_route(TOPIC).order_topic_conf is None
        assert admin.registry_configs()[registry]["orderMessageEnable"] == "false"
        status, out, err = admin_cli(capsys, registry, "registry-config-update", "-k", "listenPort", "-v", "1")
        assert status == 1 and not out and len(err.splitlines()) == 1
        assert "listenPort: only a restart changes it" in err
        assert admin.update_registry_config({"orderMessageEnable": "true"}) == [registry]
        assert admin.topic_route(TOPIC).order_topic_conf == f"{BROKER_NAME}:2"
    finally:
        admin.update_registry_config({"orderMessageEnable": "true"})
        admin.delete_kv_config("ORDER_TOPIC_CONFIG", TOPIC)
