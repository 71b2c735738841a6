"""A slave's net actor passing writes on to its master (smartgo.broker.ha.master_forward), against a
scripted master client: what goes on, what comes back, and what happens without a master."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from smartgo.broker.ha.master_forward import MasterForward
from smartgo.broker.stats.stats import NetStats
from smartgo.common.acl_sign import FORWARDED_FOR
from smartgo.net.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import RemotingConnectError

pytestmark = pytest.mark.timeout(10)

CONN = SimpleNamespace(remote_address="10.0.0.9:5000")


class Master:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[tuple[str, RemotingCommand, str]] = []

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        self.sent.append((addr, cmd, "invoke"))
        if self.fail:
            raise RemotingConnectError(f"connect to {addr} failed: refused")
        answer = cmd.make_response(ResponseCode.SUCCESS, None, {"msgId": "M", "queueOffset": "7"})
        answer.opaque = 999                              # the master's own numbering
        return answer

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        self.sent.append((addr, cmd, "oneway"))

    async def close(self) -> None:
        pass


async def refuse(conn, request: RemotingCommand) -> RemotingCommand:
    return request.make_response(ResponseCode.SERVICE_NOT_AVAILABLE, "a slave")


async def keep(conn, request: RemotingCommand) -> RemotingCommand:
    return request.make_response(ResponseCode.SUCCESS, "kept on the slave")


def forwarding(master: Master) -> tuple[MasterForward, dict]:
    forward = MasterForward(None, NetStats())
    forward.client = master
    table = forward.wrap({RequestCode.SEND_MESSAGE_V2: refuse, RequestCode.PULL_MESSAGE: refuse,
                          RequestCode.END_TRANSACTION: refuse, RequestCode.UPDATE_CONSUMER_OFFSET: keep})
    return forward, table


def request(code: int, flag: int = 0) -> RemotingCommand:
    return RemotingCommand(code, language=0, version=317, opaque=41, flag=flag,
                           ext_fields={"b": "T", "AccessKey": "ak", "Signature": "sig"}, body=memoryview(b"body"))


def test_a_write_goes_on_as_it_came_and_the_masters_answer_comes_back():
    master = Master()
    forward, table = forwarding(master)
    forward.master = "127.0.0.1:10911"
    answer = asyncio.run(table[RequestCode.SEND_MESSAGE_V2](CONN, request(RequestCode.SEND_MESSAGE_V2)))
    ((addr, cmd, how),) = master.sent
    assert (addr, how, cmd.code, cmd.language, cmd.version, cmd.body) == \
        ("127.0.0.1:10911", "invoke", RequestCode.SEND_MESSAGE_V2, 0, 317, b"body")
    assert cmd.ext_fields == {"b": "T", "AccessKey": "ak", "Signature": "sig", FORWARDED_FOR: "10.0.0.9:5000"}
    assert (answer.code, answer.opaque, answer.ext_fields) == (ResponseCode.SUCCESS, 41,
                                                               {"msgId": "M", "queueOffset": "7"})
    assert table[RequestCode.PULL_MESSAGE] is refuse                  # reads are the slave's own
    assert forward.stats.take()["fw"] == [[RequestCode.SEND_MESSAGE_V2, "passed", 1]]


def test_a_write_is_passed_on_once():
    """A slave that took another slave for the master passed it on: it goes no further."""
    master = Master()
    forward, table = forwarding(master)
    forward.master = "127.0.0.1:10911"
    again = request(RequestCode.SEND_MESSAGE_V2)
    again.ext_fields[FORWARDED_FOR] = "127.0.0.1:30911"
    refused = asyncio.run(table[RequestCode.SEND_MESSAGE_V2](CONN, again))
    assert (refused.code, refused.remark, master.sent) == (ResponseCode.SERVICE_NOT_AVAILABLE, "a slave", [])


def test_a_oneway_write_stays_oneway():
    master = Master()
    forward, table = forwarding(master)
    forward.master = "127.0.0.1:10911"
    assert asyncio.run(table[RequestCode.END_TRANSACTION](CONN, request(RequestCode.END_TRANSACTION,
                                                                          FLAG_ONEWAY))) is None
    assert [how for _, _, how in master.sent] == ["oneway"]


def test_without_a_master_or_when_it_fails_the_slave_refuses(caplog):
    master = Master(fail=True)
    forward, table = forwarding(master)
    refused = asyncio.run(table[RequestCode.SEND_MESSAGE_V2](CONN, request(RequestCode.SEND_MESSAGE_V2)))
    assert (refused.code, refused.remark, master.sent) == (ResponseCode.SERVICE_NOT_AVAILABLE, "a slave", [])
    forward.master = "127.0.0.1:10911"
    for _ in range(3):
        failed = asyncio.run(table[RequestCode.SEND_MESSAGE_V2](CONN, request(RequestCode.SEND_MESSAGE_V2)))
        assert failed.code == ResponseCode.SERVICE_NOT_AVAILABLE and failed.opaque == 41
        assert "its master 127.0.0.1:10911 did not take the message" in failed.remark
    assert caplog.text.count("not passed on to the master 127.0.0.1:10911") == 1
    assert forward.stats.forwarded == {(RequestCode.SEND_MESSAGE_V2, "failed"): 3}
    # a consumer offset the master did not take stays on the slave, as 4.x keeps it
    kept = asyncio.run(table[RequestCode.UPDATE_CONSUMER_OFFSET](CONN, request(RequestCode.UPDATE_CONSUMER_OFFSET)))
    assert (kept.code, kept.remark) == (ResponseCode.SUCCESS, "kept on the slave")
    assert [cmd.code for _, cmd, _ in master.sent][-1] == RequestCode.UPDATE_CONSUMER_OFFSET     # tried first
