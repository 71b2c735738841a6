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

import hashlib
import re
from typing import NamedTuple

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
    return Republished(topic, queue_id, _rebuild(rec, lay, tfield, queue_id, _DELAY_SEGMENT(b"", props).lstrip(b"\x02")))


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


def send_back_record(rec: memoryview | bytes, topic: str, queue_id: int, properties: str, reconsume_times: int) -> bytes:
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
    """Could this CommitLog record be a re-published copy? (peek_head's topic and properties)"""
    return topic != SCHEDULE_TOPIC_BYTES and _REAL_QID_B in properties


def idle_bit(queue_id: int) -> int:
    """The bit of a delay level's queue in the board word schedule.idle (levels past 63 share one)."""
    return 1 << min(queue_id, 62)


def deliver_time(tags_code: int, now_ms: int, delay_ms: int) -> int:
    """The entry's delivery time, corrected as correctDeliverTimestamp does: a time further away
    than the level's delay (a clock that went back, a foreign tag code) means now."""
    return now_ms if tags_code > now_ms + delay_ms else tags_code
