"""Message trace (RocketMQ 4.4+'s `enableMsgTrace`): who sent a message, who consumed it, when,
how long it took and how it ended, kept as ordinary messages in a trace topic.

A traced producer or push consumer hands one TraceRecord per event to its TraceDispatcher, which
batches them and sends them, through a producer of its own (group _INNER_TRACE_PRODUCER), to
RMQ_SYS_TRACE_TOPIC (or a topic of the user's). Each trace message carries the traced message
ids as its keys, so the broker's index finds a message's trace by its id.

The text is Java's TraceDataEncoder format exactly: a record's fields joined by \\x01 and ended
by \\x02, Java's `String.valueOf(null)` ("null") for a missing tag or key. So mqadmin
queryMsgTraceById and RocketMQ Dashboard read what a Python client writes, and `smartgo admin
trace` (AsyncAdmin.message_trace) reads what a Java client writes.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from smartgo.client.config import ClientConfig
from smartgo.client.listener import BatchListener, Listener, is_coroutine_listener
from smartgo.client.message import Message, Prop, SendResult, SendStatus
from smartgo.client.uniq_id import uniq_ids
from smartgo.net.codes import TRACE_TOPIC
from smartgo.store.record import MessageExt

if TYPE_CHECKING:
    from smartgo.client.producer import AsyncProducer  # the producer module imports this one

log = logging.getLogger(__name__)
T = TypeVar("T")

TRACE_GROUP = "_INNER_TRACE_PRODUCER"           # TraceConstants.GROUP_NAME_PREFIX
TRACE_INSTANCE = "PID_CLIENT_INNER_TRACE_PRODUCER"
DEFAULT_REGION = "DefaultRegion"                # MixAll.DEFAULT_TRACE_REGION_ID
CONTENT = "\x01"                                # TraceConstants.CONTENT_SPLITOR
FIELD = "\x02"                                  # TraceConstants.FIELD_SPLITOR
#: A trace message's body stays under this many characters (AsyncTraceDispatcher: 128000 - 10000).
MAX_TRACE_BODY = 118_000
#: ... and its keys under this many characters (a message's properties stay under 32767 bytes).
MAX_TRACE_KEYS = 16_000
#: Records waiting to be sent; beyond this they are dropped and counted. Java's queue holds 1024
#: contexts, which a consumer taking 75,000 messages a second (two records each) fills in 7 ms.
QUEUE_CAPACITY = 16384
#: After the first record of a batch arrives, wait this long for more, unless BATCH_SIZE are
#: already waiting. Java sends every 5 ms or 100 records; fewer, larger trace messages cost a traced
#: sync send 8 µs of CPU instead of 14 (docs/BENCHMARKS.md, "Message trace").
BATCH_WAIT = 0.02
BATCH_SIZE = 1000
#: Trace messages being sent at once; beyond this, records wait (and then drop) rather than pile up
#: as sends towards a slow broker.
MAX_IN_FLIGHT = 64


class TraceType(str, enum.Enum):
    PUB = "Pub"
    SUB_BEFORE = "SubBefore"
    SUB_AFTER = "SubAfter"
    END_TRANSACTION = "EndTransaction"


class MessageType(enum.IntEnum):
    """common/message/MessageType, written as its ordinal."""
    NORMAL = 0          # Normal_Msg
    TRANS_HALF = 1      # Trans_Msg_Half
    TRANS_COMMIT = 2    # Trans_msg_Commit
    DELAY = 3           # Delay_Msg


class ConsumeReturnType(enum.IntEnum):
    """The SubAfter record's context code: how the listener call ended (ConsumeReturnType)."""
    SUCCESS = 0
    TIME_OUT = 1
    EXCEPTION = 2
    RETURNNULL = 3
    FAILED = 4


@dataclass(slots=True)
class TraceRecord:
    """One TraceContext with its one TraceBean (the SDK consumes one message per listener call,
    and sends each message of a batch its own Pub record)."""

    type: TraceType
    timestamp: int = 0              # ms; SubAfter: when consumption ended
    region_id: str = DEFAULT_REGION
    group: str = ""
    request_id: str = ""            # pairs a SubBefore with its SubAfter
    topic: str = ""
    msg_id: str = ""                # UNIQ_KEY where the message has one, else the offsetMsgId
    tags: str | None = None
    keys: str | None = None
    store_host: str = ""
    body_length: int = 0
    cost_ms: int = 0
    msg_type: int = MessageType.NORMAL
    offset_msg_id: str = ""
    success: bool = True
    retry_times: int = 0
    context_code: int = ConsumeReturnType.SUCCESS
    transaction_id: str | None = None
    transaction_state: str = ""
    from_check: bool = False
    client_host: str = ""           # read back: the host that sent the trace message


def trace_to_json(rec: TraceRecord) -> dict:
    return {f.name: (getattr(rec, f.name).value if f.name == "type" else getattr(rec, f.name))
            for f in dataclasses.fields(rec)}


def consume_end(code: int) -> str:
    """A SubAfter's context code by name (a newer client's unknown code as its number)."""
    try:
        return ConsumeReturnType(code).name
    except ValueError:
        return str(code)


def _n(value: str | None) -> str:
    """Java's String.valueOf for a string that may be null: "null", never an empty last field
    (Java's split drops trailing empty fields, and its decoder then fails on the record)."""
    return "null" if value is None else value


def _b(value: bool) -> str:
    return "true" if value else "false"


def encode(rec: TraceRecord) -> str:
    """TraceDataEncoder.encoderFromContextBean for one record (an f-string per type: the consumer
    writes two records per message)."""
    t = rec.type
    if t is TraceType.SUB_AFTER:
        return (f"SubAfter\x01{rec.request_id}\x01{rec.msg_id}\x01{rec.cost_ms}\x01{_b(rec.success)}\x01"
                f"{_n(rec.keys)}\x01{int(rec.context_code)}\x01{rec.timestamp}\x02")
    if t is TraceType.SUB_BEFORE:
        return (f"SubBefore\x01{rec.timestamp}\x01{rec.region_id}\x01{rec.group}\x01{rec.request_id}\x01"
                f"{rec.msg_id}\x01{rec.retry_times}\x01{_n(rec.keys)}\x02")
    head = (f"{t.value}\x01{rec.timestamp}\x01{rec.region_id}\x01{rec.group}\x01{rec.topic}\x01{rec.msg_id}\x01"
            f"{_n(rec.tags)}\x01{_n(rec.keys)}\x01{rec.store_host}\x01")
    if t is TraceType.PUB:
        return (f"{head}{rec.body_length}\x01{rec.cost_ms}\x01{int(rec.msg_type)}\x01{rec.offset_msg_id}\x01"
                f"{_b(rec.success)}\x02")
    return (f"{head}{int(rec.msg_type)}\x01{_n(rec.transaction_id)}\x01{rec.transaction_state}\x01"
            f"{_b(rec.from_check)}\x02")


def index_keys(rec: TraceRecord) -> list[str]:
    """What the trace message is indexed by for this record (TraceTransferBean.transKey)."""
    return [rec.msg_id] + ([rec.keys] if rec.keys else [])


def _java_split(text: str, sep: str) -> list[str]:
    """String.split: trailing empty strings are dropped."""
    parts = text.split(sep)
    while parts and not parts[-1]:
        parts.pop()
    return parts


def _opt(text: str) -> str | None:
    """A tag, key or transaction id field: Java's "null" is None."""
    return None if text == "null" else text


def _bool(text: str) -> bool:
    return text.lower() == "true"          # Boolean.parseBoolean


def _decode_one(f: list[str]) -> TraceRecord | None:
    kind = f[0]
    if kind == TraceType.PUB.value:
        rec = TraceRecord(TraceType.PUB, int(f[1]), f[2], f[3], topic=f[4], msg_id=f[5], tags=_opt(f[6]),
                          keys=_opt(f[7]),
                          store_host=f[8], body_length=int(f[9]), cost_ms=int(f[10]), msg_type=int(f[11]))
        if len(f) == 13:
            rec.success = _bool(f[12])
        elif len(f) >= 14:
            rec.offset_msg_id, rec.success = f[12], _bool(f[13])
            rec.client_host = f[14] if len(f) >= 15 else ""
        return rec
    if kind == TraceType.SUB_BEFORE.value:
        return TraceRecord(TraceType.SUB_BEFORE, int(f[1]), f[2], f[3], request_id=f[4], msg_id=f[5],
                           retry_times=int(f[6]), keys=_opt(f[7]))
    if kind == TraceType.SUB_AFTER.value:
        return TraceRecord(TraceType.SUB_AFTER, int(f[7]) if len(f) >= 8 else 0, request_id=f[1], msg_id=f[2],
                           cost_ms=int(f[3]), success=_bool(f[4]), keys=_opt(f[5]),
                           context_code=int(f[6]) if len(f) >= 7 else 0)
    if kind == TraceType.END_TRANSACTION.value:
        return TraceRecord(TraceType.END_TRANSACTION, int(f[1]), f[2], f[3], topic=f[4], msg_id=f[5], tags=_opt(f[6]),
                           keys=_opt(f[7]), store_host=f[8], msg_type=int(f[9]), transaction_id=_opt(f[10]),
                           transaction_state=f[11], from_check=_bool(f[12]))
    return None


def decode(text: str) -> tuple[list[TraceRecord], int]:
    """TraceDataEncoder.decoderFromTraceDataString: the records, and how many did not parse
    (skipped; Java's decoder would throw on the first and lose the rest)."""
    records, bad = [], 0
    for raw in _java_split(text, FIELD):
        try:
            rec = _decode_one(_java_split(raw, CONTENT))
        except (ValueError, IndexError):
            rec = None
        if rec is None:
            bad += 1
        else:
            records.append(rec)
    return records, bad


def pack(records: Sequence[TraceRecord], limit: int = MAX_TRACE_BODY,
         keys_limit: int = MAX_TRACE_KEYS) -> list[tuple[str, list[str]]]:
    """Trace message bodies with their keys: records of one traced topic share a message until its
    body reaches `limit` characters (AsyncAppenderRequest.flushData) or its keys `keys_limit`
    (they become the KEYS property, which a broker refuses over 32767 bytes)."""
    by_topic: dict[str, list[TraceRecord]] = {}
    for rec in records:
        by_topic.setdefault(rec.topic, []).append(rec)
    out = []
    for group in by_topic.values():
        parts: list[str] = []
        keys: dict[str, None] = {}
        size = keys_size = 0
        for rec in group:
            text = encode(rec)
            parts.append(text)
            size += len(text)
            for key in index_keys(rec):
                if key not in keys:
                    keys[key] = None
                    keys_size += len(key) + 1
            if size >= limit or keys_size >= keys_limit:
                out.append(("".join(parts), list(keys)))
                parts, keys, size, keys_size = [], {}, 0, 0
        if parts:
            out.append(("".join(parts), list(keys)))
    return out


# -- building records ---------------------------------------------------------------------------------

def message_type(msg: Message, half: bool) -> MessageType:
    if half:
        return MessageType.TRANS_HALF
    return MessageType.DELAY if msg.delay_level else MessageType.NORMAL


def pub_records(group: str, msgs: Sequence[Message], result: SendResult, store_host: str, cost_ms: int,
                half: bool = False) -> list[TraceRecord]:
    """SendMessageTraceHookImpl: one Pub per message (a batch's ids are comma-joined in the result;
    Java writes one record with the joined ids, which no query by one id finds)."""
    now = int(time.time() * 1000)
    ids = result.msg_id.split(",") if len(msgs) > 1 else [result.msg_id]
    offset_ids = result.offset_msg_id.split(",") if len(msgs) > 1 else [result.offset_msg_id]
    ok = result.status is SendStatus.SEND_OK
    return [TraceRecord(TraceType.PUB, now - cost_ms, result.region_id or DEFAULT_REGION, group, topic=msg.topic,
                        msg_id=msg_id, tags=msg.tags, keys=msg.keys_text, store_host=store_host,
                        body_length=len(msg.body), cost_ms=cost_ms, msg_type=message_type(msg, half),
                        offset_msg_id=offset_id, success=ok)
            for msg, msg_id, offset_id in zip(msgs, ids, offset_ids)]


def end_transaction_record(group: str, topic: str, msg_id: str, tags: str | None, keys: str | None,
                           store_host: str, state: str, from_check: bool, region: str | None) -> TraceRecord:
    """EndTransactionTraceHookImpl."""
    return TraceRecord(TraceType.END_TRANSACTION, int(time.time() * 1000), region or DEFAULT_REGION, group,
                       topic=topic, msg_id=msg_id, tags=tags, keys=keys, store_host=store_host,
                       msg_type=MessageType.TRANS_COMMIT, transaction_id=msg_id, transaction_state=state,
                       from_check=from_check)


# -- the dispatcher -----------------------------------------------------------------------------------

class TraceDispatcher:
    """AsyncTraceDispatcher: append() from the loop or any listener thread; a task on the loop
    batches what arrived and sends it. Tracing never slows or fails the traced calls: a full
    queue drops records (counted), a failed trace send is logged and counted."""

    def __init__(self, config: ClientConfig, topic: str | None = None) -> None:
        self.topic = topic or TRACE_TOPIC
        self.config = dataclasses.replace(config, instance_name=TRACE_INSTANCE, client_id="")
        self.dropped = 0
        self.sent = 0               # trace messages stored
        self.failed = 0             # trace messages not stored
        self._pending: collections.deque[TraceRecord] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0               # a producer's records come on the loop: no self-pipe write
        self._task: asyncio.Task | None = None
        self._in_flight: set[asyncio.Future] = set()
        self._producer: AsyncProducer | None = None
        self._last_failure_log = -math.inf

    async def start(self) -> None:
        from smartgo.client.producer import AsyncProducer      # the producer module imports this one
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._producer = AsyncProducer(TRACE_GROUP, self.config.registry, config=self.config)
        await self._producer.start()
        self._task = self._loop.create_task(self._run())

    def append(self, rec: TraceRecord) -> None:
        if len(self._pending) >= QUEUE_CAPACITY:
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning("trace buffer full: %d trace record(s) dropped so far", self.dropped)
            return
        self._pending.append(rec)
        self._wake_up()

    def _wake_up(self) -> None:
        """Have the task send what is pending (once per batch, whoever calls)."""
        if self._wake_pending or self._loop is None:
            return
        self._wake_pending = True
        if threading.get_ident() == self._loop_thread:
            self._wake.set()  # type: ignore[union-attr]  # set by start()
            return
        try:
            self._loop.call_soon_threadsafe(self._wake.set)  # type: ignore[union-attr]  # set by start()
        except RuntimeError:                # the loop is closed: the client is gone
            pass

    def extend(self, records: Iterable[TraceRecord]) -> None:
        for rec in records:
            self.append(rec)

    async def _run(self) -> None:
        wake = self._wake
        while True:
            await wake.wait()  # type: ignore[union-attr]  # set by start()
            if len(self._pending) < BATCH_SIZE:
                await asyncio.sleep(BATCH_WAIT)
            wake.clear()  # type: ignore[union-attr]  # set by start()
            self._wake_pending = False
            self._send_pending()

    def _send_pending(self, closing: bool = False) -> None:
        pending = self._pending
        if len(self._in_flight) >= MAX_IN_FLIGHT and not closing:
            return                          # the next finished send wakes the task again
        records = [pending.popleft() for _ in range(len(pending))]
        for body, keys in pack(records):
            try:
                msg = Message(self.topic, body.encode("utf-8"), keys=keys)
                fut = self._producer.send_async(msg, timeout=5.0)  # type: ignore[union-attr]  # set by start()
            except Exception as exc:
                self._failed(exc)
                continue
            self._in_flight.add(fut)
            fut.add_done_callback(self._sent)

    def _sent(self, fut: asyncio.Future) -> None:
        self._in_flight.discard(fut)
        exc = fut.exception()
        if exc is None:
            self.sent += 1
        else:
            self._failed(exc)
        if self._pending:
            self._wake_up()

    def _failed(self, exc: BaseException) -> None:
        self.failed += 1
        now = time.monotonic()
        if now - self._last_failure_log >= 60.0:
            self._last_failure_log = now
            log.warning("a message trace was not stored in %s (%d so far): %s", self.topic, self.failed, exc)

    async def close(self, timeout: float = 3.0) -> None:
        """Send what is pending and wait up to timeout for it (Java's flush waits 500 ms)."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        self._send_pending(closing=True)
        if self._in_flight:
            await asyncio.wait(list(self._in_flight), timeout=timeout)
        await self._producer.close()  # type: ignore[union-attr]  # set by start()


# -- a traced listener --------------------------------------------------------------------------------

class _Consumption:
    """One traced listener call on one message or a batch (Java's one TraceContext with a bean a
    message): a SubBefore per message on entry, a SubAfter per message on exit, all under one
    request id, the call's cost shared among them as Java does. `acked` is how many, from the
    first, were consumed; a listener that raised leaves 0 and the code EXCEPTION."""

    __slots__ = ("append", "befores", "started", "acked", "code")

    def __init__(self, group: str, msgs: Sequence[MessageExt], append: Callable[[TraceRecord], None]) -> None:
        self.append = append
        request_id, now = uniq_ids().next_id(), int(time.time() * 1000)
        self.befores = [TraceRecord(TraceType.SUB_BEFORE, now, msg.properties.get(Prop.MSG_REGION) or DEFAULT_REGION,
                                    group, request_id=request_id, topic=msg.topic,
                                    msg_id=msg.properties.get(Prop.UNIQ_KEY) or msg.msg_id,
                                    keys=msg.properties.get(Prop.KEYS), retry_times=msg.reconsume_times)
                        for msg in msgs]
        self.acked, self.code = 0, ConsumeReturnType.EXCEPTION

    def __enter__(self) -> _Consumption:
        for before in self.befores:
            self.append(before)
        self.started = time.perf_counter()
        return self

    def done(self, acked: int) -> None:
        """The runner's reading of the listener's answer."""
        self.acked, self.code = acked, ConsumeReturnType.FAILED

    def __exit__(self, *exc: object) -> None:
        self.after(int((time.perf_counter() - self.started) * 1000))

    def after(self, cost: int) -> None:
        cost //= len(self.befores)
        now, append, acked = int(time.time() * 1000), self.append, self.acked
        for i, b in enumerate(self.befores):
            ok = i < acked
            append(TraceRecord(TraceType.SUB_AFTER, now, b.region_id, b.group, b.request_id, b.topic, b.msg_id,
                               keys=b.keys, cost_ms=cost, success=ok,
                               context_code=ConsumeReturnType.SUCCESS if ok else self.code))


def trace_polled(group: str, msgs: Sequence[MessageExt], append: Callable[[TraceRecord], None]) -> None:
    """A lite pull consumer's consume hook, run as poll hands messages out (Java's
    DefaultLitePullConsumerImpl.poll): per message a SubBefore and a successful SubAfter of cost 0."""
    for msg in msgs:
        call = _Consumption(group, (msg,), append)
        append(call.befores[0])
        call.done(1)
        call.after(0)


def traced_listener(listener: Listener | BatchListener, group: str, tracer: TraceDispatcher,
                    judge: Callable[[object, T], int]) -> Listener | BatchListener:
    """ConsumeMessageTraceHookImpl around a listener: SubBefore as the call starts, SubAfter (cost,
    verdict, how it ended) as it returns or raises. Works for plain and coroutine listeners, on a
    message or a batch (judge: acked_one or acked_batch, as the runner reads the answer)."""
    append = tracer.append
    call_listener: Callable[[Any], Any] = listener  # called with what it was registered for

    def messages(work: Any) -> Sequence[MessageExt]:
        return work if isinstance(work, list) else (work,)

    if is_coroutine_listener(listener):
        async def traced_async(work: Any) -> object:
            with _Consumption(group, messages(work), append) as call:
                value = await call_listener(work)
                call.done(judge(value, work))
                return value
        return traced_async

    def traced(work: Any) -> object:
        with _Consumption(group, messages(work), append) as call:
            value = call_listener(work)
            call.done(judge(value, work))
            return value
    return traced
