"""Admin requests the broker actor serves (RocketMQ's AdminBrokerProcessor): topics
(UPDATE_AND_CREATE_TOPIC 17, DELETE_TOPIC_IN_BROKER 215, GET_ALL_TOPIC_CONFIG 21,
GET_TOPIC_STATS_INFO 202, GET_SYSTEM_TOPIC_LIST_FROM_BROKER 305), subscription groups (200, 201,
DELETE_SUBSCRIPTIONGROUP 207), requests relayed to consumers (GET_CONSUMER_RUNNING_INFO 307,
CONSUME_MESSAGE_DIRECTLY 309, INVOKE_BROKER_TO_GET_CONSUMER_STATUS 223), GET_BROKER_RUNTIME_INFO
(28), VIEW_BROKER_STATS_DATA (315) and the broker config (GET_BROKER_CONFIG 26,
UPDATE_BROKER_CONFIG 25). Consume progress is progress_processor.py's.

Bodies keyed by MessageQueue (TopicStatsTable, ConsumeStats, ResetOffsetBody) are written as
fastjson writes them, with the queue object in key position (facts D); SmartGo's and Java's
clients read that.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import psutil

from smartgo.actors.health import node_health
from smartgo.broker.broker_config import check_updates, properties_text
from smartgo.broker.channel import ClientRef, InvokeError
from smartgo.broker.managers.clients import ClientChannel
from smartgo.broker.managers.groups import DEFAULT_GROUPS, parse_group_body
from smartgo.broker.net_view import store_backlog
from smartgo.broker.settings import is_slave
from smartgo.broker.managers.topics import DEFAULT_TOPIC, MAX_QUEUES, TopicConfig, default_topics, system_topics
from smartgo.common.properties import parse_properties
from smartgo.net import fastjson
from smartgo.net.codes import CURRENT_VERSION, MQVersion, RequestCode, ResponseCode
from smartgo.net.command import Buffer, RemotingCommand
from smartgo.net.loop import wait_within
from smartgo.store.errors import InvalidMessageIdError, MessageIllegalError
from smartgo.store.record import parse_offset_msg_id, topic_field

if TYPE_CHECKING:
    from smartgo.broker.actors.broker_actor import BrokerActor

REGISTERED_WAIT = 2.0      # an admin change is answered once the registries have it, or after this
CALL_CLIENT_TIMEOUT = 10.0  # s a relayed request waits for the consumer (Broker2Client.callClient)
CONSUMER_STATUS_TIMEOUT = 5.0  # s each consumer has to tell its offsets (Broker2Client.getConsumeStatus)


def mq_json(broker_name: str, topic: str, queue_id: int) -> dict:
    """MessageQueue as fastjson writes it."""
    return {"brokerName": broker_name, "queueId": queue_id, "topic": topic}


def _queue_key(key: object) -> object:
    """A MessageQueue key of a client's body as mq_json's (brokerName, topic, queueId); other keys as they are."""
    if not isinstance(key, dict):
        return key
    broker_name, queue_id, topic = key.get("brokerName"), key.get("queueId"), key.get("topic")
    if not (isinstance(broker_name, str) and isinstance(queue_id, int) and isinstance(topic, str)):
        raise ValueError(f"{key} is not a MessageQueue")
    return broker_name, topic, queue_id


def refuse_old_consumers(request: RemotingCommand, channels: list[ClientChannel]) -> RemotingCommand | None:
    """4.x's refusal of a reset or status call when a consumer predates V3_0_7_SNAPSHOT."""
    old = next((ch for ch in channels if ch.version < MQVersion.V3_0_7_SNAPSHOT), None)
    if old is None:
        return None
    return request.make_response(ResponseCode.SYSTEM_ERROR, f"the client does not support this feature. "
                                 f"version={old.version}")


def queue_keyed(entries: Sequence[tuple[dict, object]], **fields: object) -> bytes:
    """{...fields, "offsetTable": {<MessageQueue object>: value, ...}} as fastjson writes it."""
    head = b"".join(fastjson.dumps(k) + b":" + fastjson.dumps(v) + b"," for k, v in sorted(fields.items()))
    return b"{" + head + b'"offsetTable":' + fastjson.dumps_keyed(entries) + b"}"


class AdminProcessor:
    CODES = {RequestCode.UPDATE_AND_CREATE_TOPIC: "update_and_create_topic",
             RequestCode.DELETE_TOPIC_IN_BROKER: "delete_topic",
             RequestCode.GET_ALL_TOPIC_CONFIG: "get_all_topic_config",
             RequestCode.GET_TOPIC_STATS_INFO: "get_topic_stats_info",
             RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: "update_and_create_subscription_group",
             RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: "get_all_subscription_group_config",
             RequestCode.DELETE_SUBSCRIPTIONGROUP: "delete_subscription_group",
             RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: "get_system_topic_list",
             RequestCode.GET_CONSUMER_RUNNING_INFO: "get_consumer_running_info",
             RequestCode.CONSUME_MESSAGE_DIRECTLY: "consume_message_directly",
             RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: "get_consumer_status",
             RequestCode.GET_BROKER_RUNTIME_INFO: "get_broker_runtime_info",
             RequestCode.VIEW_BROKER_STATS_DATA: "view_broker_stats_data",
             RequestCode.GET_BROKER_CONFIG: "get_broker_config",
             RequestCode.UPDATE_BROKER_CONFIG: "update_broker_config"}

    def __init__(self, broker: BrokerActor) -> None:
        self.b = broker

    # ---- topics -------------------------------------------------------------------------------------
    async def _registered(self, round_done: asyncio.Future) -> None:
        """Like Java's synchronous registerIncrementBrokerData: a tool that routes right after
        the answer finds the topic. A registry that is down does not hold the answer past
        REGISTERED_WAIT (the change stands; the registration retries every register_interval)."""
        try:
            await wait_within(asyncio.shield(round_done), REGISTERED_WAIT)
        except asyncio.TimeoutError:
            self.b.log.warning("topic change answered before every registry confirmed it (%gs)", REGISTERED_WAIT)

    async def update_and_create_topic(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """Create or replace (AdminBrokerProcessor.updateAndCreateTopic)."""
        topic = request.ext_str("topic")
        try:
            topic_field(topic)
        except MessageIllegalError:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The specified topic[{topic[:200]}] contains "
                                         "illegal characters or is longer than 127, allowing only ^[%|a-zA-Z0-9_-]+$")
        if topic == DEFAULT_TOPIC:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"The topic[{topic}] is conflict with system reserved words.")
        cfg = TopicConfig(topic, request.ext_int("readQueueNums"), request.ext_int("writeQueueNums"),
                          request.ext_int("perm"), request.ext_str("topicFilterType", "SINGLE_TAG"),
                          request.ext_int("topicSysFlag", 0), request.ext_bool("order", False))
        if not (0 < cfg.read_queues <= MAX_QUEUES and 0 < cfg.write_queues <= MAX_QUEUES):
            why = f"readQueueNums and writeQueueNums must be in 1..{MAX_QUEUES}, got {cfg.read_queues} and " \
                  f"{cfg.write_queues}"
            self.b.log.error("topic %s refused to %s: %s", topic, client.addr, why)
            return request.make_response(ResponseCode.SYSTEM_ERROR, why)
        table = self.b.board.queues
        new, room = sum(table.index_of(topic, q) is None for q in range(cfg.queue_limit)), table.limit - table.count
        if new > room:
            why = (f"the broker has room for {room} more queues, not {new}: it holds {table.limit} (a restart sizes "
                   "its queue table from the store; board_queue_capacity starts it larger)")
            self.b.log.error("topic %s refused to %s: %s", topic, client.addr, why)
            return request.make_response(ResponseCode.SYSTEM_ERROR, why)
        if self.b.snapshot.topics.get(topic) != cfg:
            self.b.log.info("topic %s set by %s: %s", topic, client.addr, cfg)
            await self._registered(self.b.publish_topics([cfg]))
        return request.make_response(ResponseCode.SUCCESS)

    async def delete_topic(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """The topic's config and its consumer offsets go; its queue files stay until retention
        removes them (a topic created again under the name continues their offsets)."""
        topic = request.ext_str("topic")
        if topic in {c.name for c in default_topics(self.b.config)}:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is a system topic of this "
                                         "broker and cannot be deleted.")
        self.b.offsets.remove(topic=topic)
        if topic in self.b.snapshot.topics:
            self.b.log.info("topic %s deleted by %s", topic, client.addr)
            await self._registered(self.b.publish_topics([], [topic]))
        return request.make_response(ResponseCode.SUCCESS)

    def get_all_topic_config(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps(self.b.snapshot.wrapper_json()))

    def get_topic_stats_info(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """TopicStatsTable: min and max offset and last store time of every write queue."""
        topic = request.ext_str("topic")
        cfg = self.b.snapshot.topics.get(topic)
        if cfg is None:
            return request.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        view = self.b.view
        reader, written = view.fresh_reader(), view.written.get()
        entries = []
        for q in range(cfg.write_queues):
            max_offset = view.max_offset(topic, q)
            min_offset = reader.min_offset(topic, q, max_offset) if max_offset else 0
            last = reader.message_store_time(topic, q, max_offset - 1, max_offset, written) if max_offset else 0
            entries.append((mq_json(self.b.config.broker_name, topic, q),
                            {"lastUpdateTimestamp": max(last, 0), "maxOffset": max_offset, "minOffset": min_offset}))
        return request.make_response(ResponseCode.SUCCESS, body=queue_keyed(entries))

    def get_system_topic_list(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS,
                                     body=fastjson.dumps({"topicList": system_topics(self.b.config)}))

    # ---- subscription groups ----------------------------------------------------------------------------
    def update_and_create_subscription_group(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        cfg = parse_group_body(request.body_bytes())
        self.b.log.info("subscription group %s set by %s: %s", cfg.name, client.addr, cfg)
        self.b.groups.update([cfg])
        self.b.sync_groups({cfg.name})
        return request.make_response(ResponseCode.SUCCESS)

    def get_all_subscription_group_config(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS, body=self.b.groups.encode())

    def delete_subscription_group(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        group = request.ext_str("groupName")
        if group in DEFAULT_GROUPS:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"{group} is a system group and cannot be deleted")
        if self.b.groups.get(group) is not None:
            self.b.log.info("subscription group %s deleted by %s", group, client.addr)
            self.b.groups.update([], (group,))
            self.b.sync_groups({group})
        if request.ext_bool("removeOffset", False):
            self.b.offsets.remove(group=group)
        return request.make_response(ResponseCode.SUCCESS)

    # ---- requests relayed to one consumer ------------------------------------------------------------------
    async def get_consumer_running_info(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """The consumer's own ConsumerRunningInfo (its settings, subscriptions, queues and consume
        rates), asked of it through its connection: what the dashboard's client view shows."""
        return await self._call_consumer(request, request.body)

    async def consume_message_directly(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """The consumer runs its listener on one stored message (named by its offsetMsgId) and
        answers ConsumeMessageDirectlyResult. As in 4.x the record goes as the body and brokerName
        is added to the header; a message id that names no record here is refused before the
        consumer is asked (4.x sends an empty body on)."""
        msg_id = request.ext_str("msgId")
        try:
            offset = parse_offset_msg_id(msg_id)[2]
        except InvalidMessageIdError as exc:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"bad msgId: {exc}")
        view = self.b.view
        record = view.fresh_reader().view(offset, view.written.get())
        if record is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return await self._call_consumer(request, bytes(record), brokerName=self.b.config.broker_name)

    async def get_consumer_status(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """GetConsumerStatusBody (Broker2Client.getConsumeStatus, mqadmin getConsumerStatus): the
        offsets each consumer of the group holds for the topic, asked of every one of them
        (GET_CONSUMER_STATUS_FROM_CLIENT) or only of the client whose id is clientAddr. A consumer
        that fails, times out or answers garbage is left out, with a log line, as in 4.x; 4.x asks
        them one after another, 5 s each, this asks them all at once."""
        b = self.b
        topic, group, only = request.ext_str("topic"), request.ext_str("group"), request.ext_str("clientAddr", "")
        channels = b.clients.consumer_channels(group)
        if not channels:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"No Any Consumer online in the consumer group: [{group}]")
        refused = refuse_old_consumers(request, channels)
        if refused is not None:
            return refused
        asked = [ch for ch in channels if not only or ch.client_id == only]
        call = RemotingCommand(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, ext_fields={"topic": topic, "group": group})
        answers = await asyncio.gather(*(b.channel.invoke(ch.ref, call, CONSUMER_STATUS_TIMEOUT) for ch in asked),
                                       return_exceptions=True)
        tables = []
        for ch, answer in zip(asked, answers):
            try:
                if isinstance(answer, BaseException):
                    raise answer
                if answer.code != ResponseCode.SUCCESS or not answer.body:
                    raise ValueError(f"code {answer.code}: {answer.remark}")
                queues = fastjson.loads_keyed(answer.body_bytes(), _queue_key)["messageQueueTable"]
                tables.append((ch.client_id, fastjson.dumps_keyed((mq_json(*k), int(v)) for k, v in queues.items())))
            except (InvokeError, ValueError, TypeError, KeyError) as exc:
                b.log.warning("[consumer-status] %s of %s at %s left out: %s", ch.client_id, group, ch.ref.addr, exc)
        body = b'{"consumerTable":{' + b",".join(fastjson.dumps(cid) + b":" + t for cid, t in tables) + \
            b'},"messageQueueTable":{}}'
        return request.make_response(ResponseCode.SUCCESS, body=body)

    async def _call_consumer(self, request: RemotingCommand, body: Buffer | Sequence[Buffer] | None,
                             **added: str) -> RemotingCommand:
        """AdminBrokerProcessor.callConsumer: the request (its header plus `added`), under a new
        opaque, to the connection of clientId in consumerGroup; the consumer's response is the
        answer, as it is."""
        group, client_id = request.ext_str("consumerGroup"), request.ext_str("clientId")
        ch = next((c for c in self.b.clients.consumer_channels(group) if c.client_id == client_id), None)
        if ch is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online")
        if ch.version < MQVersion.V3_1_8_SNAPSHOT:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The Consumer <{client_id}> Version "
                                         f"<{ch.version}> too low to finish, please upgrade it to V3_1_8_SNAPSHOT")
        call = RemotingCommand(request.code, ext_fields={**(request.ext_fields or {}), **added}, body=body)
        try:
            return await self.b.channel.invoke(ch.ref, call, CALL_CLIENT_TIMEOUT)
        except InvokeError as exc:
            self.b.log.warning("[call-consumer] code %d to %s of %s at %s failed: %s", request.code, client_id, group,
                               ch.ref.addr, exc)
            if exc.timeout:
                return request.make_response(ResponseCode.CONSUME_MSG_TIMEOUT,
                                             f"consumer <{group}> <{client_id}> Timeout: {exc}")
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"invoke consumer <{group}> <{client_id}> Exception: {exc}")

    # ---- runtime info and config ------------------------------------------------------------------------
    def get_broker_runtime_info(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS,
                                     body=fastjson.dumps({"table": self.runtime_info()}))

    def runtime_info(self) -> dict[str, str]:
        """RocketMQ's runtime keys that clients and tools read (their meaning kept; TPS triples
        are over 10 s, 1 min and 10 min), the 1-hour TPS, and smartgoHealth: the node's health
        report (smartgo.actors.health.node_health) as JSON."""
        b = self.b
        f = b.board.scalars()
        now = time.monotonic()
        book = b.stats
        t = book.totals

        def tps(name: str) -> str:
            return " ".join(f"{book.tps(name, s, now):.2f}" for s in (10, 60, 600))
        found, missed = book.tps("pulls_found", 10, now), book.tps("pulls_missed", 10, now)
        try:
            disk = psutil.disk_usage(str(b.config.store_path))
            capacity = f"Total : {disk.total / (1 << 30):.1f} GiB, Free : {disk.free / (1 << 30):.1f} GiB."
        except OSError:
            capacity = "unknown"
        booted_ms = f["node.started_ns"] // 1_000_000
        up = max(0, int(time.time() - booted_ms / 1000))
        consumer_groups, producer_groups, connections = b.clients.counts()
        health = node_health(b.board, b.cpu_sampler)
        mqtt = b.mqtt.summary()
        if mqtt is not None:
            health["mqtt"] = mqtt            # the MQTT actors' counters (mqtt_processor.py)
        morning, yesterday = b.day_totals()
        dispatch_behind, flush_behind = store_backlog(f)
        info = {
            "brokerVersionDesc": CURRENT_VERSION.name, "brokerVersion": str(int(CURRENT_VERSION)),
            "msgPutTotalYesterdayMorning": str(yesterday[0]), "msgPutTotalTodayMorning": str(morning[0]),
            "msgPutTotalTodayNow": str(t["put_msgs"]),
            "msgGetTotalYesterdayMorning": str(yesterday[1]), "msgGetTotalTodayMorning": str(morning[1]),
            "msgGetTotalTodayNow": str(t["get_msgs"]),
            "putTps": tps("put_msgs"), "getTransferedTps": tps("get_msgs"), "getFoundTps": tps("pulls_found"),
            "getMissTps": tps("pulls_missed"), "getTotalTps": f"{found + missed:.2f}",
            "putTps1h": f"{book.tps('put_msgs', 3600, now):.2f}",
            "getTransferedTps1h": f"{book.tps('get_msgs', 3600, now):.2f}",
            "putMessageTimesTotal": str(t["put_msgs"]), "putMessageSizeTotal": str(t["put_bytes"]),
            "putMessageAverageSize": f"{t['put_bytes'] / t['put_msgs'] if t['put_msgs'] else 0.0:.1f}",
            "putMessageEntireTimeMax": str(int(book.send.max_ms)),
            "getMessageEntireTimeMax": str(int(book.pull.max_ms)),
            "commitLogMinOffset": str(f["commitlog.min"]), "commitLogMaxOffset": str(f["commitlog.written"]),
            # 4.x's BrokerRole names, and the highest position a slave reported: automatic failover
            # promotes only a slave that holds everything a SYNC_MASTER acknowledged
            "brokerRole": "SLAVE" if is_slave(b.config) else f"{b.config.replication.upper()}_MASTER",
            "slaveAckedOffset": str(f["commitlog.slave_acked"]),
            **b.roles.runtime_fields(),
            "commitLogDiskRatio": str(f["disk.used_permille"] / 1000), "consumeQueueDiskRatio":
                str(f["disk.used_permille"] / 1000), "commitLogDirCapacity": capacity,
            "dispatchBehindBytes": str(dispatch_behind), "remainHowManyDataToFlush": str(flush_behind),
            "earliestMessageTimeStamp": str(b.earliest_message_time()),
            "bootTimestamp": str(booted_ms),
            "runtime": f"[ {up // 86400} days, {up % 86400 // 3600} hours, {up % 3600 // 60} minutes, "
                       f"{up % 60} seconds ]",
            "startAcceptSendRequestTimeStamp": "0", "pageCacheLockTimeMills": "0",
            "sendThreadPoolQueueSize": "0", "sendThreadPoolQueueCapacity": "0", "pullThreadPoolQueueSize": "0",
            "pullThreadPoolQueueCapacity": "0", "queryThreadPoolQueueSize": "0", "queryThreadPoolQueueCapacity": "0",
            "sendThreadPoolQueueHeadWaitTimeMills": "0", "pullThreadPoolQueueHeadWaitTimeMills": "0",
            "queryThreadPoolQueueHeadWaitTimeMills": "0",
            "brokerPermission": str(b.runtime.config.broker_permission),
            "consumerGroups": str(consumer_groups), "producerGroups": str(producer_groups),
            "clientConnections": str(connections),
            "smartgoHealthy": "true" if health["healthy"] else "false",
            "smartgoHealth": json.dumps(health, separators=(",", ":")),
        }
        return info

    def view_broker_stats_data(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """BrokerStatsData of one stats item (stats_items.py): the dashboard's and mqadmin
        statsAll's TPS and 24-hour sums per topic (TOPIC_PUT_NUMS) and topic@group (GROUP_GET_NUMS)."""
        name, key = request.ext_str("statsName", None), request.ext_str("statsKey", None)
        item = self.b.stats.items.get(name, key) if name is not None and key is not None else None
        if item is None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps(item.stats_data()))

    def get_broker_config(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        runtime = self.b.runtime
        return request.make_response(ResponseCode.SUCCESS, None, {"version": runtime.version_json()},
                                     properties_text(runtime.config).encode())

    def update_broker_config(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        changes = check_updates(parse_properties(request.body_bytes()))
        changed = self.b.runtime.update(changes)
        if changed:
            self.b.log.info("broker config changed by %s: %s", client.addr, changed)
            self.b.apply_settings(changed)
        return request.make_response(ResponseCode.SUCCESS)
