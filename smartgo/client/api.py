"""The client's wire calls as pure functions (Java's MQClientAPIImpl minus the sockets): one
builder per request code that names its header fields exactly as RocketMQ's *RequestHeader
classes do (facts B and C), and decoders for the responses. Every extFields value is a string,
as Java's makeCustomHeaderToNet writes them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from smartgo.client.errors import BrokerError
from smartgo.client.message import MessageQueue, Prop, PullStatus, SendResult, SendStatus, inflate_body
from smartgo.net import fastjson
from smartgo.net.codes import RequestCode as RC
from smartgo.net.codes import ResponseCode as R
from smartgo.net.command import RemotingCommand
from smartgo.store.errors import CorruptRecordError
from smartgo.store.record import MessageExt, decode_properties, iter_records

DEFAULT_TOPIC = "TBW102"
DEFAULT_TOPIC_QUEUE_NUMS = 4
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"

_SEND_STATUS: dict[int, SendStatus] = {
    R.SUCCESS: SendStatus.SEND_OK, R.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    R.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT, R.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}
_PULL_STATUS: dict[int, PullStatus] = {
    R.SUCCESS: PullStatus.FOUND, R.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    R.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG, R.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL}


def _text(value: object) -> str:
    if value is True or value is False:
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


def command(code: int, fields: Mapping[str, object] | None = None, body: bytes | None = None) -> RemotingCommand:
    """A request; None-valued fields are left out (fastjson drops nulls)."""
    ext = None if fields is None else {k: _text(v) for k, v in fields.items() if v is not None}
    return RemotingCommand(code, ext_fields=ext, body=body)


def check(resp: RemotingCommand, addr: str, what: str, ok: Iterable[int] = (R.SUCCESS,)) -> RemotingCommand:
    if resp.code not in ok:
        raise BrokerError(resp.code, resp.remark, addr, what)
    return resp


def json_body(resp: RemotingCommand, addr: str, what: str) -> object:
    try:
        return fastjson.loads(resp.body_bytes())
    except ValueError as exc:
        raise BrokerError(R.SYSTEM_ERROR, f"undecodable JSON body: {exc}", addr, what) from None


# -- send ------------------------------------------------------------------------------------------

def send_fields(group: str, topic: str, queue_id: int, sys_flag: int, born_timestamp: int, flag: int,
                properties: str, *, reconsume_times: int = 0, max_reconsume_times: int | None = None,
                batch: bool = False, default_topic: str = DEFAULT_TOPIC,
                default_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS) -> dict[str, str]:
    """SendMessageRequestHeaderV2 (the one-letter names of SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE).
    Java always writes j (reconsumeTimes), k (unitMode) and m (batch)."""
    fields = {"a": group, "b": topic, "c": default_topic, "d": str(default_queue_nums), "e": str(queue_id),
              "f": str(sys_flag), "g": str(born_timestamp), "h": str(flag), "i": properties,
              "j": str(reconsume_times), "k": "false", "m": "true" if batch else "false"}
    if max_reconsume_times is not None:
        fields["l"] = str(max_reconsume_times)
    return fields


#: SendMessageRequestHeaderV2 letter -> SendMessageRequestHeader field (for SEND_MESSAGE 10).
V2_TO_V1 = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
            "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
            "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch"}


def send_request(fields: dict[str, str], body: bytes, batch: bool = False, v1: bool = False,
                 reply: bool = False) -> RemotingCommand:
    """SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE; SEND_REPLY_MESSAGE_V2 for a reply (MSG_TYPE "reply");
    v1: SEND_MESSAGE or SEND_REPLY_MESSAGE with the long field names."""
    if v1:
        return RemotingCommand(RC.SEND_REPLY_MESSAGE if reply else RC.SEND_MESSAGE,
                               ext_fields={V2_TO_V1[k]: v for k, v in fields.items()}, body=body)
    code = RC.SEND_BATCH_MESSAGE if batch else RC.SEND_REPLY_MESSAGE_V2 if reply else RC.SEND_MESSAGE_V2
    return RemotingCommand(code, ext_fields=fields, body=body)


def decode_send(resp: RemotingCommand, mq: MessageQueue, uniq_id: str, addr: str) -> SendResult:
    """SEND_OK and the three "stored, but" statuses; anything else raises BrokerError."""
    status = _SEND_STATUS.get(resp.code)
    if status is None:
        raise BrokerError(resp.code, resp.remark, addr, "send")
    ext = resp.ext_fields or {}
    try:
        queue_id = int(ext["queueId"])
        queue_offset = int(ext["queueOffset"])
    except (KeyError, ValueError):
        raise BrokerError(R.SYSTEM_ERROR, f"send response lacks queueId/queueOffset: {ext}", addr, "send") from None
    return SendResult(status, uniq_id, ext.get("msgId", ""), MessageQueue(mq.topic, mq.broker_name, queue_id),
                      queue_offset, ext.get("transactionId"), ext.get(Prop.MSG_REGION, "DefaultRegion"),
                      ext.get(Prop.TRACE_ON, "true") != "false")


def decode_reply(cmd: RemotingCommand, arrive_ms: int) -> MessageExt:
    """PUSH_REPLY_MESSAGE_TO_CLIENT as the reply message (ClientRemotingProcessor
    .receiveReplyMessage): ReplyMessageRequestHeader and the body, inflated, ARRIVE_TIME added.
    ValueError when a number does not parse."""
    ext = cmd.ext_fields or {}
    props = decode_properties(ext.get("properties") or "")
    props[Prop.ARRIVE_TIME] = str(arrive_ms)
    msg = MessageExt(ext.get("topic", ""), int(ext.get("queueId") or 0), 0, 0, int(ext.get("sysFlag") or 0),
                     int(ext.get("flag") or 0), int(ext.get("bornTimestamp") or 0),
                     _socket_address(ext.get("bornHost")), int(ext.get("storeTimestamp") or 0),
                     _socket_address(ext.get("storeHost")), int(ext.get("reconsumeTimes") or 0), 0,
                     cmd.body_bytes(), props)
    inflate_body(msg)
    return msg


def _socket_address(text: str | None) -> tuple[str, int]:
    """Java's InetSocketAddress.toString() ("/10.0.0.1:10911", "host/10.0.0.1:10911") or
    "host:port" -> (host, port)."""
    host, _, port = (text or "").rpartition(":")
    return host.rpartition("/")[2], int(port or 0)


# -- pull and offsets ------------------------------------------------------------------------------

def pull_request(group: str, topic: str, queue_id: int, queue_offset: int, max_nums: int, sys_flag: int,
                 commit_offset: int, suspend_timeout_ms: int, subscription: str, sub_version: int,
                 expression_type: str = "TAG") -> RemotingCommand:
    return command(RC.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": queue_offset,
        "maxMsgNums": max_nums, "sysFlag": sys_flag, "commitOffset": commit_offset,
        "suspendTimeoutMillis": suspend_timeout_ms, "subscription": subscription, "subVersion": sub_version,
        "expressionType": expression_type})


def decode_pull(resp: RemotingCommand, addr: str) -> tuple[PullStatus, int, int, int, int]:
    """(status, nextBeginOffset, minOffset, maxOffset, suggestWhichBrokerId)."""
    status = _PULL_STATUS.get(resp.code)
    if status is None:
        raise BrokerError(resp.code, resp.remark, addr, "pull")
    ext = resp.ext_fields or {}
    try:
        return (status, int(ext["nextBeginOffset"]), int(ext["minOffset"]), int(ext["maxOffset"]),
                int(ext.get("suggestWhichBrokerId", 0)))
    except (KeyError, ValueError):
        raise BrokerError(R.SYSTEM_ERROR, f"pull response lacks offsets: {ext}", addr, "pull") from None


def query_consumer_offset_request(group: str, topic: str, queue_id: int) -> RemotingCommand:
    return command(RC.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": queue_id})


def update_consumer_offset_request(group: str, topic: str, queue_id: int, offset: int) -> RemotingCommand:
    return command(RC.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": queue_id,
                                               "commitOffset": offset})


def offset_request(code: int, topic: str, queue_id: int, timestamp: int | None = None) -> RemotingCommand:
    """GET_MAX_OFFSET, GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME, SEARCH_OFFSET_BY_TIMESTAMP."""
    return command(code, {"topic": topic, "queueId": queue_id, "timestamp": timestamp})


def ext_long(resp: RemotingCommand, name: str, addr: str, what: str) -> int:
    check(resp, addr, what)
    try:
        return int((resp.ext_fields or {})[name])
    except (KeyError, ValueError):
        raise BrokerError(R.SYSTEM_ERROR, f"response lacks {name}", addr, what) from None


# -- consumers: membership, locks, send-back -------------------------------------------------------

def heartbeat_request(client_id: str, producers: Iterable[str], consumers: Iterable[dict]) -> RemotingCommand:
    """HeartbeatData JSON: clientID, consumerDataSet, producerDataSet."""
    body = {"clientID": client_id, "consumerDataSet": list(consumers),
            "producerDataSet": [{"groupName": g} for g in producers]}
    return RemotingCommand(RC.HEART_BEAT, body=fastjson.dumps(body))


def consumer_data(group: str, consume_type: str, model: str, consume_from: str,
                  subscriptions: Iterable[dict]) -> dict:
    return {"consumeFromWhere": consume_from, "consumeType": consume_type, "groupName": group,
            "messageModel": model, "subscriptionDataSet": list(subscriptions), "unitMode": False}


def check_client_config_request(client_id: str, group: str, subscription: dict) -> RemotingCommand:
    """CheckClientRequestBody: can the broker filter by this subscription (SQL92)?"""
    body = {"clientId": client_id, "group": group, "subscriptionData": subscription}
    return RemotingCommand(RC.CHECK_CLIENT_CONFIG, body=fastjson.dumps(body))


def unregister_client_request(client_id: str, producer_group: str | None,
                              consumer_group: str | None) -> RemotingCommand:
    return command(RC.UNREGISTER_CLIENT, {"clientID": client_id, "producerGroup": producer_group,
                                          "consumerGroup": consumer_group})


def consumer_list_request(group: str) -> RemotingCommand:
    return command(RC.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})


def decode_consumer_list(resp: RemotingCommand, addr: str) -> list[str]:
    check(resp, addr, "get consumer list")
    body = json_body(resp, addr, "get consumer list")
    ids = body.get("consumerIdList") if isinstance(body, dict) else None
    if not isinstance(ids, list):
        raise BrokerError(R.SYSTEM_ERROR, "consumer list body has no consumerIdList", addr, "get consumer list")
    return [str(i) for i in ids]


def lock_body(client_id: str, group: str, mqs: Iterable[MessageQueue]) -> bytes:
    """LockBatchRequestBody / UnlockBatchRequestBody."""
    return fastjson.dumps({"clientId": client_id, "consumerGroup": group, "mqSet": [mq.to_json() for mq in mqs]})


def decode_locked(resp: RemotingCommand, addr: str) -> set[MessageQueue]:
    check(resp, addr, "lock queues")
    body = json_body(resp, addr, "lock queues")
    try:
        found = body.get("lockOKMQSet")  # type: ignore[attr-defined]  # a non-dict raises, caught below
        return {MessageQueue.from_json(m) for m in (found or [])}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise BrokerError(R.SYSTEM_ERROR, "malformed lockOKMQSet", addr, "lock queues") from None


def send_back_request(commit_log_offset: int, group: str, delay_level: int, origin_msg_id: str,
                      origin_topic: str, max_reconsume_times: int) -> RemotingCommand:
    """ConsumerSendMsgBackRequestHeader: offset is the message's commit-log (physical) offset."""
    return command(RC.CONSUMER_SEND_MSG_BACK, {
        "offset": commit_log_offset, "group": group, "delayLevel": delay_level, "originMsgId": origin_msg_id,
        "originTopic": origin_topic, "unitMode": False, "maxReconsumeTimes": max_reconsume_times})


# -- queries ---------------------------------------------------------------------------------------

def query_message_request(topic: str, key: str, max_num: int, begin: int, end: int,
                          unique: bool = False) -> RemotingCommand:
    cmd = command(RC.QUERY_MESSAGE, {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin,
                                     "endTimestamp": end})
    cmd.ext_fields["_UNIQUE_KEY_QUERY"] = "true" if unique else "false"  # type: ignore[index]  # command() made it
    return cmd


def view_message_request(commit_log_offset: int) -> RemotingCommand:
    return command(RC.VIEW_MESSAGE_BY_ID, {"offset": commit_log_offset})


# -- registry --------------------------------------------------------------------------------------

def route_request(topic: str) -> RemotingCommand:
    return command(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": True})


# -- admin -----------------------------------------------------------------------------------------

def create_topic_request(topic: str, read_queue_nums: int, write_queue_nums: int, perm: int, order: bool = False,
                         topic_sys_flag: int = 0, default_topic: str = DEFAULT_TOPIC) -> RemotingCommand:
    return command(RC.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": default_topic, "readQueueNums": read_queue_nums,
        "writeQueueNums": write_queue_nums, "perm": perm, "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": topic_sys_flag, "order": order})


def topic_request(code: int, topic: str) -> RemotingCommand:
    """DELETE_TOPIC_IN_BROKER, DELETE_TOPIC_IN_NAMESRV, GET_TOPIC_STATS_INFO."""
    return command(code, {"topic": topic})


def consume_stats_request(group: str, topic: str | None = None) -> RemotingCommand:
    return command(RC.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic})


def reset_offset_request(group: str, topic: str, timestamp_ms: int, force: bool) -> RemotingCommand:
    """INVOKE_BROKER_TO_RESET_OFFSET (ResetOffsetRequestHeader); timestamp -1: the queue ends."""
    return command(RC.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": topic, "group": group, "timestamp": timestamp_ms,
                                                      "isForce": force})


def consumer_connection_request(group: str) -> RemotingCommand:
    return command(RC.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})


def running_info_request(group: str, client_id: str, jstack: bool) -> RemotingCommand:
    """GET_CONSUMER_RUNNING_INFO (GetConsumerRunningInfoRequestHeader)."""
    return command(RC.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": group, "clientId": client_id,
                                                  "jstackEnable": jstack})


def consume_directly_request(group: str, client_id: str, offset_msg_id: str, topic: str) -> RemotingCommand:
    """CONSUME_MESSAGE_DIRECTLY (ConsumeMessageDirectlyResultRequestHeader; the broker adds brokerName)."""
    return command(RC.CONSUME_MESSAGE_DIRECTLY, {"consumerGroup": group, "clientId": client_id,
                                                 "msgId": offset_msg_id, "topic": topic})


def subscription_group_body(group: str, *, consume_enable: bool = True, broadcast_enable: bool = True,
                            retry_queue_nums: int = 1, retry_max_times: int = 16, broker_id: int = 0,
                            which_broker_when_consume_slowly: int = 1, notify_consumer_ids_changed: bool = True,
                            consume_from_min_enable: bool = True) -> bytes:
    """SubscriptionGroupConfig as fastjson writes it (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP body)."""
    return fastjson.dumps({"brokerId": broker_id, "consumeBroadcastEnable": broadcast_enable,
                           "consumeEnable": consume_enable, "consumeFromMinEnable": consume_from_min_enable,
                           "groupName": group, "notifyConsumerIdsChangedEnable": notify_consumer_ids_changed,
                           "retryMaxTimes": retry_max_times, "retryQueueNums": retry_queue_nums,
                           "whichBrokerWhenConsumeSlowly": which_broker_when_consume_slowly})


def decode_messages(body: bytes, addr: str, what: str) -> list[MessageExt]:
    """Store records as messages, compressed bodies inflated; BrokerError if they do not decode."""
    try:
        msgs = list(iter_records(body))
    except CorruptRecordError as exc:
        raise BrokerError(R.SYSTEM_ERROR, f"body does not decode: {exc}", addr, what) from None
    for msg in msgs:
        inflate_body(msg)
    return msgs
