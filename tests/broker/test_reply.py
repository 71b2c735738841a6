"""Request-reply on a real node, at the wire: SEND_REPLY_MESSAGE (324) / _V2 (325) is pushed to
the requester's connection as PUSH_REPLY_MESSAGE_TO_CLIENT (326), directly when the requester is
on the replying net actor, else through the broker actor, across net actors, stored in <cluster>_REPLY_TOPIC when store_reply_message is on; bad replies
get a clear error and the connection goes on."""

from __future__ import annotations

import json
import time
import uuid

import psutil
import pytest

from tests.support.broker import heartbeat_body, pull_command, send_command, start_broker
from smartgo.net.client import BlockingRemotingClient
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.record import decode_properties, decode_records
from tests.support.waits import wait_until

from .conftest import Broker

pytestmark = pytest.mark.timeout(60)

REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"


class Requester:
    """A producer connection (registered by HEART_BEAT) that records the replies pushed to it."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.client_id = f"127.0.0.1@req_{uuid.uuid4().hex[:8]}"
        self.pushed: list[RemotingCommand] = []
        self.remoting = BlockingRemotingClient(processors={RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT: self._push})
        r = self.remoting.invoke(addr, RemotingCommand(RequestCode.HEART_BEAT, body=heartbeat_body(
            self.client_id, producers=("PG_REQUEST",))))
        assert r.code == ResponseCode.SUCCESS, r.remark

    async def _push(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        self.pushed.append(cmd)
        return cmd.make_response(ResponseCode.SUCCESS)

    def local_port(self) -> int:
        conn = self.remoting._call(self.remoting.client.connection(self.addr), 5)
        return int(conn.local_address.rpartition(":")[2])

    def close(self) -> None:
        self.remoting.close()


@pytest.fixture
def requester(broker):
    made: list[Requester] = []

    def make(b: Broker = broker) -> Requester:
        made.append(Requester(b.addr))
        return made[-1]
    yield make
    for r in made:
        r.close()


def reply_command(body: bytes, props: dict[str, str], *, v1: bool = False, topic: str = REPLY_TOPIC) -> RemotingCommand:
    """What a consumer's producer sends for MessageUtil.createReplyMessage's message."""
    cmd = send_command(topic, body, extra={"MSG_TYPE": "reply", "TTL": "3000", **props}, v1=v1, group="PG_REPLY")
    cmd.code = RequestCode.SEND_REPLY_MESSAGE if v1 else RequestCode.SEND_REPLY_MESSAGE_V2
    return cmd


def reply_props(req: Requester, correlation: str | None = None) -> dict[str, str]:
    return {"REPLY_TO_CLIENT": req.client_id, "CORRELATION_ID": correlation or uuid.uuid4().hex}


@pytest.mark.parametrize("v1", [False, True], ids=["v2", "v1"])
def test_reply_is_pushed_to_the_requester_and_stored(broker, requester, v1):
    req = requester()
    correlation = uuid.uuid4().hex
    before = int(time.time() * 1000)
    r = broker.call(reply_command(b"the answer", reply_props(req, correlation), v1=v1))
    assert r.code == ResponseCode.SUCCESS, r.remark
    ext = r.ext_fields
    assert ext["msgId"] != "0" and ext["queueId"] == "0" and ext["MSG_REGION"] == "DefaultRegion"
    wait_until(lambda: req.pushed, timeout=5, message="the pushed reply")
    push = req.pushed[0]
    h = push.ext_fields
    assert push.code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT and push.body_bytes() == b"the answer"
    assert (h["producerGroup"], h["topic"], h["queueId"], h["sysFlag"], h["flag"]) == \
        ("PG_REPLY", REPLY_TOPIC, "0", "0", "0")
    assert h["storeHost"] == f"/127.0.0.1:{broker.node.port}"
    assert h["bornHost"].startswith("/127.0.0.1:") and int(h["storeTimestamp"]) >= before
    props = decode_properties(h["properties"])
    assert props["CORRELATION_ID"] == correlation and props["REPLY_TO_CLIENT"] == req.client_id
    assert props["MSG_TYPE"] == "reply" and int(props["PUSH_REPLY_TIME"]) >= before
    # stored in the reply topic at the offset the answer names (long poll: dispatch follows the store)
    pulled = broker.call(pull_command(REPLY_TOPIC, 0, int(ext["queueOffset"]), max_nums=1, suspend_ms=3000), 10)
    assert pulled.code == ResponseCode.SUCCESS, pulled.remark
    [stored] = decode_records(pulled.body_bytes())
    assert stored.body == b"the answer" and stored.properties["CORRELATION_ID"] == correlation
    assert stored.msg_id == ext["msgId"]


def test_a_requester_on_the_replying_net_actor_is_pushed_without_the_broker_actor(broker, requester):
    """The net actor knows which of its connections each producer heartbeats on: the push to a
    requester there skips the broker actor (it is stopped here; the push still arrives)."""
    req = requester()
    actor = psutil.Process(broker.node.actor("broker")["pid"])
    actor.suspend()
    try:
        r = broker.call(reply_command(b"direct", reply_props(req)))
        assert r.code == ResponseCode.SUCCESS, r.remark
        wait_until(lambda: req.pushed, timeout=5, message="the pushed reply")
    finally:
        actor.resume()
    assert req.pushed[0].body_bytes() == b"direct"


def test_the_reply_topic_is_a_default_topic_with_one_queue(broker):
    r = broker.call(RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG))
    table = json.loads(r.body_bytes())["topicConfigTable"]
    assert table[REPLY_TOPIC]["readQueueNums"] == 1 and table[REPLY_TOPIC]["writeQueueNums"] == 1
    assert table[REPLY_TOPIC]["perm"] == 6


def test_reply_to_an_unknown_client_is_refused_and_the_broker_keeps_serving(broker, requester):
    r = broker.call(reply_command(b"lost", {"REPLY_TO_CLIENT": "10.9.9.9@ghost", "CORRELATION_ID": "c1"}))
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert r.remark == "push reply message fail, channel of <10.9.9.9@ghost> not found."
    wait_until(lambda: "channel of <10.9.9.9@ghost> not found" in broker.node.log_text(), timeout=5,
               message="the log line")
    req = requester()                                        # the same connection serves the next reply
    assert broker.call(reply_command(b"found", reply_props(req))).code == ResponseCode.SUCCESS
    wait_until(lambda: req.pushed, timeout=5, message="the pushed reply")
    assert broker.call(send_command("SELF_TEST_TOPIC", b"x")).code == ResponseCode.SUCCESS


def test_malformed_replies_get_a_clear_error_and_the_connection_goes_on(broker, requester):
    req = requester()
    r = broker.call(reply_command(b"x", {"CORRELATION_ID": "c2"}))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "reply message properties[REPLY_TO_CLIENT] is null")
    r = broker.call(reply_command(b"x", {"REPLY_TO_CLIENT": req.client_id}))
    assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "reply message properties[CORRELATION_ID] is null")
    no_topic = reply_command(b"x", reply_props(req))
    del no_topic.ext_fields["b"]
    r = broker.call(no_topic)
    assert r.code == ResponseCode.SYSTEM_ERROR and "b" in r.remark and "null" in r.remark
    bad_queue = reply_command(b"x", reply_props(req))
    bad_queue.ext_fields["e"] = "zero"
    r = broker.call(bad_queue)
    assert r.code == ResponseCode.SYSTEM_ERROR and "e" in r.remark
    r = broker.call(reply_command(b"x", reply_props(req), topic="SCHEDULE_TOPIC_XXXX"))
    assert r.code == ResponseCode.NO_PERMISSION
    assert not req.pushed                                    # none of those reached the requester
    assert broker.call(reply_command(b"fine", reply_props(req))).code == ResponseCode.SUCCESS
    wait_until(lambda: [p.body_bytes() for p in req.pushed] == [b"fine"], timeout=5, message="the good reply")
    broker.node.logged("has no REPLY_TO_CLIENT property", "has no CORRELATION_ID property")


# ---- two net actors, replies not stored -----------------------------------------------------------------

@pytest.fixture(scope="module")
def two_nets(tmp_path_factory):
    node = start_broker(tmp_path_factory.mktemp("reply2") / "node", {"net_actors": 2, "store_reply_message": "false"})
    b = Broker(node, BlockingRemotingClient())
    yield b
    b.client.close()
    node.reap()


def net_actor_of(broker: Broker, local_port: int) -> str:
    """Which net actor holds the connection whose client end is local_port."""
    for name in ("net-0", "net-1"):
        conns = psutil.Process(broker.node.actor(name)["pid"]).net_connections("tcp")
        if any(c.raddr and c.raddr.port == local_port for c in conns):
            return name
    raise AssertionError(f"no net actor holds the connection from port {local_port}")


def test_replies_reach_requesters_on_the_other_net_actor(two_nets, requester):
    replier = BlockingRemotingClient()
    try:
        replier.invoke(two_nets.addr, RemotingCommand(RequestCode.HEART_BEAT, body=heartbeat_body("127.0.0.1@rep")))
        conn = replier._call(replier.client.connection(two_nets.addr), 5)
        replier_net = net_actor_of(two_nets, int(conn.local_address.rpartition(":")[2]))
        reqs = [requester(two_nets) for _ in range(4)]
        while all(net_actor_of(two_nets, r.local_port()) == replier_net for r in reqs):
            assert len(reqs) < 40, "SO_REUSEPORT put 40 connections on one net actor"
            reqs.append(requester(two_nets))
        for i, req in enumerate(reqs):
            r = replier.invoke(two_nets.addr, reply_command(f"reply {i}".encode(), reply_props(req)))
            assert r.code == ResponseCode.SUCCESS, r.remark
            # store_reply_message false: nothing stored, Java's zero answer
            assert (r.ext_fields["msgId"], r.ext_fields["queueOffset"]) == ("0", "0")
        wait_until(lambda: all(len(req.pushed) == 1 for req in reqs), timeout=5, message="every pushed reply")
        assert [req.pushed[0].body_bytes() for req in reqs] == [f"reply {i}".encode() for i in range(len(reqs))]
        # nothing went into the reply topic: a message sent there now is its first
        marker = replier.invoke(two_nets.addr, send_command(REPLY_TOPIC, b"marker"))
        assert marker.code == ResponseCode.SUCCESS and marker.ext_fields["queueOffset"] == "0"
    finally:
        replier.close()
