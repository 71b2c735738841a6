"""Client requests the broker actor serves (RocketMQ's ClientManageProcessor and
ConsumerManageProcessor): HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP
(38), QUERY_CONSUMER_OFFSET (14), LOCK_BATCH_MQ (41), UNLOCK_BATCH_MQ (42),
GET_CONSUMER_CONNECTION_LIST (203) and GET_PRODUCER_CONNECTION_LIST (204); and the call
`send_back_target`, the group half of CONSUMER_SEND_MSG_BACK (36), which a net actor serves
(send_back_processor.py).

Processors are plain functions (no awaits): the channel runs them in ring order and answers at
once. A malformed body raises BodyError, which the channel answers SYSTEM_ERROR with the error
as the remark.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from smartgo.broker.channel import ClientRef
from smartgo.broker.managers.clients import Changes
from smartgo.broker.managers.locks import parse_lock_body, queue_json
from smartgo.broker.managers.topics import DLQ_QUEUES, RW, TopicConfig
from smartgo.common.heartbeat import parse_heartbeat
from smartgo.net import fastjson
from smartgo.net.codes import RequestCode, ResponseCode, dlq_topic, retry_topic
from smartgo.net.command import RemotingCommand
from smartgo.store.errors import OffsetGoneError

if TYPE_CHECKING:
    from smartgo.broker.actors.broker_actor import BrokerActor


class ClientProcessor:
    CODES = {RequestCode.HEART_BEAT: "heart_beat",
             RequestCode.UNREGISTER_CLIENT: "unregister_client",
             RequestCode.GET_CONSUMER_LIST_BY_GROUP: "get_consumer_list_by_group",
             RequestCode.QUERY_CONSUMER_OFFSET: "query_consumer_offset",
             RequestCode.LOCK_BATCH_MQ: "lock_batch_mq",
             RequestCode.UNLOCK_BATCH_MQ: "unlock_batch_mq",
             RequestCode.GET_CONSUMER_CONNECTION_LIST: "get_consumer_connection_list",
             RequestCode.GET_PRODUCER_CONNECTION_LIST: "get_producer_connection_list"}

    def __init__(self, broker: BrokerActor) -> None:
        self.b = broker

    def heart_beat(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """Register the connection in its groups; a consumer group gets its config (when groups
        are created automatically) and, for clustering, its retry topic."""
        hb = parse_heartbeat(request.body_bytes())
        b = self.b
        created, retry_topics = set(), []
        for data in hb.consumers:
            cfg, new = b.groups.find_or_create(data.group, b.auto_create_groups)
            if new:
                created.add(data.group)
            retry = retry_topic(data.group)
            if cfg is not None and data.message_model == "CLUSTERING" and retry not in b.snapshot.topics:
                retry_topics.append(TopicConfig(retry, cfg.retry_queue_nums, cfg.retry_queue_nums, RW))
        if retry_topics:
            b.publish_topics(retry_topics)
        changes = b.clients.heartbeat(client, hb, request.language, request.version)
        changes.state |= created
        b.apply(changes)
        return request.make_response(ResponseCode.SUCCESS)

    def send_back_target(self, net: str, args: dict) -> dict:
        """Where a message a consumer sends back goes (asyncConsumerSendMsgBack): its group's retry
        topic on a random retry queue, delayed by `delay` (0: 3 + reconsume times), or - past the
        group's retryMaxTimes, or the request's max when given, or with a negative delay - the
        group's DLQ, %DLQ%<group>, with one queue. Either topic is created on demand.
        {"topic", "queue_id", "delay" (0 for the DLQ), "config"}, or {"error": [code, remark]}."""
        b = self.b
        group = args["group"]
        cfg, new = b.groups.find_or_create(group, b.auto_create_groups)
        if cfg is None:
            return {"error": [int(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST), f"subscription group not exist, {group}"]}
        if new:
            b.apply(Changes(state={group}))
        reconsume, delay = args["reconsume"], args["delay"]
        limit = cfg.retry_max_times if args["max"] is None else args["max"]
        to_dlq = reconsume >= limit or delay < 0
        if to_dlq:
            topic, queues, queue_id, delay = dlq_topic(group), DLQ_QUEUES, 0, 0
        else:
            topic, queues = retry_topic(group), cfg.retry_queue_nums
            queue_id, delay = random.randrange(queues), delay or 3 + reconsume
        config = b.snapshot.topics.get(topic)
        if config is None:
            config = TopicConfig(topic, queues, queues, RW)
            b.log.info("created %s for consumer group %s (send-back from %s)", topic, group, net)
            b.publish_topics([config])
        if not config.writable:
            return {"error": [int(ResponseCode.NO_PERMISSION), f"the topic[{topic}] sending message is forbidden"]}
        if to_dlq:
            b.stats.dead_lettered(args.get("origin") or "", group, time.time_ns() // 1_000_000)
        return {"topic": topic, "queue_id": queue_id % config.queue_limit, "delay": delay, "config": config.to_json()}

    def unregister_client(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        client_id = request.ext_str("clientID")          # required (@CFNotNull); names a presumed member
        self.b.apply(self.b.clients.unregister(client, request.ext_str("producerGroup", None),
                                               request.ext_str("consumerGroup", None), client_id))
        return request.make_response(ResponseCode.SUCCESS)

    def get_consumer_list_by_group(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        group = request.ext_str("consumerGroup")
        ids = self.b.clients.consumer_ids(group)
        if not ids:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps({"consumerIdList": ids}))

    def get_consumer_connection_list(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        group = request.ext_str("consumerGroup")
        info = self.b.clients.consumers.get(group)
        if info is None or not info.channels:           # presumed members (a restart) are not connections
            return request.make_response(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps(info.connection_json()))

    def get_producer_connection_list(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """ProducerConnection: the group's connections that sent a heartbeat within client_expiry
        (what mqadmin producerConnection and the dashboard's producer view show)."""
        group = request.ext_str("producerGroup")
        channels = self.b.clients.producers.get(group)
        if not channels:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps(
            {"connectionSet": [ch.to_json() for ch in channels.values()]}))

    def query_consumer_offset(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """The committed offset; for a group that committed none, 0 while the queue's first
        message is still there and in memory (reference F), else QUERY_NOT_FOUND (the client
        then applies consumeFromWhere)."""
        group, topic, queue_id = request.ext_str("consumerGroup"), request.ext_str("topic"), request.ext_int("queueId")
        offset = self.b.offsets.query(group, topic, queue_id)
        if offset < 0 and self._starts_at_zero(topic, queue_id):
            offset = 0
        if offset < 0:
            return request.make_response(ResponseCode.QUERY_NOT_FOUND,
                                         "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return request.make_response(ResponseCode.SUCCESS, None, {"offset": str(offset)})

    def _starts_at_zero(self, topic: str, queue_id: int) -> bool:
        view = self.b.view
        max_offset = view.max_offset(topic, queue_id)
        if not max_offset:
            return True                         # empty: message 0 is not on disk
        reader = view.fresh_reader()
        if reader.min_offset(topic, queue_id, max_offset) > 0:
            return False
        try:
            phys = reader.queue(topic, queue_id).entry(0)[0]
        except (OffsetGoneError, OSError, ValueError):
            return True
        return reader.in_memory(phys, view.written.get())

    def lock_batch_mq(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        req = parse_lock_body(request.body_bytes(), "LockBatchRequestBody")
        locked = self.b.locks.try_lock(req.group, req.queues, req.client_id)
        return request.make_response(ResponseCode.SUCCESS,
                                     body=fastjson.dumps({"lockOKMQSet": [queue_json(q) for q in locked]}))

    def unlock_batch_mq(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        req = parse_lock_body(request.body_bytes(), "UnlockBatchRequestBody")
        self.b.locks.unlock(req.group, req.queues, req.client_id)
        return request.make_response(ResponseCode.SUCCESS)
