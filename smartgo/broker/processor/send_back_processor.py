"""CONSUMER_SEND_MSG_BACK (36) in a net actor: a message a consumer failed to consume comes back.

RocketMQ's SendMessageProcessor.asyncConsumerSendMsgBack, split along our actors: the net actor
reads the original record at its CommitLog offset from the mapped files; the broker actor, owner
of the subscription groups and the topic table, says where it goes (`send_back_target`: the
group's retry topic with a delay level, or its DLQ past the retry limit, either created on
demand); the net actor builds the new record (schedule_message.send_back_record: the body, flag,
sys flag, born time and host of the original, reconsume times + 1, RETRY_TOPIC and
ORIGIN_MESSAGE_ID added) and stores it through the send path. A retried message is a delayed
message: it goes to SCHEDULE_TOPIC_XXXX and the schedule actor delivers it to %RETRY%<group>
when due.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from smartgo.broker.channel import ChannelError
from smartgo.broker.schedule.schedule_message import (DELAY, ScheduleRecordError, schedule_rewrite, send_back_record,
                                                      sent_back_fields)
from smartgo.broker.managers.topics import TopicConfig
from smartgo.net.codes import MQVersion, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, eager
from smartgo.store.record import decode_properties

if TYPE_CHECKING:
    from smartgo.broker.actors.net_actor import NetActor

log = logging.getLogger(__name__)

RETRY_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"


class SendBackProcessor:
    def __init__(self, net: NetActor) -> None:
        self.net = net
        self.view = net.view

    @eager
    async def process(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        offset = request.ext_int("offset")
        group = request.ext_str("group")
        delay = request.ext_int("delayLevel")
        limit = request.ext_int("maxReconsumeTimes", None) if request.version >= MQVersion.V3_4_9 else None
        refused = self.net.sends.refuse_writes(request)
        if refused is not None:
            return refused
        view = self.view
        record = view.fresh_reader().view(offset, view.written.get())
        if record is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        try:
            original = sent_back_fields(record)
        except ScheduleRecordError as exc:
            log.warning("send-back of offset %d from %s: the record is unreadable: %s", offset,
                        conn.remote_address, exc)
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}: {exc}")
        try:
            target = await self.net.link.call("send_back_target", group=group, reconsume=original.reconsume_times,
                                              delay=delay, max=limit,
                                              origin=request.ext_str("originTopic", "") or original.topic)
        except ChannelError as exc:
            return request.make_response(ResponseCode.SYSTEM_BUSY, f"broker actor unavailable: {exc}")
        if "error" in target:
            code, remark = target["error"]
            return request.make_response(code, remark)
        topic, queue_id = target["topic"], target["queue_id"]
        if view.topic(topic) is None:
            view.add_topic(TopicConfig.from_json(target["config"]))
        props = decode_properties(original.properties)
        props.setdefault(RETRY_TOPIC, original.topic)
        props.setdefault(ORIGIN_MESSAGE_ID, f"{self.net.sends.host_hex}{offset:016X}")   # its offsetMsgId
        props.pop(DELAY, None)
        if target["delay"]:
            props[DELAY] = str(target["delay"])
        text = "\x02".join(f"{k}\x01{v}" for k, v in props.items())
        store_topic, store_queue = topic, queue_id
        delayed = schedule_rewrite(text, topic, queue_id, self.net.sends.max_delay_level)
        if delayed is not None:
            store_topic, store_queue, text = delayed
        try:
            block = send_back_record(record, store_topic, store_queue, text, original.reconsume_times + 1)
        except ScheduleRecordError as exc:
            return request.make_response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
        self.net.sends.store(conn, request, store_topic, queue_id, store_queue, block, [len(block)], True)
        return None
