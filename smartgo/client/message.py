"""The SDK's value types: Message (what a producer sends), MessageQueue, SendResult, PullResult and
the enums of the consumer side. Received messages are smartgo.store.record.MessageExt: the client
decodes pull bodies with the store's own record codec."""

from __future__ import annotations

import enum
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from smartgo.client.errors import MessageError
from smartgo.store.record import COMPRESSED_FLAG, MessageExt

__all__ = ["Message", "MessageExt", "MessageQueue", "SendStatus", "SendResult", "PullStatus",
           "PullResult", "ConsumeResult", "MessageModel", "ConsumeFromWhere", "Prop", "create_reply_message",
           "reply_topic"]


class Prop:
    """Well-known property names (MessageConst)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT = "WAIT"
    DELAY = "DELAY"
    UNIQ_KEY = "UNIQ_KEY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIME = "CONSUME_START_TIME"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    TRAN_MSG = "TRAN_MSG"
    PGROUP = "PGROUP"
    CORRELATION_ID = "CORRELATION_ID"
    REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
    TTL = "TTL"
    MSG_TYPE = "MSG_TYPE"
    CLUSTER = "CLUSTER"
    ARRIVE_TIME = "ARRIVE_TIME"
    PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
    MSG_REGION = "MSG_REGION"
    TRACE_ON = "TRACE_ON"
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
    TIMER_DELAY_MS = "TIMER_DELAY_MS"


#: Properties the SDK manages itself; user properties may not use these names.
RESERVED_PROPERTIES = frozenset({Prop.KEYS, Prop.TAGS, Prop.WAIT, Prop.DELAY, Prop.UNIQ_KEY,
                                 Prop.RETRY_TOPIC, Prop.REAL_TOPIC, Prop.REAL_QID, Prop.TRAN_MSG, Prop.PGROUP,
                                 Prop.MIN_OFFSET, Prop.MAX_OFFSET, Prop.RECONSUME_TIME,
                                 Prop.MAX_RECONSUME_TIMES, Prop.ORIGIN_MESSAGE_ID, Prop.TIMER_DELIVER_MS,
                                 Prop.TIMER_DELAY_MS})

_TOPIC_RE = re.compile(r"[%|a-zA-Z0-9_-]{1,127}")
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
#: Bodies at least this large are zlib-compressed (Java compressMsgBodyOverHowmuch).
COMPRESS_OVER = 4096
#: Java's Deflater level for message bodies (compressLevel default 5).
COMPRESS_LEVEL = 5
#: MSG_TYPE of a reply (MixAll.REPLY_MESSAGE_FLAG): the producer sends it as SEND_REPLY_MESSAGE.
REPLY_MESSAGE_FLAG = "reply"


def check_topic(topic: str) -> None:
    if not isinstance(topic, str) or not _TOPIC_RE.fullmatch(topic):
        raise MessageError(f"topic {topic!r} is invalid: 1..127 characters of [%|a-zA-Z0-9_-]")


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker; ordered like Java's MessageQueue.compareTo."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:  # Java's toString: the consistent-hash key
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"

    def to_json(self) -> dict:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}

    @classmethod
    def from_json(cls, obj: Mapping) -> MessageQueue:
        return cls(str(obj["topic"]), str(obj["brokerName"]), int(obj["queueId"]))


@dataclass(slots=True)
class Message:
    """A message to send. `keys` are business keys the broker indexes (query by key); `tags`
    is the one tag consumers filter on; `properties` are free user properties."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | Iterable[str] | None = None
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    #: 1..18: delivered after the broker's delay level (1s 5s 10s 30s 1m ...); 0 = at once.
    delay_level: int = 0
    #: A timer message (RocketMQ 5.x's setDeliverTimeMs): delivered at this time, in ms since the
    #: epoch by the broker's clock, up to its timer_max_delay_sec ahead (3 days), within its
    #: timer_precision_ms after (1 s), never before; 0 = no timer. A time past is delivered at once.
    deliver_time_ms: int = 0
    #: A timer message due this many ms after the broker stores it (5.x's setDelayTimeMs); 0 = none.
    delay_time_ms: int = 0
    #: WAIT property: the broker answers only when the message is as durable as configured.
    wait_store_ok: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.body, str):
            self.body = self.body.encode("utf-8")

    def wire_properties(self) -> dict[str, str]:
        """Every property as the broker stores it (user properties plus the managed ones)."""
        props = dict(self.properties)
        for name in props:
            if name in RESERVED_PROPERTIES:
                raise MessageError(f"property name {name!r} is reserved; use the Message field instead")
        if self.tags:
            props[Prop.TAGS] = self.tags
        if self.keys:
            props[Prop.KEYS] = self.keys_text  # type: ignore[assignment]  # not None: keys is set
        if self.delay_level:
            props[Prop.DELAY] = str(self.delay_level)
        if self.deliver_time_ms:
            props[Prop.TIMER_DELIVER_MS] = str(self.deliver_time_ms)
        if self.delay_time_ms:
            props[Prop.TIMER_DELAY_MS] = str(self.delay_time_ms)
        props[Prop.WAIT] = "true" if self.wait_store_ok else "false"
        return props

    @property
    def keys_text(self) -> str | None:
        """The KEYS property: the keys space-separated, None when there are none."""
        if not self.keys:
            return None
        return self.keys if isinstance(self.keys, str) else " ".join(self.keys)

    def validate(self, max_size: int = MAX_MESSAGE_SIZE) -> None:
        check_topic(self.topic)
        if not isinstance(self.body, (bytes, bytearray, memoryview)):
            raise MessageError(f"message body must be bytes, got {type(self.body).__name__}")
        if len(self.body) == 0:
            raise MessageError("message body is empty")
        if len(self.body) > max_size:
            raise MessageError(f"message body is {len(self.body)} bytes, over the {max_size}-byte limit")
        if not 0 <= self.delay_level <= 18:
            raise MessageError(f"delay_level {self.delay_level} is outside 0..18")
        if self.deliver_time_ms < 0 or self.delay_time_ms < 0:
            raise MessageError("deliver_time_ms and delay_time_ms cannot be negative")
        if sum(map(bool, (self.delay_level, self.deliver_time_ms, self.delay_time_ms))) > 1:
            raise MessageError("a message takes one of delay_level, deliver_time_ms and delay_time_ms")


class SendStatus(enum.Enum):
    """What a successful send achieved; anything worse than SEND_OK still stored the message."""

    SEND_OK = 0
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12


@dataclass(slots=True)
class SendResult:
    status: SendStatus
    #: The client's UNIQ_KEY (comma-joined for a batch): stable across retries, indexed by the broker.
    msg_id: str
    #: The broker's id: store address + commit-log offset (comma-joined for a batch).
    offset_msg_id: str
    queue: MessageQueue
    #: Offset in the queue (the first one for a batch).
    queue_offset: int
    transaction_id: str | None = None
    region_id: str = "DefaultRegion"
    trace_on: bool = True

    def to_json(self) -> dict:
        return {"status": self.status.name, "msg_id": self.msg_id, "offset_msg_id": self.offset_msg_id,
                "topic": self.queue.topic, "broker_name": self.queue.broker_name,
                "queue_id": self.queue.queue_id, "queue_offset": self.queue_offset}


class PullStatus(enum.Enum):
    FOUND = 0
    NO_NEW_MSG = 19
    NO_MATCHED_MSG = 20
    OFFSET_ILLEGAL = 21


@dataclass(slots=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = 0


class ConsumeResult(enum.Enum):
    """A listener's verdict. An exception or None from a listener count as RECONSUME_LATER and
    SUCCESS respectively."""

    SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class MessageModel(str, enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(str, enum.Enum):
    """Where a consumer group with no stored offset starts (existing groups resume)."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


def reply_topic(cluster: str) -> str:
    """Where replies go (MixAll.getReplyTopic): every broker of the cluster has it."""
    return f"{cluster}_REPLY_TOPIC"


def create_reply_message(request: MessageExt, body: bytes) -> Message:
    """The reply to a received request message (MessageUtil.createReplyMessage): to its
    cluster's reply topic, with its CORRELATION_ID, REPLY_TO_CLIENT and TTL; send it with any
    producer, which uses SEND_REPLY_MESSAGE for it."""
    props = request.properties
    cluster = props.get(Prop.CLUSTER)
    if not cluster:
        raise MessageError(f"create reply message fail, requestMessage error, property[{Prop.CLUSTER}] is null "
                           "(only a message received from a broker can be replied to)")
    wanted = {Prop.MSG_TYPE: REPLY_MESSAGE_FLAG, Prop.CORRELATION_ID: props.get(Prop.CORRELATION_ID),
              Prop.REPLY_TO_CLIENT: props.get(Prop.REPLY_TO_CLIENT), Prop.TTL: props.get(Prop.TTL)}
    return Message(reply_topic(cluster), body, properties={k: v for k, v in wanted.items() if v is not None})


def compress_body(body: bytes) -> bytes:
    return zlib.compress(body, COMPRESS_LEVEL)


def inflate_body(msg: MessageExt) -> None:
    """Undo the producer's compression in place (sysFlag bit 0; bits 8-10 name the codec, where 0
    and 3 are zlib; LZ4/ZSTD bodies stay compressed and keep the flag)."""
    if msg.sys_flag & COMPRESSED_FLAG and (msg.sys_flag >> 8) & 0x7 in (0, 3):
        msg.body = zlib.decompress(msg.body)
        msg.sys_flag &= ~COMPRESSED_FLAG


def message_to_json(msg: MessageExt, body_limit: int | None = None) -> dict:
    """A received message as a JSON-ready dict (the CLI's output)."""
    body = msg.body if body_limit is None else msg.body[:body_limit]
    try:
        text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = body.hex(), "hex"
    return {"topic": msg.topic, "queue_id": msg.queue_id, "queue_offset": msg.queue_offset,
            "msg_id": msg.properties.get(Prop.UNIQ_KEY) or msg.msg_id, "offset_msg_id": msg.msg_id,
            "tags": msg.tags, "keys": msg.keys, "born_timestamp": msg.born_timestamp,
            "store_timestamp": msg.store_timestamp, "born_host": "%s:%d" % msg.born_host,
            "store_host": "%s:%d" % msg.store_host, "reconsume_times": msg.reconsume_times,
            "commit_log_offset": msg.commit_log_offset, "body_size": len(msg.body),
            "properties": msg.properties, "body": text, "body_encoding": encoding}
