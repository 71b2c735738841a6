"""Bad requests get the reference's codes with a remark, and the connection keeps working."""

from __future__ import annotations

import pytest

from tests.support.broker import batch_command, pull_command, send_command
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand

NODE_SETTINGS = {"max_message_size": 64 * 1024}


def without(cmd: RemotingCommand, field: str) -> RemotingCommand:
    del cmd.ext_fields[field]
    return cmd


def with_field(cmd: RemotingCommand, field: str, value: str) -> RemotingCommand:
    cmd.ext_fields[field] = value
    return cmd


CASES = [
    ("send without a topic", lambda: without(send_command("Bad", b"x"), "b"),
     ResponseCode.SYSTEM_ERROR, "the custom field b is null"),
    ("send v1 without queueId", lambda: without(send_command("Bad", b"x", v1=True), "queueId"),
     ResponseCode.SYSTEM_ERROR, "the custom field queueId is null"),
    ("a send without any header field", lambda: RemotingCommand(RequestCode.SEND_MESSAGE_V2, body=b"x"),
     ResponseCode.SYSTEM_ERROR, "the custom field a is null"),
    ("send with a non-numeric queue id", lambda: with_field(send_command("Bad", b"x"), "e", "one"),
     ResponseCode.SYSTEM_ERROR, "the custom field e is not an integer"),
    ("send to a queue id past the topic's", lambda: send_command("SELF_TEST_TOPIC", b"x", queue_id=5),
     ResponseCode.SYSTEM_ERROR, "request queueId[5] is illegal"),
    ("send to a topic with illegal characters", lambda: send_command("bad topic!", b"x"),
     ResponseCode.SYSTEM_ERROR, "illegal characters"),
    ("send to an unknown topic without a template", lambda: with_field(send_command("Unknown1", b"x"), "c", "NoTpl"),
     ResponseCode.TOPIC_NOT_EXIST, "topic[Unknown1] not exist"),
    ("send to a forbidden system topic", lambda: send_command("SCHEDULE_TOPIC_XXXX", b"x"),
     ResponseCode.NO_PERMISSION, "is forbidden"),
    ("an oversize body", lambda: send_command("Bad", b"x" * (64 * 1024 + 1)),
     ResponseCode.MESSAGE_ILLEGAL, "over the 65536-byte limit"),
    ("properties over 32767 bytes", lambda: send_command("Bad", b"x", extra={"BIG": "p" * 33000}),
     ResponseCode.MESSAGE_ILLEGAL, "properties are"),
    ("a garbled batch body", lambda: with_body(batch_command("Bad", [(b"x", "")]), b"\0\0\0\x05garbage"),
     ResponseCode.MESSAGE_ILLEGAL, "malformed batch body"),
    ("pull without a queue offset", lambda: without(pull_command("Bad", 0, 0), "queueOffset"),
     ResponseCode.SYSTEM_ERROR, "the custom field queueOffset is null"),
    ("pull of a queue id past the topic's", lambda: pull_command("SELF_TEST_TOPIC", 4, 0),
     ResponseCode.SYSTEM_ERROR, "queueId[4] is illegal"),
    ("pull of a negative queue id", lambda: pull_command("SELF_TEST_TOPIC", -1, 0),
     ResponseCode.SYSTEM_ERROR, "queueId[-1] is illegal"),
    ("pull of an unknown topic", lambda: pull_command("NoSuchTopic", 0, 0),
     ResponseCode.TOPIC_NOT_EXIST, "topic[NoSuchTopic] not exist"),
    ("pull with a malformed SQL92 filter", lambda: with_field(pull_command("SELF_TEST_TOPIC", 0, 0,
                                                                           subscription="a > > 1"),
                                                              "expressionType", "SQL92"),
     ResponseCode.SUBSCRIPTION_PARSE_FAILED, "parse the consumer's subscription failed"),
    ("view without an offset", lambda: RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID, ext_fields={}),
     ResponseCode.SYSTEM_ERROR, "the custom field offset is null"),
    ("an unknown request code", lambda: RemotingCommand(9999, ext_fields={}),
     ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "request type 9999 not supported"),
]


def with_body(cmd: RemotingCommand, body: bytes) -> RemotingCommand:
    cmd.body = body
    return cmd


@pytest.mark.parametrize("name, make, code, remark", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_its_code_and_the_connection_keeps_working(broker, name, make, code, remark):
    r = broker.call(make())
    assert r.code == code, (r.code, r.remark)
    assert remark in (r.remark or ""), r.remark
    ok = broker.call(send_command("StillFine", b"after " + name.encode()))   # same connection
    assert ok.code == ResponseCode.SUCCESS, ok.remark
