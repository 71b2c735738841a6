"""Consume progress, the admin requests about what groups have consumed and what is left
(RocketMQ's AdminBrokerProcessor): GET_ALL_CONSUMER_OFFSET (43), GET_CONSUME_STATS (208),
GET_BROKER_CONSUME_STATS (317), QUERY_CONSUME_TIME_SPAN (303), QUERY_CONSUME_QUEUE (321),
QUERY_TOPIC_CONSUME_BY_WHO (300), CLONE_GROUP_OFFSET (314), INVOKE_BROKER_TO_RESET_OFFSET (222)
and GET_ALL_DELAY_OFFSET (45). The broker actor serves them from its offset table and the mapped
store, the last from the schedule actor's persisted progress.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from smartgo.broker.processor.admin_processor import mq_json, queue_keyed, refuse_old_consumers
from smartgo.broker.schedule import schedule_offsets
from smartgo.broker.channel import ClientRef
from smartgo.broker.managers.topics import TopicConfig
from smartgo.net import fastjson
from smartgo.net.codes import FLAG_ONEWAY, LanguageCode, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.config import CQ_UNIT
from smartgo.store.consume_queue import ENTRY
from smartgo.store.errors import OffsetGoneError

if TYPE_CHECKING:
    from smartgo.broker.actors.broker_actor import BrokerActor
    from smartgo.store import StoreReader


def java_time(ms: int) -> str:
    """UtilAll.timeMillisToHumanString3's pattern, yyyy-MM-dd#HH:mm:ss:SSS, in local time (the
    *Str fields of QueueTimeSpan)."""
    return time.strftime("%Y-%m-%d#%H:%M:%S", time.localtime(ms // 1000)) + f":{ms % 1000:03d}"


class ProgressProcessor:
    CODES = {RequestCode.GET_ALL_CONSUMER_OFFSET: "get_all_consumer_offset",
             RequestCode.GET_CONSUME_STATS: "get_consume_stats",
             RequestCode.GET_BROKER_CONSUME_STATS: "get_broker_consume_stats",
             RequestCode.QUERY_CONSUME_TIME_SPAN: "query_consume_time_span",
             RequestCode.QUERY_CONSUME_QUEUE: "query_consume_queue",
             RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: "query_topic_consume_by_who",
             RequestCode.CLONE_GROUP_OFFSET: "clone_group_offset",
             RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: "reset_offset",
             RequestCode.GET_ALL_DELAY_OFFSET: "get_all_delay_offset"}

    def __init__(self, broker: BrokerActor) -> None:
        self.b = broker

    def get_all_consumer_offset(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS, body=self.b.offsets.encode())

    async def get_all_delay_offset(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """The schedule actor's persisted progress (smartgo.broker.schedule.schedule_offsets)."""
        return await schedule_offsets.get_all_delay_offset(self.b.config.store_path, request)

    # ---- lag ----------------------------------------------------------------------------------------------
    def _followed(self, group: str, topic: str) -> bool:
        """False for a topic the group has offsets in but its online consumers no longer
        subscribe (findSubscriptionData is null while findSubscriptionDataCount > 0)."""
        info = self.b.clients.consumers.get(group)
        return info is None or not info.subscriptions or topic in info.subscriptions

    def _consume_stats(self, group: str, cfg: TopicConfig, queues: int, reader: StoreReader,
                       written: int) -> tuple[list[tuple[dict, dict]], int]:
        """ConsumeStats' offsetTable entries for the topic's first `queues` queues, and their lag."""
        b, t = self.b, cfg.name
        entries, diff = [], 0
        for q in range(queues):
            broker_offset = b.view.max_offset(t, q)
            consumer_offset = max(b.offsets.query(group, t, q), 0)
            last = reader.message_store_time(t, q, consumer_offset - 1, broker_offset, written) \
                if consumer_offset > 0 else 0
            entries.append((mq_json(b.config.broker_name, t, q),
                            {"brokerOffset": broker_offset, "consumerOffset": consumer_offset,
                             "lastTimestamp": max(last, 0)}))
            diff += broker_offset - consumer_offset
        return entries, diff

    def get_consume_stats(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """ConsumeStats: per readable queue of the group's topics, the broker's max offset, the
        group's offset and the store time of the last message it consumed; consumeTps = its pulled
        messages per second over the last minute."""
        b = self.b
        group = request.ext_str("consumerGroup")
        topic = request.ext_str("topic", "")
        view = b.view
        reader, written = view.fresh_reader(), view.written.get()
        entries, tps = [], 0.0
        for t in [topic] if topic else b.offsets.topics_of(group):
            cfg = b.snapshot.topics.get(t)
            if cfg is None or not self._followed(group, t):
                continue
            entries += self._consume_stats(group, cfg, cfg.read_queues, reader, written)[0]
            tps += b.stats.group_tps(group, t)
        return request.make_response(ResponseCode.SUCCESS, body=queue_keyed(entries, consumeTps=round(tps, 3)))

    def get_broker_consume_stats(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """ConsumeStatsList (fetchAllConsumeStatsInBroker): every subscription group, with a
        ConsumeStats per topic it has offsets in (only ordered topics with isOrder), and the
        broker's total lag: what mqadmin brokerConsumeStats prints. As in 4.x the queues are the
        write queues, and a group without topics is listed with an empty list. Departure: a group
        with offsets but no subscription group config (committed by a tool, or created while
        auto-creation was off) is listed too; 4.x leaves its lag out."""
        b = self.b
        order_only = request.ext_bool("isOrder", False)
        view = b.view
        reader, written = view.fresh_reader(), view.written.get()
        parts, total = [], 0
        for group in sorted(set(b.groups.table) | {g for _, g in b.offsets.table}):
            stats = []
            for t in b.offsets.topics_of(group):
                cfg = b.snapshot.topics.get(t)
                if cfg is None or (order_only and not cfg.order) or not self._followed(group, t):
                    continue
                entries, diff = self._consume_stats(group, cfg, cfg.write_queues, reader, written)
                stats.append(queue_keyed(entries, consumeTps=b.stats.group_tps(group, t)))
                total += diff
            parts.append(b"{" + fastjson.dumps(group) + b":[" + b",".join(stats) + b"]}")
        body = b'{"brokerAddr":' + fastjson.dumps(b.identity["addr"]) + b',"consumeStatsList":[' + \
            b",".join(parts) + b'],"totalDiff":' + str(total).encode() + b"}"
        return request.make_response(ResponseCode.SUCCESS, body=body)

    def query_consume_time_span(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """QueryConsumeTimeSpanBody: per write queue, the store times of its first and last
        message and of the group's last consumed one, and how long the group's next message has
        waited (delayTime; 0 when the group is at the end). Departure: a group without an offset
        counts from the queue's first message, where 4.x reads index -1 and answers now + 1."""
        b = self.b
        topic, group = request.ext_str("topic"), request.ext_str("group")
        cfg = b.snapshot.topics.get(topic)
        if cfg is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        view = b.view
        reader, written = view.fresh_reader(), view.written.get()
        now = int(time.time() * 1000)
        spans = []
        for q in range(cfg.write_queues):
            max_offset = view.max_offset(topic, q)
            min_offset = reader.min_offset(topic, q, max_offset)
            min_time = reader.message_store_time(topic, q, min_offset, max_offset, written)
            max_time = reader.message_store_time(topic, q, max_offset - 1, max_offset, written)
            consumer_offset = b.offsets.query(group, topic, q)
            consume_time = reader.message_store_time(topic, q, consumer_offset - 1, max_offset, written) \
                if consumer_offset > 0 else min_time
            next_time = reader.message_store_time(topic, q, max(consumer_offset, min_offset), max_offset, written)
            spans.append({"consumeTimeStamp": consume_time, "consumeTimeStampStr": java_time(consume_time),
                          "delayTime": now - next_time if next_time >= 0 else 0,
                          "maxTimeStamp": max_time, "maxTimeStampStr": java_time(max_time),
                          "messageQueue": mq_json(b.config.broker_name, topic, q),
                          "minTimeStamp": min_time, "minTimeStampStr": java_time(min_time)})
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps({"consumeTimeSpanSet": spans}))

    def query_consume_queue(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """QueryConsumeQueueResponseBody (mqadmin queryCq): up to `count` raw ConsumeQueue entries
        from `index`, within one file, the queue's bounds, and with consumerGroup the group's
        online subscription. As in 4.x an index outside the queue is SUCCESS with a remark and
        no body. filterData is 4.x's text for a group that is not online, else "null" (SQL92
        expressions are compiled where pulls are served, not kept here)."""
        b = self.b
        topic, queue_id = request.ext_str("topic"), request.ext_int("queueId", 0)
        index, count = request.ext_int("index", 0), request.ext_int("count", 0)
        group = request.ext_str("consumerGroup", None)
        cfg = b.snapshot.topics.get(topic)
        max_offset = b.view.max_offset(topic, queue_id)
        if (cfg is None or not 0 <= queue_id < max(cfg.read_queues, cfg.write_queues)) and not max_offset:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"{queue_id}@{topic} is not exist!")
        reader = b.view.fresh_reader()
        body: dict = {"maxQueueIndex": max_offset, "minQueueIndex": reader.min_offset(topic, queue_id, max_offset)}
        if group is not None:
            sub = b.clients.subscription(group, topic)
            if sub is None:
                body["filterData"] = f"{group}@{topic} is not online!"
            else:
                body["filterData"] = "null"
                body["subscriptionData"] = sub.to_json()
        try:
            raw = reader.queue(topic, queue_id).entries(index, count, max_offset) \
                if body["minQueueIndex"] <= index < max_offset else None
        except OffsetGoneError:
            raw = None
        if raw is None:
            return request.make_response(ResponseCode.SUCCESS,
                                         f"Index {index} of {queue_id}@{topic} is not exist!")
        body["queueData"] = [{"eval": False, "physicOffset": phys, "physicSize": size, "tagsCode": tags}
                             for phys, size, tags in (ENTRY.unpack_from(raw, i) for i in range(0, len(raw), CQ_UNIT))]
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps(body))

    # ---- groups of a topic --------------------------------------------------------------------------------
    def query_topic_consume_by_who(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """GroupList of a topic: groups with an online consumer subscribed to it, and groups with
        offsets in it (ConsumerManager.queryTopicConsumeByWho + whichGroupByTopic)."""
        b = self.b
        topic = request.ext_str("topic")
        groups = {g for g, info in b.clients.consumers.items() if topic in info.subscriptions and info.channels}
        groups |= b.offsets.groups_of(topic)
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps({"groupList": sorted(groups)}))

    # ---- moving offsets -----------------------------------------------------------------------------------
    def clone_group_offset(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """destGroup's offsets become srcGroup's, in `topic` or in every topic srcGroup has offsets
        in; without `offline`, a topic the online srcGroup no longer subscribes is skipped. 4.x
        copies the header's topic in its loop, so a clone without a topic copies nothing; here it
        copies each topic (a departure). Consumers of destGroup that are online keep their own
        offsets and commit over the copy, as in 4.x."""
        b = self.b
        src, dest = request.ext_str("srcGroup"), request.ext_str("destGroup")
        topic, offline = request.ext_str("topic", ""), request.ext_bool("offline", False)
        cloned = []
        for t in [topic] if topic else b.offsets.topics_of(src):
            if t not in b.snapshot.topics or not (offline or self._followed(src, t)):
                continue
            if b.offsets.clone(src, dest, t):
                cloned.append(t)
        if cloned:
            b.log.info("offsets of %s cloned to %s by %s in %s", src, dest, client.addr, ", ".join(cloned))
        return request.make_response(ResponseCode.SUCCESS)

    def reset_offset(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_RESET_OFFSET (Broker2Client.resetOffset): per write queue, the offset of
        the first message stored at or after `timestamp` (-1: the queue's end), or the group's own
        offset where that is lower and isForce is false. Every online consumer of the group gets the
        table (RESET_CONSUMER_CLIENT_OFFSET, oneway) and moves there itself, as in 4.x: the broker's
        offsets change when the consumers commit. An offline group is CONSUMER_NOT_ONLINE, on which
        tools commit the offsets themselves (mqadmin's resetOffsetByTime falls back, as does
        `smartgo admin reset-offset`). The answer carries the table."""
        b = self.b
        topic, group = request.ext_str("topic"), request.ext_str("group")
        timestamp, force = request.ext_int("timestamp"), request.ext_bool("isForce", False)
        cfg = b.snapshot.topics.get(topic)
        if cfg is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, "[reset-offset] reset offset failed, no topic "
                                                                    f"in this broker. topic={topic}")
        view = b.view
        reader, written = view.fresh_reader(), view.written.get()
        table = []
        for q in range(cfg.write_queues):
            current = b.offsets.query(group, topic, q)
            if current == -1:
                return request.make_response(ResponseCode.SYSTEM_ERROR, f"THe consumer group <{group}> not exist")
            end = view.max_offset(topic, q)
            target = end if timestamp == -1 else reader.search_offset_by_time(topic, q, timestamp, end, written)
            target = max(target, 0)
            table.append((q, target if force or target < current else current))
        channels = b.clients.consumer_channels(group)
        if not channels:
            return request.make_response(ResponseCode.CONSUMER_NOT_ONLINE, "Consumer not online, so can not reset "
                                         f"offset, Group: {group} Topic: {topic} Timestamp: {timestamp}")
        refused = refuse_old_consumers(request, channels)
        if refused is not None:
            return refused
        name = b.config.broker_name
        java_body = queue_keyed([(mq_json(name, topic, q), offset) for q, offset in table])
        c_body = fastjson.dumps({"offsetTable": [{**mq_json(name, topic, q), "offset": offset} for q, offset in table]})
        ext = {"topic": topic, "group": group, "timestamp": str(timestamp), "isForce": "false"}
        for ch in channels:                 # a C++ consumer reads the list form (ResetOffsetBodyForC)
            b.channel.push(ch.ref, RemotingCommand(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, flag=FLAG_ONEWAY,
                                                   ext_fields=ext,
                                                   body=c_body if ch.language == LanguageCode.CPP else java_body))
        b.log.info("[reset-offset] group %s topic %s to %s (timestamp %d, force %s): told %d consumers",
                   group, topic, dict(table), timestamp, force, len(channels))
        return request.make_response(ResponseCode.SUCCESS, body=java_body)
