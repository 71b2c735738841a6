"""Records the broker rewrites (sans-IO): the send path's delay rewrite, the schedule actor's
re-publish, and the copy a consumer's send-back stores (send_back_record).

Storing (CommitLog.asyncPutMessage): a non-transactional or commit message with DELAY > 0 is
stored in SCHEDULE_TOPIC_XXXX, queue level - 1, with the level capped at the table's maximum
and REAL_TOPIC / REAL_QID recording where it goes when due. Dispatch gives its ConsumeQueue
entry the delivery time as tag code (store time + the level's delay).

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
                                  STOREHOST_V6_FLAG, topic_field)

DELAY = "DELAY"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
_DELAY_SEG = DELAY + "\x01"
_REAL_SEGS = (REAL_TOPIC + "\x01", REAL_QID + "\x01")
_REAL_QID_B = _REAL_SEGS[1].encode()
_ROUTE = re.compile(rb"(?:^|\x02)(REAL_TOPIC|REAL_QID)\x01([^\x02]*)").findall
_DELAY_SEGMENT = re.compile(rb"(?:^|\x02)DELAY\x01[^\x02]*").sub
SCHEDULE_TOPIC_BYTES = SCHEDULE_TOPIC.encode()


class ScheduleRecordError(ValueError):
    """A record in SCHEDULE_TOPIC_XXXX that cannot be re-published (no REAL_TOPIC/REAL_QID, garbled)."""


def delay_property(properties: str) -> str | None:
    """The DELAY value of a properties string (the last one wins, as in a Java HashMap), or None."""
    if _DELAY_SEG not in properties:
        return None
    value = None
    for seg in properties.split("\x02"):
        if seg.startswith(_DELAY_SEG):
            value = seg[len(_DELAY_SEG):]
    return value


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
    kept = []
    for seg in properties.split("\x02"):
        if not seg or seg.startswith(_REAL_SEGS):
            continue
        if seg.startswith(_DELAY_SEG):
            seg = f"{_DELAY_SEG}{capped}"
        kept.append(seg)
    kept += (f"{REAL_TOPIC}\x01{topic}", f"{REAL_QID}\x01{queue_id}")
    return SCHEDULE_TOPIC, capped - 1, "\x02".join(kept)


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


def republish(rec: memoryview | bytes) -> Republished:
    """The record a due SCHEDULE_TOPIC_XXXX record becomes (see the module doc)."""
    lay = _layout(rec)
    props = bytes(rec[lay.props:lay.total])
    route = dict(_ROUTE(props))                     # the last one wins, as in a Java HashMap
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
    return Republished(topic, queue_id, _rebuild(rec, lay, tfield, queue_id, _DELAY_SEGMENT(b"", props).lstrip(b"\x02")))


def _rebuild(rec, lay: _Layout, tfield: bytes, queue_id: int, props: bytes, reconsume_times: int | None = None) -> bytes:
    """The record with a new topic, queue and properties (and reconsume times), queue offset,
    physical offset and store time zeroed for the commit actor to patch."""
    head = bytearray(rec[:lay.store_ts + 8])        # through STORETIMESTAMP: the fields patched here
    SIZE_MAGIC.pack_into(head, 0, lay.body_end + len(tfield) + 2 + len(props), MESSAGE_MAGIC)
    INT32.pack_into(head, 12, queue_id)
    head[POS_QUEUEOFFSET:POS_SYSFLAG] = bytes(POS_SYSFLAG - POS_QUEUEOFFSET)
    INT64.pack_into(head, lay.store_ts, 0)
    middle = rec[lay.store_ts + 8:lay.body_end]
    if reconsume_times is not None:                  # RECONSUMETIMES follows the store host
        middle = bytearray(middle)
        INT32.pack_into(middle, lay.body_len_at - 12 - lay.store_ts - 8, reconsume_times)
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
    props = properties.encode()
    if len(props) > 32767:
        raise ScheduleRecordError(f"the properties would be {len(props)} bytes, over the 32767-byte limit")
    return _rebuild(rec, lay, tfield, queue_id, props, reconsume_times)


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
