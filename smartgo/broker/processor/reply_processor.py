"""SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325) in a net actor: request-reply.

RocketMQ 4.6's ReplyMessageProcessor, split along our actors. A consumer answers a request
message with a reply (MSG_TYPE "reply", CORRELATION_ID and REPLY_TO_CLIENT copied from the
request) sent to <cluster>_REPLY_TOPIC. The net actor checks it as a send (msgCheck), stores it
through the send path when store_reply_message is on (storeReplyMessageEnable), and pushes it to
the requester as PUSH_REPLY_MESSAGE_TO_CLIENT (326). A requester whose producer heartbeats on a
connection of this net actor gets it at once (NetActor.local_producer). Otherwise its connection
is on another net actor, and only the broker actor knows which connection a client id has
(ProducerManager.findChannel over its producer heartbeats), so the push goes through it: the call
`push_reply` finds the connection and hands the push to its net actor. Either way the client's
answer to the push is dropped (the broker does not wait for the requester as Java's invokeSync
does).

The sender's answer is the push's: SUCCESS, or SYSTEM_ERROR with Java's remark when
REPLY_TO_CLIENT is missing or its client has no producer connection here (and, our addition,
when CORRELATION_ID is missing). The header carries the stored message's msgId, queueId and
queueOffset, or "0", the queue and 0 when it was not stored. As in Java the reply is stored
whatever the push's outcome, with the sender's properties (plus CLUSTER, as every stored message
here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from smartgo.broker.channel import ChannelError, pack_command, unpack_command
from smartgo.broker.processor.send_processor import REGION, STORED, SendHeader, parse_header
from smartgo.net.codes import RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager
from smartgo.store.record import decode_properties, encode_properties

if TYPE_CHECKING:
    from smartgo.broker.actors.broker_actor import BrokerActor
    from smartgo.broker.actors.net_actor import NetActor

log = logging.getLogger(__name__)

REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
CORRELATION_ID = "CORRELATION_ID"
PUSH_REPLY_TIME = "PUSH_REPLY_TIME"


class ReplyProcessor:
    def __init__(self, net: NetActor) -> None:
        cfg = net.config
        self.net = net
        self.sends = net.sends
        self.link = net.link
        self.store_reply = cfg.store_reply_message
        self.store_host = f"/{cfg.broker_ip}:{cfg.listen_port}"       # InetSocketAddress.toString()

    @eager
    async def process(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        h = parse_header(request, batches=False)
        sends = self.sends
        queue_id = sends.check(conn, request, h)
        if queue_id is None:
            queue_id = await sends.check_created(conn, request, h)
        if type(queue_id) is not int:
            return queue_id  # type: ignore[return-value]  # not an int: the refusal
        props = decode_properties(h.properties)
        push = self._push_command(conn, request, h, props)            # before put() may rewrite h
        stored = None
        if self.store_reply:
            stored = asyncio.get_running_loop().create_future()
            refused = sends.put(conn, request, h, queue_id, stored)
            if refused is not None:
                stored.set_result(refused)
        failure = await self._push(conn, props, push)
        ext = {"msgId": "0", "queueId": str(queue_id), "queueOffset": "0", "MSG_REGION": REGION, "TRACE_ON": "true"}
        if stored is not None:
            response = await stored
            if response.code in STORED:
                ext = response.ext_fields
            else:
                log.warning("a reply from %s to %s was not stored: %s", conn.remote_address,
                            props.get(REPLY_TO_CLIENT), response.remark)
        if failure is not None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, failure, ext)
        return request.make_response(ResponseCode.SUCCESS, None, ext)

    def _push_command(self, conn: Connection, request: RemotingCommand, h: SendHeader,
                      props: dict[str, str]) -> RemotingCommand:
        """PUSH_REPLY_MESSAGE_TO_CLIENT: ReplyMessageRequestHeader (the send header's fields by
        their V1 names, with the original queue id, plus born and store host and store time, as
        Java writes them) and the body as sent."""
        props[PUSH_REPLY_TIME] = str(time.time_ns() // 1_000_000)
        ext = request.ext_fields
        return RemotingCommand(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, ext_fields={
            "producerGroup": h.group, "topic": h.topic, "defaultTopic": h.default_topic,
            "defaultTopicQueueNums": str(h.default_queues), "queueId": str(h.queue_id), "sysFlag": str(h.sys_flag),
            "bornTimestamp": str(h.born_timestamp), "flag": str(h.flag),
            "properties": encode_properties(props).decode(), "reconsumeTimes": str(h.reconsume_times),
            "unitMode": ext.get("unitMode") or ext.get("k") or "false",  # type: ignore[union-attr]  # parsed: a dict
            "bornHost": "/" + conn.remote_address, "storeHost": self.store_host,
            "storeTimestamp": props[PUSH_REPLY_TIME]}, body=request.body_bytes())

    async def _push(self, conn: Connection, props: dict[str, str], push: RemotingCommand) -> str | None:
        """Push through the broker actor; None when pushed, else the remark of the refusal."""
        client = props.get(REPLY_TO_CLIENT)
        for name, value in ((REPLY_TO_CLIENT, client), (CORRELATION_ID, props.get(CORRELATION_ID))):
            if not value:
                log.warning("a reply from %s has no %s property: not pushed", conn.remote_address, name)
                return f"reply message properties[{name}] is null"
        local = self.net.local_producer(client)  # type: ignore[arg-type]  # checked in the loop above
        if local is not None:
            self.net.push(local, push)
            return None
        try:
            return await self.link.call("push_reply", client=client, cmd=pack_command(push))
        except ChannelError as exc:
            log.warning("push reply message to %s failed: %s", client, exc)
            return f"push reply message to {client} fail. (broker actor unavailable: {exc})"


def push_reply(broker: BrokerActor, net: str, args: dict) -> str | None:
    """The broker actor's half (channel call "push_reply"): the push goes to a producer
    connection of the client; None, or Java's remark when it has none here."""
    client = args["client"]
    ref = broker.clients.producer_ref(client)
    if ref is None:
        remark = f"push reply message fail, channel of <{client}> not found."
        log.warning("%s (a reply through %s)", remark, net)
        return remark
    broker.channel.push(ref, unpack_command(args["cmd"]))
    return None
