"""`smartgo send / consume / admin / bench` in-process against the scripted fake broker: --json
output parses, human output reads, and failures are one line with a non-zero status."""

from __future__ import annotations

import argparse
import io
import json

import pytest

from smartgo.cli.main import build_parser, main
from smartgo.client.message import MessageQueue
from smartgo.client.running_info import CMResult, RunningInfo, encode_direct_result, encode_running_info
from smartgo.common.acl_sign import sign
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.store.record import pack_host

from .conftest import pull_response, response


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_send_json(cluster, capsys):
    registry, broker = cluster
    broker.handlers[RequestCode.SEND_MESSAGE_V2] = broker.send_ok()
    status, out, err = run_cli(capsys, "send", "-n", registry, "--topic", "T", "--body", "hi", "--tags", "A",
                               "--keys", "k1", "-p", "color=red", "--json")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["status"] == "SEND_OK" and len(doc["msg_id"]) == 32 and doc["topic"] == "T"
    sent = broker.of(RequestCode.SEND_MESSAGE_V2)[0]
    assert sent.body == b"hi" and "color\x01red" in sent.ext_fields["i"]


def test_credentials_sign_every_request(cluster, capsys, monkeypatch):
    registry, broker = cluster
    broker.handlers[RequestCode.SEND_MESSAGE_V2] = broker.send_ok()
    monkeypatch.setenv("SMARTGO_SECRET_KEY", "the-secret-1")
    status, _, err = run_cli(capsys, "send", "-n", registry, "--topic", "T", "--body", "hi",
                             "--access-key", "the-access")
    assert status == 0, err
    sent = broker.of(RequestCode.SEND_MESSAGE_V2)[0]
    fields = {k: v for k, v in sent.ext_fields.items() if k != "Signature"}
    assert sent.ext_fields["AccessKey"] == "the-access"
    assert sent.ext_fields["Signature"] == sign(fields, sent.body, "the-access", "the-secret-1")["Signature"]


def test_send_stdin_lines_human(cluster, capsys, monkeypatch):
    registry, broker = cluster
    broker.handlers[RequestCode.SEND_MESSAGE_V2] = broker.send_ok()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"one\ntwo\n\nthree\n")))
    status, out, _ = run_cli(capsys, "send", "-n", registry, "--topic", "T", "--mode", "async")
    assert status == 0
    assert len(out.splitlines()) == 3 and all("SEND_OK" in line for line in out.splitlines())
    assert sorted(r.body for r in broker.of(RequestCode.SEND_MESSAGE_V2)) == [b"one", b"three", b"two"]


def test_send_failure_is_one_line(cluster, capsys):
    registry, broker = cluster
    broker.handlers[RequestCode.SEND_MESSAGE_V2] = lambda c, cmd: response(cmd, ResponseCode.MESSAGE_ILLEGAL,
                                                                           remark="body too odd")
    status, out, err = run_cli(capsys, "send", "-n", registry, "--topic", "T", "--body", "x")
    assert status == 1 and len(err.strip().splitlines()) == 1
    assert "MESSAGE_ILLEGAL" in err and "body too odd" in err and "Traceback" not in err


def test_consume_pull_json_lines(cluster, capsys):
    registry, broker = cluster
    records = {0: [broker.record("T", 0, i, f"m{i}".encode(), {"TAGS": "A", "KEYS": f"k{i}"}) for i in range(3)]}

    def pull(conn, cmd):
        qid, offset = int(cmd.ext_fields["queueId"]), int(cmd.ext_fields["queueOffset"])
        recs = records.get(qid, [])
        if offset < len(recs):
            return pull_response(cmd, 0, len(recs), 0, len(recs), b"".join(recs[offset:]))
        return pull_response(cmd, ResponseCode.PULL_NOT_FOUND, offset, 0, len(recs))
    broker.handlers[RequestCode.PULL_MESSAGE] = pull
    broker.handlers[RequestCode.GET_MIN_OFFSET] = lambda c, cmd: response(cmd, ext={"offset": "0"})
    status, out, err = run_cli(capsys, "consume", "-n", registry, "--topic", "T", "--pull", "--from", "first",
                               "--count", "3", "--json")
    assert status == 0, err
    docs = [json.loads(line) for line in out.splitlines()]
    assert sorted(d["body"] for d in docs) == ["m0", "m1", "m2"] and docs[0]["tags"] == "A"
    assert {d["keys"][0] for d in docs} == {"k0", "k1", "k2"}


def test_consume_says_once_on_stderr_what_it_has_and_waits_for(cluster, capsys):
    """One message of the ten asked for, then quiet: one line on stderr says what came, what it
    waits for and how it ends, once for the whole quiet spell (not every 2 s); --idle-timeout ends it."""
    registry, broker = cluster
    record = broker.record("T", 0, 0, b"m0", {"TAGS": "A"})

    def pull(conn, cmd):
        offset, held = int(cmd.ext_fields["queueOffset"]), int(cmd.ext_fields["queueId"] == "0")
        if offset < held:
            return pull_response(cmd, 0, 1, 0, 1, record)
        return pull_response(cmd, ResponseCode.PULL_NOT_FOUND, offset, 0, held)
    broker.handlers[RequestCode.PULL_MESSAGE] = pull
    broker.handlers[RequestCode.GET_MIN_OFFSET] = lambda c, cmd: response(cmd, ext={"offset": "0"})
    status, out, err = run_cli(capsys, "consume", "-n", registry, "--topic", "T", "--pull", "--from", "first",
                               "--count", "10", "--idle-timeout", "4.5")
    assert status == 0, err
    assert out.splitlines()[-1] == "1 message(s)"
    assert err.splitlines() == ["received 1 of 10; waiting for 9 more (stops after 4.5 s without one, or Ctrl-C)"]


def test_consume_sql_sends_the_selector_and_refuses_a_bad_one(cluster, capsys):
    registry, broker = cluster
    records = [broker.record("T", 0, 0, b"m0", {"a": "1"})]

    def pull(conn, cmd):
        if int(cmd.ext_fields["queueId"]) == 0 and cmd.ext_fields["queueOffset"] == "0":
            return pull_response(cmd, 0, 1, 0, 1, records[0])
        return pull_response(cmd, ResponseCode.PULL_NOT_FOUND, int(cmd.ext_fields["queueOffset"]), 0, 1)
    broker.handlers[RequestCode.PULL_MESSAGE] = pull
    broker.handlers[RequestCode.GET_MIN_OFFSET] = lambda c, cmd: response(cmd, ext={"offset": "0"})
    status, out, err = run_cli(capsys, "consume", "-n", registry, "--topic", "T", "--pull", "--from", "first",
                               "--sql", "a = 1", "--count", "1", "--json")
    assert status == 0, err
    assert [json.loads(line)["body"] for line in out.splitlines()] == ["m0"]
    ext = broker.of(RequestCode.PULL_MESSAGE)[0].ext_fields
    assert (ext["expressionType"], ext["subscription"]) == ("SQL92", "a = 1")
    status, _, err = run_cli(capsys, "consume", "-n", registry, "--topic", "T", "--sql", "a >", "--count", "1")
    assert status == 1 and "does not compile" in err


def test_admin_reset_offset_online_and_offline(cluster, capsys):
    """Online: the broker's table (INVOKE_BROKER_TO_RESET_OFFSET). Offline (CONSUMER_NOT_ONLINE):
    mqadmin's fallback, per queue of the group's consume stats: search the time, commit it."""
    registry, broker = cluster
    online = [True]

    def reset(conn, cmd):
        if not online[0]:
            return response(cmd, ResponseCode.CONSUMER_NOT_ONLINE, remark="Consumer not online")
        return response(cmd, body=b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:7,'
                                  b'{"brokerName":"broker-a","queueId":1,"topic":"T"}:3}}')
    broker.handlers[RequestCode.INVOKE_BROKER_TO_RESET_OFFSET] = reset
    broker.handlers[RequestCode.GET_CONSUME_STATS] = lambda c, cmd: response(cmd, body=(
        b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:'
        b'{"brokerOffset":9,"consumerOffset":9,"lastTimestamp":0},{"brokerName":"broker-a","queueId":1,"topic":"T"}:'
        b'{"brokerOffset":5,"consumerOffset":1,"lastTimestamp":0}}}'))
    broker.handlers[RequestCode.SEARCH_OFFSET_BY_TIMESTAMP] = lambda c, cmd: response(cmd, ext={"offset": "4"})
    broker.handlers[RequestCode.UPDATE_CONSUMER_OFFSET] = lambda c, cmd: response(cmd)
    status, out, err = run_cli(capsys, "admin", "reset-offset", "-n", registry, "-g", "G", "-t", "T",
                               "--to", "2026-11-23T10:00:00+00:00", "--json")
    assert status == 0, err
    assert [(q["queue_id"], q["offset"]) for q in json.loads(out)["queues"]] == [(0, 7), (1, 3)]
    ext = broker.of(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET)[0].ext_fields
    assert ext == {"topic": "T", "group": "G", "timestamp": "1795428000000", "isForce": "true"}
    online[0] = False
    status, out, err = run_cli(capsys, "admin", "reset-offset", "-n", registry, "-g", "G", "-t", "T",
                               "--to", "1700000000000", "--no-force")
    assert status == 0, err
    assert out.split() == ["BROKER", "QUEUE", "NEW", "OFFSET", "broker-a", "0", "4", "broker-a", "1", "1"]
    commits = [(c.ext_fields["queueId"], c.ext_fields["commitOffset"]) for c in broker.of(
        RequestCode.UPDATE_CONSUMER_OFFSET)]
    assert commits == [("0", "4"), ("1", "1")]          # not forced: queue 1 stays behind the time
    with pytest.raises(SystemExit) as bad:
        run_cli(capsys, "admin", "reset-offset", "-n", registry, "-g", "G", "-t", "T", "--to", "soon")
    assert bad.value.code == 2 and "neither milliseconds" in capsys.readouterr().err


def test_admin_topic_consumers(cluster, capsys):
    registry, broker = cluster
    broker.handlers[RequestCode.QUERY_TOPIC_CONSUME_BY_WHO] = lambda c, cmd: response(
        cmd, body=b'{"groupList":["G1"]}')
    broker.handlers[RequestCode.GET_CONSUME_STATS] = lambda c, cmd: response(cmd, body=(
        b'{"consumeTps":2.5,"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:'
        b'{"brokerOffset":9,"consumerOffset":4,"lastTimestamp":0}}}'))
    status, out, err = run_cli(capsys, "admin", "topic-consumers", "-n", registry, "-t", "T")
    assert status == 0, err
    assert out.split() == ["GROUP", "LAG", "TPS", "LAST", "CONSUMED", "G1", "5", "2.5", "-"]
    assert broker.of(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO)[0].ext_fields == {"topic": "T"}
    broker.handlers[RequestCode.QUERY_TOPIC_CONSUME_BY_WHO] = lambda c, cmd: response(cmd, body=b'{"groupList":7}')
    status, _, err = run_cli(capsys, "admin", "topic-consumers", "-n", registry, "-t", "T")
    assert status == 1 and "malformed GroupList" in err


def test_admin_consumer_status_and_consume_directly(cluster, capsys):
    registry, broker = cluster
    broker.handlers[RequestCode.GET_CONSUMER_CONNECTION_LIST] = lambda c, cmd: response(cmd, body=(
        b'{"connectionSet":[{"clientId":"10.0.0.2@2","language":"JAVA"},{"clientId":"10.0.0.1@1"}]}'))
    info = RunningInfo({"PROP_CONSUME_TYPE": "CONSUME_PASSIVELY", "PROP_CONSUMEORDERLY": "false"},
                       [{"topic": "T", "subString": "*"}], {MessageQueue("T", "broker-a", 1): {
                           "commitOffset": 41, "cachedMsgCount": 3, "lastPullTimestamp": 0}},
                       {"T": {"pullTPS": 12.5, "consumeOKTPS": 12.0, "consumeFailedMsgs": 1}})
    broker.handlers[RequestCode.GET_CONSUMER_RUNNING_INFO] = lambda c, cmd: (
        response(cmd, body=encode_running_info(info)) if cmd.ext_fields["clientId"] == "10.0.0.1@1"
        else response(cmd, ResponseCode.CONSUME_MSG_TIMEOUT, remark="consumer <G> <10.0.0.2@2> Timeout"))
    status, out, err = run_cli(capsys, "admin", "consumer-status", "-n", registry, "-g", "G")
    assert status == 0, err
    assert "== 10.0.0.1@1" in out and "CONSUME_PASSIVELY orderly=false" in out and "subscribes T (*)" in out
    assert out.split("COMMIT OFFSET")[1].split()[:10] == ["CACHED", "LAST", "PULL", "LAST", "CONSUME", "T",
                                                          "broker-a", "1", "41", "3"]
    assert "cannot tell: running info of 10.0.0.2@2 in G: CONSUME_MSG_TIMEOUT" in out
    assert out.rstrip().endswith("2 client(s); subscriptions the same on every client")
    asked = [(cmd.ext_fields["clientId"], cmd.ext_fields["jstackEnable"])
             for cmd in broker.of(RequestCode.GET_CONSUMER_RUNNING_INFO)]
    assert asked == [("10.0.0.1@1", "false"), ("10.0.0.2@2", "false")]
    status, out, err = run_cli(capsys, "admin", "consumer-status", "-n", registry, "-g", "G", "--client",
                               "10.0.0.1@1", "--jstack", "--json")
    doc = json.loads(out)
    assert status == 0 and [c["client_id"] for c in doc["clients"]] == ["10.0.0.1@1"], err
    assert doc["clients"][0]["queues"][0]["commitOffset"] == 41 and doc["clients"][0]["status"]["T"]["pullTPS"] == 12.5
    assert broker.of(RequestCode.GET_CONSUMER_RUNNING_INFO)[-1].ext_fields["jstackEnable"] == "true"

    record = broker.record("T", 1, 5, b"hello", {"UNIQ_KEY": "U1"})
    broker.handlers[RequestCode.VIEW_MESSAGE_BY_ID] = lambda c, cmd: response(cmd, body=record)
    broker.handlers[RequestCode.CONSUME_MESSAGE_DIRECTLY] = lambda c, cmd: response(cmd, body=encode_direct_result(
        CMResult.CR_LATER, 7, "try again"))
    offset_msg_id = (pack_host("127.0.0.1", broker.server.port) + (2000).to_bytes(8, "big")).hex().upper()
    status, out, err = run_cli(capsys, "admin", "consume-directly", "-n", registry, "-g", "G", "--client",
                               "10.0.0.1@1", "--id", offset_msg_id)
    assert status == 0 and out.splitlines() == ["CR_LATER in 7 ms", "try again"], err
    sent = broker.of(RequestCode.CONSUME_MESSAGE_DIRECTLY)[0].ext_fields
    assert sent["consumerGroup"] == "G" and sent["clientId"] == "10.0.0.1@1" and sent["topic"] == "T"


def test_admin_json(cluster, capsys):
    registry, broker = cluster
    status, out, err = run_cli(capsys, "admin", "topic-route", "-n", registry, "--topic", "T", "--json")
    assert status == 0, err
    route = json.loads(out)
    assert route["queueDatas"][0]["readQueueNums"] == 2 and route["brokerDatas"][0]["brokerName"] == "broker-a"
    status, out, _ = run_cli(capsys, "admin", "topic-list", "-n", registry, "--json")
    assert "T" in json.loads(out)["topics"]
    status, out, _ = run_cli(capsys, "admin", "cluster-list", "-n", registry, "--json")
    doc = json.loads(out)
    assert doc["clusters"] == {"DefaultCluster": ["broker-a"]} and "error" in doc["runtime"][broker.addr]
    broker.handlers[RequestCode.UPDATE_AND_CREATE_TOPIC] = lambda c, cmd: response(cmd)
    status, out, _ = run_cli(capsys, "admin", "topic-create", "-n", registry, "--topic", "New", "--queues", "4",
                             "--json")
    assert status == 0 and json.loads(out)["brokers"] == [broker.addr]
    created = broker.of(RequestCode.UPDATE_AND_CREATE_TOPIC)[0].ext_fields
    assert created["readQueueNums"] == "4" and created["perm"] == "6" and created["topic"] == "New"


def test_admin_errors(cluster, capsys):
    registry, broker = cluster
    status, _, err = run_cli(capsys, "admin", "topic-route", "-n", registry, "--topic", "Nope")
    assert status == 1 and "no route info of topic 'Nope'" in err and len(err.strip().splitlines()) == 1
    status, _, err = run_cli(capsys, "admin", "topic-status", "-n", registry, "--topic", "T")
    assert status == 1 and "REQUEST_CODE_NOT_SUPPORTED" in err
    status, _, err = run_cli(capsys, "admin", "topic-list", "-n", "127.0.0.1:1", "--timeout", "0.5")
    assert status == 1 and "no registry answered" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["admin", "query-offset", "--topic", "T", "--queue", "zero", "--offset", "1"])
    assert exit_info.value.code == 2


def test_bench_produce_json(cluster, capsys):
    registry, broker = cluster
    broker.handlers[RequestCode.SEND_MESSAGE_V2] = broker.send_ok()
    broker.handlers[RequestCode.SEND_BATCH_MESSAGE] = broker.send_ok()
    status, out, err = run_cli(capsys, "bench", "produce", "-n", registry, "--topic", "T", "--duration", "1.2",
                               "--interval", "0.5", "--concurrency", "2", "--batch", "4", "--json",
                               "--busy-poll-us", "100")
    assert status == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["type"] == "summary" and lines[-1]["total"] > 0 and lines[-1]["total"] % 4 == 0
    assert any(line["type"] == "interval" for line in lines[:-1])


def _subparsers(parser) -> list:
    """Every (sub)parser under parser, depth first."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found.extend(_subparsers(child))
    return found


def test_every_command_help_renders():
    """`--help` %-formats help strings: a stray % (as in %DLQ%) crashed `smartgo admin --help`."""
    parsers = _subparsers(build_parser())
    assert len(parsers) > 20
    for p in parsers:
        text = p.format_help()
        assert p.prog in text
    admin = next(p for p in parsers if p.prog == "smartgo admin")
    assert "(%DLQ%<group>)" in " ".join(admin.format_help().split())
