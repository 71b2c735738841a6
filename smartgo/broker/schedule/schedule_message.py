"""Records the broker rewrites (sans-IO): the send path's delay and transaction-half rewrites, the
schedule actor's re-publish, the copy a consumer's send-back stores (send_back_record), the
message END_TRANSACTION makes of a half (end_transaction_record) and a half's copies for the
check-back's give-up and RESUME_CHECK_HALF_MESSAGE (half_copy).

Storing (CommitLog.asyncPutMessage): a non-transactional or commit message with DELAY > 0 is
stored in SCHEDULE_TOPIC_XXXX, queue level - 1, with the level capped at the table's maximum
and REAL_TOPIC / REAL_QID recording where it goes when due. Dispatch gives its ConsumeQueue
entry the delivery time as tag code (store time + the level's delay).

Transactions (TransactionalMessageBridge.parseHalfMessageInner): a message whose TRAN_MSG
property is true is a half message, stored in RMQ_SYS_TRANS_HALF_TOPIC queue 0 as an ordinary
(transaction type NOT) record with REAL_TOPIC / REAL_QID; its consumers never see it. A commit
(EndTransactionProcessor.endMessageTransaction) stores it again in REAL_TOPIC / REAL_QID with
transaction type COMMIT, PREPAREDTRANSACTIONOFFSET = the half's CommitLog offset, and TRAN_MSG,
REAL_TOPIC and REAL_QID removed.

Re-publishing (ScheduleMessageService.messageTimeup): the same record for REAL_TOPIC /
REAL_QID, DELAY removed, everything else kept byte for byte (body and its CRC, flag, sys flag,
born time and host, store host, reconsume times, every other property, REAL_TOPIC and REAL_QID
included, as RocketMQ keeps them). The commit actor patches queue offset, physical offset and
store time as for any record, so a copy in the CommitLog differs from what was handed over only
in those three fields: `copy_signature` digests the rest, which is how a restarted schedule
actor recognises copies it made but had not yet counted.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass
from typing import NamedTuple

from smartgo.store.config import TIMER_FIRST_LEVEL
from smartgo.store.errors import MessageIllegalError
from smartgo.store.record import (BORNHOST_V6_FLAG, INT16, INT32, INT64, MESSAGE_MAGIC, POS_QUEUEOFFSET,
                                  POS_STORETIMESTAMP, POS_SYSFLAG, SCHEDULE_TOPIC, SIZE_MAGIC,
                                  STOREHOST_V6_FLAG, TRANSACTION_MASK, topic_field)

DELAY = "DELAY"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
_DELAY_SEG = DELAY + "\x01"
_REAL_SEGS = (REAL_TOPIC + "\x01", REAL_QID + "\x01")
_TRAN_SEG = TRAN_MSG + "\x01"
_CHECK_TIMES_SEG = (CHECK_TIMES + "\x01").encode()
_END_DROPPED = (_TRAN_SEG.encode(), *(seg.encode() for seg in _REAL_SEGS))
_REAL_QID_B = _REAL_SEGS[1].encode()
_ROUTE = re.compile(rb"(?:^|\x02)(REAL_TOPIC|REAL_QID)\x01([^\x02]*)").findall
_DELAY_SEGMENT = re.compile(rb"(?:^|\x02)DELAY\x01[^\x02]*").sub
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
TIMER_OUT_MS = "TIMER_OUT_MS"
TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
START_DELIVER_TIME = "__STARTDELIVERTIME"      # Aliyun ONS's (ali-ons' setStartDeliverTime): ms since the epoch
# what a producer may ask, in 5.x's order of precedence: (property, ms per unit, relative to now)
_TIMER_ASKS = ((TIMER_DELAY_SEC + "\x01", 1000, True), (TIMER_DELAY_MS + "\x01", 1, True),
               (TIMER_DELIVER_MS + "\x01", 1, False), (START_DELIVER_TIME + "\x01", 1, False))
_TIMER_SET = tuple(p + "\x01" for p in (REAL_TOPIC, REAL_QID, DELAY, TIMER_ROLL_TIMES))
_TIMER_OUT = re.compile(rb"(?:^|\x02)TIMER_OUT_MS\x01([^\x02]*)").findall
_ROLL_B = (TIMER_ROLL_TIMES + "\x01").encode()
_HOP_DROPPED = (_DELAY_SEG.encode(), _ROLL_B)
SCHEDULE_TOPIC_BYTES = SCHEDULE_TOPIC.encode()


class ScheduleRecordError(ValueError):
    """A record in SCHEDULE_TOPIC_XXXX that cannot be re-published (no REAL_TOPIC/REAL_QID, garbled)."""


def delay_property(properties: str) -> str | None:
    """The DELAY value of a properties string (the last one wins, as in a Java HashMap), or None."""
    return _property(properties, _DELAY_SEG)


def _property(properties: str, segment: str) -> str | None:
    """The value of a property (the last one wins, as in a Java HashMap), or None."""
    if segment not in properties:
        return None
    value = None
    for seg in properties.split("\x02"):
        if seg.startswith(segment):
            value = seg[len(segment):]
    return value


def _rerouted(properties: str, topic: str, queue_id: int, segment: str = "", value: str = "") -> str:
    """properties with REAL_TOPIC / REAL_QID set to topic and queue_id (any the producer sent are
    dropped), and the property starting with `segment` given `value`."""
    kept = []
    for seg in properties.split("\x02"):
        if not seg or seg.startswith(_REAL_SEGS):
            continue
        if segment and seg.startswith(segment):
            seg = segment + value
        kept.append(seg)
    kept += (f"{REAL_TOPIC}\x01{topic}", f"{REAL_QID}\x01{queue_id}")
    return "\x02".join(kept)


def half_rewrite(properties: str, topic: str, queue_id: int, reconsume_times: int) -> tuple[str, int, str] | None:
    """(RMQ_SYS_TRANS_HALF_TOPIC, 0, properties) for a transaction's half message: TRAN_MSG is
    true (Boolean.parseBoolean) and it is not an old client's send-back (reconsumed and delayed,
    SendMessageProcessor's exception for clients before 4.6.1). None otherwise."""
    tran = _property(properties, _TRAN_SEG)
    if tran is None or tran.lower() != "true":
        return None
    delay = delay_property(properties)
    if reconsume_times > 0 and delay is not None and delay.isdigit() and int(delay) > 0:
        return None
    return HALF_TOPIC, 0, _rerouted(properties, topic, queue_id)


def schedule_rewrite(properties: str, topic: str, queue_id: int, max_level: int) -> tuple[str, int, str] | None:
    """(SCHEDULE_TOPIC_XXXX, level - 1, properties) for a message to delay, None when DELAY is
    absent or <= 0. The level is capped at max_level (DELAY rewritten to it); REAL_TOPIC and
    REAL_QID replace any the producer sent. MessageIllegalError when DELAY is not an integer."""
    value = delay_property(properties)
    if value is None:
        return None
    try:
        level = int(value)
    except ValueError:
        raise MessageIllegalError(f"the DELAY property {value[:40]!r} is not a delay level "
                                  f"(an integer, 1..{max_level})") from None
    if level <= 0:
        return None
    capped = min(level, max_level)
    return SCHEDULE_TOPIC, capped - 1, _rerouted(properties, topic, queue_id, _DELAY_SEG, str(capped))


class _Layout(NamedTuple):
    """Where the variable parts of a record are (hosts may be IPv6 in foreign stores)."""
    total: int
    store_ts: int       # position of STORETIMESTAMP
    body_len_at: int    # position of BODYLEN (RECONSUMETIMES is 12 bytes before)
    body_end: int       # BODY ends here; TOPICLEN follows
    props: int          # PROPERTIES start


def _layout(rec) -> _Layout:
    if len(rec) < POS_SYSFLAG + 4:
        raise ScheduleRecordError("truncated record")
    total = INT32.unpack_from(rec, 0)[0]
    magic = INT32.unpack_from(rec, 4)[0]
    sys_flag = INT32.unpack_from(rec, POS_SYSFLAG)[0]
    born = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    store = 20 if sys_flag & STOREHOST_V6_FLAG else 8
    store_ts = POS_STORETIMESTAMP + born - 8
    body_len_at = store_ts + 8 + store + 12
    if magic != MESSAGE_MAGIC or total != len(rec) or body_len_at + 4 > total:
        raise ScheduleRecordError(f"not a whole record (size {total}, {len(rec)} bytes)")
    body_len = INT32.unpack_from(rec, body_len_at)[0]
    body_end = body_len_at + 4 + body_len
    if body_len < 0 or body_end + 3 > total:
        raise ScheduleRecordError(f"bad body length {body_len}")
    props = body_end + 1 + rec[body_end]
    if props + 2 > total or INT16.unpack_from(rec, props)[0] != total - props - 2:
        raise ScheduleRecordError("bad topic or properties length")
    return _Layout(total, store_ts, body_len_at, body_end, props + 2)


class Republished(NamedTuple):
    topic: str
    queue_id: int
    data: bytes         # the record to append (queue offset, physical offset, store time zeroed)


def _real_route(props: bytes) -> tuple[str, int, bytes]:
    """(topic, queue id, topic field) of REAL_TOPIC / REAL_QID (the last ones win, as in a Java
    HashMap)."""
    route = dict(_ROUTE(props))
    if b"REAL_TOPIC" not in route or b"REAL_QID" not in route:
        raise ScheduleRecordError("no REAL_TOPIC/REAL_QID property")
    topic = route[b"REAL_TOPIC"].decode("utf-8", "replace")
    try:
        queue_id = int(route[b"REAL_QID"])
        tfield = topic_field(topic)
    except (ValueError, MessageIllegalError) as exc:
        raise ScheduleRecordError(f"bad REAL_TOPIC/REAL_QID: {exc}") from None
    if not 0 <= queue_id < 1 << 31:
        raise ScheduleRecordError(f"bad REAL_QID {queue_id}")
    return topic, queue_id, tfield


def republish(rec: memoryview | bytes) -> Republished:
    """The record a due SCHEDULE_TOPIC_XXXX record becomes (see the module doc)."""
    lay = _layout(rec)
    props = bytes(rec[lay.props:lay.total])
    topic, queue_id, tfield = _real_route(props)
    properties = _DELAY_SEGMENT(b"", props).lstrip(b"\x02")
    return Republished(topic, queue_id, _rebuild(rec, lay, tfield, queue_id, properties))


def end_transaction_record(rec: memoryview | bytes, tx_type: int, half_offset: int) -> Republished:
    """The message a half record becomes when its transaction commits (see the module doc)."""
    lay = _layout(rec)
    props = bytes(rec[lay.props:lay.total])
    topic, queue_id, tfield = _real_route(props)
    kept = b"\x02".join(seg for seg in props.split(b"\x02") if seg and not seg.startswith(_END_DROPPED))
    sys_flag = INT32.unpack_from(rec, POS_SYSFLAG)[0] & ~TRANSACTION_MASK | tx_type
    return Republished(topic, queue_id, _rebuild(rec, lay, tfield, queue_id, kept, tx=(sys_flag, half_offset)))


def half_copy(rec: memoryview | bytes, topic: str, check_times: int) -> bytes:
    """A half record stored again in `topic` queue 0 (4.x's toMessageExtBrokerInner: the copy of a
    given-up half, and the half RESUME_CHECK_HALF_MESSAGE puts back): TRANSACTION_CHECK_TIMES set
    to check_times, every other field and property kept. ScheduleRecordError for a record that
    is not a half (no REAL_TOPIC / REAL_QID: no producer could end it)."""
    lay = _layout(rec)
    props = bytes(rec[lay.props:lay.total])
    _real_route(props)
    kept = [seg for seg in props.split(b"\x02") if seg and not seg.startswith(_CHECK_TIMES_SEG)]
    kept.append(_CHECK_TIMES_SEG + b"%d" % check_times)
    return _rebuild(rec, lay, topic_field(topic), 0, b"\x02".join(kept))


def check_message(rec: memoryview | bytes) -> bytes:
    """The body of CHECK_TRANSACTION_STATE (sendCheckMessage): the half record under its real
    topic and queue, every other field and property as stored."""
    lay = _layout(rec)
    props = bytes(rec[lay.props:lay.total])
    _, queue_id, tfield = _real_route(props)
    return _rebuild(rec, lay, tfield, queue_id, props, stamped=True)


def _rebuild(rec, lay: _Layout, tfield: bytes, queue_id: int, props: bytes, reconsume_times: int | None = None,
             tx: tuple[int, int] | None = None, stamped: bool = False) -> bytes:
    """The record with a new topic, queue and properties (and reconsume times, or sys flag and
    prepared-transaction offset); queue offset, physical offset and store time zeroed for the
    commit actor to patch, or kept (stamped: a copy that is not stored)."""
    if len(props) > 32767:
        raise ScheduleRecordError(f"the properties would be {len(props)} bytes, over the 32767-byte limit")
    head = bytearray(rec[:lay.store_ts + 8])        # through STORETIMESTAMP: the fields patched here
    SIZE_MAGIC.pack_into(head, 0, lay.body_end + len(tfield) + 2 + len(props), MESSAGE_MAGIC)
    INT32.pack_into(head, 12, queue_id)
    if not stamped:
        head[POS_QUEUEOFFSET:POS_SYSFLAG] = bytes(POS_SYSFLAG - POS_QUEUEOFFSET)
        INT64.pack_into(head, lay.store_ts, 0)
    middle = rec[lay.store_ts + 8:lay.body_end]
    if reconsume_times is not None or tx is not None:
        middle = bytearray(middle)
        reconsume_at = lay.body_len_at - 12 - lay.store_ts - 8     # RECONSUMETIMES follows the store host
        if reconsume_times is not None:
            INT32.pack_into(middle, reconsume_at, reconsume_times)
        if tx is not None:
            INT32.pack_into(head, POS_SYSFLAG, tx[0])
            INT64.pack_into(middle, reconsume_at + 4, tx[1])         # PREPAREDTRANSACTIONOFFSET
    return b"".join((head, middle, tfield, INT16.pack(len(props)), props))


class SentBack(NamedTuple):
    """What CONSUMER_SEND_MSG_BACK needs of the original record."""
    topic: str
    reconsume_times: int
    properties: str


def sent_back_fields(rec: memoryview | bytes) -> SentBack:
    lay = _layout(rec)
    tlen = rec[lay.body_end]
    topic = bytes(rec[lay.body_end + 1:lay.body_end + 1 + tlen]).decode("utf-8", "replace")
    props = bytes(rec[lay.props:lay.total]).decode("utf-8", "replace")
    return SentBack(topic, INT32.unpack_from(rec, lay.body_len_at - 12)[0], props)


def send_back_record(rec: memoryview | bytes, topic: str, queue_id: int, properties: str,
                     reconsume_times: int) -> bytes:
    """The record CONSUMER_SEND_MSG_BACK stores (SendMessageProcessor.asyncConsumerSendMsgBack):
    body, flag, sys flag, born time and host of the original; a new topic, queue, properties
    and reconsume times."""
    lay = _layout(rec)
    try:
        tfield = topic_field(topic)
    except MessageIllegalError as exc:
        raise ScheduleRecordError(f"bad topic {topic!r}: {exc}") from None
    return _rebuild(rec, lay, tfield, queue_id, properties.encode(), reconsume_times)


def copy_signature(rec: memoryview | bytes) -> bytes:
    """Digest of a record without the fields the commit actor patches (queue offset, physical
    offset, store time): equal for a re-published record and its copy in the CommitLog."""
    lay = _layout(rec)
    h = hashlib.blake2b(digest_size=16)
    h.update(rec[:POS_QUEUEOFFSET])
    h.update(rec[POS_SYSFLAG:lay.store_ts])
    h.update(rec[lay.store_ts + 8:lay.total])
    return h.digest()


def is_copy_candidate(topic: bytes, properties: bytes) -> bool:
    """Could this CommitLog record be a re-published copy, or a timer message's next hop?
    (peek_head's topic and properties)"""
    return _REAL_QID_B in properties and (topic != SCHEDULE_TOPIC_BYTES or _ROLL_B in properties)


def idle_bit(queue_id: int) -> int:
    """The bit of a delay level's queue in the board word schedule.idle (levels past 63 share one)."""
    return 1 << min(queue_id, 62)


def deliver_time(tags_code: int, now_ms: int, delay_ms: int) -> int:
    """The entry's delivery time, corrected as correctDeliverTimestamp does: a time further away
    than the level's delay (a clock that went back, a foreign tag code) means now."""
    return now_ms if tags_code > now_ms + delay_ms else tags_code


# ---- timer messages ---------------------------------------------------------------------------------
# RocketMQ 5.x delivers a message at any time (TIMER_DELIVER_MS, or TIMER_DELAY_SEC / TIMER_DELAY_MS
# from now) from a timer wheel of its own files. Here a timer message hops through the schedule
# table's hop levels (TIMER_FIRST_LEVEL on: precision * 2**k ms each, smartgo.store.config.timer_hops).
# Each level has one delay, so its entries come due in the order they were stored, and the schedule
# actor keeps doing what it does for delay levels: follow each queue's head, deliver exactly once
# across restarts. A message with r ms to go is stored at the longest hop within r (the shortest
# when none is); when that entry comes due it is delivered if its time (TIMER_OUT_MS) has come, else
# stored again at the hop for what is left, TIMER_ROLL_TIMES one higher. Delivery is never early
# and at most one precision late (plus the actor's own latency), after at most one hop per level
# (18 at the defaults: 1 s precision, 3 days at most).


@dataclass(frozen=True, slots=True)
class TimerSettings:
    enabled: bool
    max_delay_ms: int
    hops: tuple[int, ...]       # delays of levels TIMER_FIRST_LEVEL.. (ascending)

    def hop_level(self, remaining_ms: int) -> int:
        """The level of the longest hop within remaining_ms (the shortest when none is)."""
        return TIMER_FIRST_LEVEL + max(bisect.bisect_right(self.hops, remaining_ms) - 1, 0)


def timer_rewrite(properties: str, topic: str, queue_id: int, now_ms: int,
                  timer: TimerSettings) -> tuple[str, int, str] | None:
    """(SCHEDULE_TOPIC_XXXX, queue, properties) of a timer message's first hop: REAL_TOPIC and
    REAL_QID, DELAY the hop's level, TIMER_OUT_MS its time (5.x's property for it). None for no
    timer message (none of the three properties nor ONS's __STARTDELIVERTIME, or TIMER_OUT_MS: one
    delivered already) and for one due by now. MessageIllegalError for a value that is no integer,
    a time beyond the maximum delay, or timers switched off (5.x: MESSAGE_ILLEGAL for each)."""
    if _property(properties, TIMER_OUT_MS + "\x01") is not None:
        return None
    for segment, unit, relative in _TIMER_ASKS:  # noqa: B007 - unit and relative are read after the break
        if (value := _property(properties, segment)) is not None:
            break
    else:
        return None
    if not timer.enabled:
        raise MessageIllegalError("accurate timer message is not enabled, timer_wheel_enable is false")
    try:
        deliver = int(value) * unit + (now_ms if relative else 0)
    except ValueError:
        raise MessageIllegalError(f"timer message illegal: {segment[:-1]} {value[:40]!r} is not an integer") from None
    if deliver <= now_ms:
        return None
    if deliver - now_ms > timer.max_delay_ms:
        raise MessageIllegalError(f"timer message illegal, the delay time should not be bigger than the max delay "
                                  f"{timer.max_delay_ms}ms")
    level = timer.hop_level(deliver - now_ms)
    kept = [seg for seg in properties.split("\x02") if seg and not seg.startswith(_TIMER_SET)]
    kept += (f"{REAL_TOPIC}\x01{topic}", f"{REAL_QID}\x01{queue_id}", f"{DELAY}\x01{level}",
             f"{TIMER_OUT_MS}\x01{deliver}")
    return SCHEDULE_TOPIC, level - 1, "\x02".join(kept)


def delayed_commit(final: Republished, max_level: int, now_ms: int, timer: TimerSettings) -> Republished:
    """A committed transaction's message (end_transaction_record) that asks for a delay level or a
    timer goes to SCHEDULE_TOPIC_XXXX as a send would: 4.x's putMessage delays the COMMIT type as
    well, 5.x's HookUtils times it. Transaction type and prepared offset stay, as there. A value a
    send would refuse (MessageIllegalError) is the caller's: the half was accepted long ago."""
    lay = _layout(final.data)
    props = bytes(final.data[lay.props:lay.total]).decode("utf-8", "replace")
    delayed = schedule_rewrite(props, final.topic, final.queue_id, max_level) \
        or timer_rewrite(props, final.topic, final.queue_id, now_ms, timer)
    if delayed is None:
        return final
    topic, queue_id, rewritten = delayed
    return Republished(topic, queue_id, _rebuild(final.data, lay, topic_field(topic), queue_id, rewritten.encode()))


def timer_step(rec: memoryview | bytes, due_ms: int, now_ms: int, timer: TimerSettings) -> Republished:
    """What a due hop entry becomes: the message itself (republish) once its time has come, else
    its next hop, for what is left after the entry's due time (its ConsumeQueue tag code), so that a
    restarted actor can tell which copy it made (timer_copies). A due time still ahead (the entry
    was taken early: a shorter hop table since, a clock gone back) counts as now: never early."""
    lay = _layout(rec)
    props = bytes(rec[lay.props:lay.total])
    out = _timer_out(props)
    if out is None or out <= now_ms:
        return republish(rec)
    return _next_hop(rec, lay, props, timer.hop_level(out - min(due_ms, now_ms)))


def timer_copies(rec: memoryview | bytes, due_ms: int, timer: TimerSettings) -> list[bytes]:
    """Every record timer_step may have made of a hop entry, at any time."""
    lay = _layout(rec)
    props = bytes(rec[lay.props:lay.total])
    copies = [republish(rec).data]
    out = _timer_out(props)
    if out is not None and out > due_ms:
        copies.append(_next_hop(rec, lay, props, timer.hop_level(out - due_ms)).data)
    return copies


def _timer_out(props: bytes) -> int | None:
    found = _TIMER_OUT(props)
    try:
        return int(found[-1]) if found else None
    except ValueError:
        return None


def _next_hop(rec: memoryview | bytes, lay: _Layout, props: bytes, level: int) -> Republished:
    rolls = 0
    kept = []
    for seg in props.split(b"\x02"):
        if seg.startswith(_ROLL_B):
            rolls = int(seg[len(_ROLL_B):]) if seg[len(_ROLL_B):].isdigit() else 0
        elif seg and not seg.startswith(_HOP_DROPPED):
            kept.append(seg)
    kept += (_DELAY_SEG.encode() + b"%d" % level, _ROLL_B + b"%d" % (rolls + 1))
    return Republished(SCHEDULE_TOPIC, level - 1,
                       _rebuild(rec, lay, topic_field(SCHEDULE_TOPIC), level - 1, b"\x02".join(kept)))
