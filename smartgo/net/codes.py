"""RocketMQ 4.x remoting constants (reference sections A.4-A.6, B, C), plus SmartGo's own extensions.

Everything here is a wire value: changing a number breaks compatibility with Java/Go/Node peers.
SmartGo's additions (the MSGPACK serialize type and the two negotiation flag bits) are only ever
put on a connection whose peer announced itself as SmartGo (see smartgo.net.connection).
"""

from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    """Request codes (common/protocol/RequestCode.java)."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_CONFIG_LIST = 22
    GET_TOPIC_NAME_LIST = 23
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    UPDATE_AND_CREATE_ACL_CONFIG = 50
    DELETE_ACL_CONFIG = 51
    GET_BROKER_CLUSTER_ACL_INFO = 52
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG = 53
    GET_BROKER_CLUSTER_ACL_CONFIG = 54
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KVLIST_BY_NAMESPACE = 219
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS = 223
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    QUERY_CONSUME_TIME_SPAN = 303
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER = 305
    CLEAN_EXPIRED_CONSUMEQUEUE = 306
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    CLONE_GROUP_OFFSET = 314
    VIEW_BROKER_STATS_DATA = 315
    GET_BROKER_CONSUME_STATS = 317
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319
    SEND_BATCH_MESSAGE = 320
    QUERY_CONSUME_QUEUE = 321
    QUERY_DATA_VERSION = 322
    RESUME_CHECK_HALF_MESSAGE = 323
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326
    ADD_WRITE_PERM_OF_BROKER = 327
    DELETE_EXPIRED_COMMITLOG = 329          # 5.x
    # 5.x controller mode: an operator asks the failover registry to hand a broker name's master
    # role to one of its slaves; the registry tells the brokers with NOTIFY_BROKER_ROLE_CHANGED
    CONTROLLER_ELECT_MASTER = 1002
    NOTIFY_BROKER_ROLE_CHANGED = 1008
    # SmartGo's own requests: 40000 and up, a range no RocketMQ version uses
    MQTT_ADMIN = 40001                      # the node's MQTT clients, sessions, subscriptions; kick one


class ResponseCode(IntEnum):
    """Response codes (RemotingSysResponseCode.java + common/protocol/ResponseCode.java)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    UPDATE_AND_CREATE_ACL_CONFIG_FAILED = 209
    DELETE_ACL_CONFIG_FAILED = 210
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED = 211
    FLOW_CONTROL = 215


class LanguageCode(IntEnum):
    """Sender language; JSON headers carry the name, ROCKETMQ binary headers the number."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(IntEnum):
    """High byte of the header-length word. JSON and ROCKETMQ are RocketMQ's; MSGPACK is SmartGo's own."""

    JSON = 0
    ROCKETMQ = 1
    MSGPACK = 2


class MQVersion(IntEnum):
    """MQVersion.Version ordinals that change behaviour on the other side (reference A.6)."""

    V3_0_7_SNAPSHOT = 28
    V3_0_11 = 37
    V3_1_8_SNAPSHOT = 62
    V3_4_9 = 121
    V4_1_0_SNAPSHOT = 232
    V4_5_2 = 317
    V4_9_4 = 401
    V4_9_8 = 409


#: The version SmartGo puts in every command it sends (RocketMQ 4.9.8's CURRENT_VERSION).
CURRENT_VERSION = MQVersion.V4_9_8

# RemotingCommand.flag bits. RocketMQ defines bit 0 and bit 1 only.
FLAG_RESPONSE = 1 << 0
FLAG_ONEWAY = 1 << 1
#: SmartGo: the body is a zlib stream. The seed puts compression on "the second bit", which is
#: RocketMQ's oneway bit, so SmartGo uses bit 2; it is set only towards a peer that sent FLAG_SMARTGO.
FLAG_COMPRESSED = 1 << 2
#: SmartGo: "I am SmartGo and understand FLAG_COMPRESSED and SerializeType.MSGPACK".
FLAG_SMARTGO = 1 << 3


class PullSysFlag:
    """PULL_MESSAGE sysFlag bits (common/sysflag/PullSysFlag.java)."""

    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL_MESSAGE = 0x10


class PermName:
    """Topic permission bits (common/constant/PermName.java)."""

    PRIORITY = 8
    READ = 4
    WRITE = 2
    INHERIT = 1


#: brokerId of a master (MixAll.MASTER_ID).
MASTER_ID = 0

#: "No offset" in automatic failover's registration fields (epochStart, truncateOffset) and role file.
NO_OFFSET = -1

#: A consumer group's retry and dead-letter topics (MixAll.RETRY_GROUP_TOPIC_PREFIX,
#: DLQ_GROUP_TOPIC_PREFIX), named alike by brokers, clients and the ACL.
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
#: Where a broker copies the transaction half messages its check-back gave up on
#: (TopicValidator.RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC), which admin tools browse.
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
#: Where clients with message trace on send their traces (TopicValidator.RMQ_SYS_TRACE_TOPIC; the default
#: msgTraceTopicName); the ACL lets any account send to it.
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
#: The registries' KV namespace of ordered topics (NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG).
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def code_name(code: int) -> str:
    """A response code's name for a message or a log line ("code N" for one we do not know)."""
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"code {code}"
