"""SQL92 property filters (MessageSelector.bySql) against a real node: pulls with the expression in
the request and registered by heartbeat, CHECK_CLIENT_CONFIG, bad expressions, long polling, and a
broker with enable_property_filter off."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.support.broker import ClientStub, pull_command, send_command
from smartgo.net import fastjson
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import decode_records
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(60)

SQL = "SQL92"


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def send_numbered(broker, topic: str, count: int) -> None:
    """Messages i = 0..count-1 with property a=i, b="odd"/"even", tag T<i % 3>; i == 4 lacks a."""
    for i in range(count):
        extra = {"b": "odd" if i % 2 else "even"} | ({} if i == 4 else {"a": str(i)})
        r = broker.call(send_command(topic, b"m%d" % i, tags=f"T{i % 3}", extra=extra))
        assert r.code == ResponseCode.SUCCESS, r.remark
    wait_until(lambda: broker.call(RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={
        "topic": topic, "queueId": "0"})).ext_fields["offset"] == str(count), message="dispatched")


def bodies(r: RemotingCommand) -> list[bytes]:
    assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    return [m.body for m in decode_records(r.body_bytes())]


def sql_pull(broker, topic: str, expression: str, offset: int = 0, **kw) -> RemotingCommand:
    return broker.call(pull_command(topic, 0, offset, subscription=expression, expression_type=SQL, **kw))


def check_client_config(broker, subscription: dict | None, raw: bytes | None = None) -> RemotingCommand:
    body = raw if raw is not None else fastjson.dumps({"clientId": "c@1", "group": "G",
                                                       **({"subscriptionData": subscription} if subscription else {})})
    return broker.call(RemotingCommand(RequestCode.CHECK_CLIENT_CONFIG, body=body))


def test_a_pull_with_a_sql92_subscription_gets_only_matching_messages(broker):
    topic = uid("Sql")
    send_numbered(broker, topic, 10)
    r = sql_pull(broker, topic, "a BETWEEN 3 AND 6")
    assert bodies(r) == [b"m3", b"m5", b"m6"]                      # m4 has no property a: NULL, not matched
    assert r.ext_fields["nextBeginOffset"] == "10"
    assert bodies(sql_pull(broker, topic, "b = 'odd' AND TAGS IN ('T0', 'T2')")) == [b"m3", b"m5", b"m9"]
    assert bodies(sql_pull(broker, topic, "a IS NULL")) == [b"m4"]
    assert bodies(sql_pull(broker, topic, "a > 7 OR b = 'nothing'", offset=5)) == [b"m8", b"m9"]
    none = sql_pull(broker, topic, "a > 100")
    assert (none.code, none.remark, none.ext_fields["nextBeginOffset"]) == \
        (ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE", "10")
    tags = broker.call(pull_command(topic, 0, 0, subscription="T1"))   # TAG pulls are untouched
    assert bodies(tags) == [b"m1", b"m4", b"m7"]


def test_a_bad_expression_is_refused_and_the_connection_serves_on(broker):
    topic = uid("SqlBad")
    send_numbered(broker, topic, 2)
    for bad in ("a >", "a > 'x'", "", "a BETWEEN 5 AND 1", "a = 1 AND (b = 2"):
        r = sql_pull(broker, topic, bad)
        assert r.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, (bad, r.code, r.remark)
        assert r.remark.startswith("parse the consumer's subscription failed")
    unknown = broker.call(pull_command(topic, 0, 0, subscription="a = 1", expression_type="JAVASCRIPT"))
    assert unknown.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "JAVASCRIPT" in unknown.remark
    assert bodies(sql_pull(broker, topic, "a = 1")) == [b"m1"]


def test_a_registered_sql92_subscription_filters_pulls_without_one(broker):
    group, topic = uid("G"), uid("SqlReg")
    send_numbered(broker, topic, 6)
    stub = ClientStub(broker.addr, uid("127.0.0.1@sql"))
    try:
        r = stub.heartbeat({group: {topic: "a >= 2 AND b = 'even'"}}, version=1000, expression_type=SQL)
        assert r.code == ResponseCode.SUCCESS
        assert bodies(broker.call(pull_command(topic, 0, 0, subscription=None, group=group, sub_version=1000))) \
            == [b"m2"]                                             # m4 is even but has no a
        stub.heartbeat({group: {topic: "a >"}}, version=2000, expression_type=SQL)   # registered, cannot filter
        bad = broker.call(pull_command(topic, 0, 0, subscription=None, group=group, sub_version=2000))
        assert bad.code == ResponseCode.FILTER_DATA_NOT_EXIST and "expression may be wrong" in bad.remark
        stub.heartbeat({group: {topic: "T2"}}, version=3000)       # back to tags: the codeSet filters
        assert bodies(broker.call(pull_command(topic, 0, 0, subscription=None, group=group, sub_version=3000))) \
            == [b"m2", b"m5"]
    finally:
        stub.close()


def test_check_client_config_answers_as_a_4x_broker(broker):
    def sub(expression: str, expression_type: str = SQL) -> dict:
        return {"topic": "T", "subString": expression, "expressionType": expression_type, "subVersion": 1,
                "classFilterMode": False, "codeSet": [], "tagsSet": []}
    assert check_client_config(broker, sub("a > 1 AND b IN ('x', 'y')")).code == ResponseCode.SUCCESS
    assert check_client_config(broker, sub("TagA || TagB", "TAG")).code == ResponseCode.SUCCESS
    assert check_client_config(broker, None).code == ResponseCode.SUCCESS
    bad = check_client_config(broker, sub("a > > 1"))
    assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "a > > 1" in bad.remark
    garbled = check_client_config(broker, None, raw=b"{not json")
    assert garbled.code == ResponseCode.SYSTEM_ERROR and "CheckClientRequestBody" in garbled.remark
    wrong = check_client_config(broker, None, raw=fastjson.dumps({"subscriptionData": {"subString": 5}}))
    assert wrong.code == ResponseCode.SYSTEM_ERROR and "subString" in wrong.remark
    assert check_client_config(broker, sub("a = 1")).code == ResponseCode.SUCCESS   # still serving


def test_a_parked_sql92_pull_returns_the_first_matching_arrival(broker):
    topic = uid("SqlHold")
    send_numbered(broker, topic, 1)
    deadline = time.monotonic() + 20
    offset, got = 1, []

    def arrive() -> None:
        for i in range(3):
            assert broker.call(send_command(topic, b"late%d" % i, extra={"a": str(10 + i)})).code == 0
    sender = threading.Timer(0.3, arrive)
    sender.start()
    try:
        while not got and time.monotonic() < deadline:      # as a push consumer: pull on from nextBeginOffset
            r = sql_pull(broker, topic, "a = 12", offset=offset, suspend_ms=5000)
            assert r.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_NOT_FOUND)
            if r.code == ResponseCode.SUCCESS:
                got = bodies(r)
            offset = int(r.ext_fields["nextBeginOffset"])
    finally:
        sender.join()
    assert got == [b"late2"] and offset == 4


def test_a_broker_with_the_property_filter_off_refuses_sql92(start_node):
    b = start_node({"enable_property_filter": "false"})
    topic = uid("SqlOff")
    send_numbered(b, topic, 1)
    r = sql_pull(b, topic, "a = 0")
    assert r.code == ResponseCode.SYSTEM_ERROR and "does not support consumer to filter message by SQL92" in r.remark
    check = check_client_config(b, {"topic": topic, "subString": "a = 0", "expressionType": SQL})
    assert check.code == ResponseCode.SYSTEM_ERROR and "SQL92" in check.remark
    assert bodies(b.call(pull_command(topic, 0, 0))) == [b"m0"]            # tags as before
