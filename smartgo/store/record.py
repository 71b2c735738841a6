"""The CommitLog record codec (sans-IO): RocketMQ 4.x byte layout, big-endian.

One record is 17 fields; with IPv4 hosts the fixed part is 91 bytes plus body, topic and
properties. The same bytes travel in PULL/QUERY/VIEW bodies, so clients decode with this
module too. The broker encodes a record once (in a net actor); the commit actor only
patches QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP in place (offsets exported below).
"""

from __future__ import annotations

import functools
import mmap
import re
import socket
import struct
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from smartgo.store.errors import CorruptRecordError, InvalidMessageIdError, MessageIllegalError
from smartgo.store.java_hash import TAGS_CODES as _TAGS_CODES
from smartgo.store.java_hash import byte_rows, tags_code

from smartgo.store.lazy_numpy import np as _np    # dispatch parses whole rounds with it

#: what records are read from: a mapped file, or bytes
Buffer = bytes | bytearray | memoryview | mmap.mmap

MESSAGE_MAGIC = 0xDAA320A7 - (1 << 32)  # -626843481, as the signed int32 Java writes
BLANK_MAGIC = 0xCBD43194 - (1 << 32)  # -875286124: end-of-file filler
END_FILE_MIN_BLANK = 8  # a record must leave room for {int32 size, int32 BLANK_MAGIC}

# Field offsets (IPv4 born host; STORETIMESTAMP and later move by 12 with a v6 born host).
POS_TOTALSIZE = 0
POS_MAGIC = 4
POS_BODYCRC = 8
POS_QUEUEID = 12
POS_FLAG = 16
POS_QUEUEOFFSET = 20
POS_PHYSICALOFFSET = 28
POS_SYSFLAG = 36
POS_BORNTIMESTAMP = 40
POS_BORNHOST = 48
POS_STORETIMESTAMP = 56
POS_STOREHOST = 64
POS_RECONSUMETIMES = 72
POS_PREPAREDTXOFFSET = 76
POS_BODYLEN = 84
POS_BODY = 88
FIXED_SIZE = 91  # 88 + 1 topic length + 2 properties length

# sysFlag bits (MessageSysFlag)
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20

MAX_TOPIC_LENGTH = 127
MAX_PROPERTIES_LENGTH = 32767
DEFAULT_MAX_BODY = 4 * 1024 * 1024
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_SCHEDULE_TOPIC_BYTES = SCHEDULE_TOPIC.encode()

# Whole fixed header up to and including BODYLEN, IPv4 hosts (8s = 4-byte IP + int32 port).
HEADER = struct.Struct(">iiiiiqqiq8sq8siqi")
HEADER_V4_SIZE = HEADER.size  # 88
SIZE_MAGIC = struct.Struct(">ii")
# One read for what the commit actor checks per record: total size, magic, queueId, sysFlag.
SIZE_MAGIC_QUEUE_SYSFLAG = struct.Struct(">ii4xi20xi")
QUEUE_AND_PHYS = struct.Struct(">qq")  # patched together at POS_QUEUEOFFSET
INT64 = struct.Struct(">q")
INT32 = struct.Struct(">i")
INT16 = struct.Struct(">h")
HOST_V4 = struct.Struct(">4si")
HOST_V6 = struct.Struct(">16si")
MSG_ID_V4 = struct.Struct(">4siq")
MSG_ID_V6 = struct.Struct(">16siq")

_TOPIC_RE = re.compile(r"[%|a-zA-Z0-9_-]{1,127}")


def body_crc(body: Buffer) -> int:
    """UtilAll.crc32: java.util.zip.CRC32 masked to a positive int."""
    return zlib.crc32(body) & 0x7FFFFFFF


# ----------------------------------------------------------------------------- validation

_TOPIC_FIELD_CACHE: dict[str, bytes] = {}


def topic_field(topic: str) -> bytes:
    """The record's TOPICLEN + TOPIC bytes, validated once and cached per topic."""
    encoded = _TOPIC_FIELD_CACHE.get(topic)
    if encoded is None:
        if not isinstance(topic, str) or not _TOPIC_RE.fullmatch(topic):
            raise MessageIllegalError(
                f"topic {topic!r} is invalid: 1..{MAX_TOPIC_LENGTH} chars of [%|a-zA-Z0-9_-]")
        raw = topic.encode("ascii")
        encoded = bytes((len(raw),)) + raw
        if len(_TOPIC_FIELD_CACHE) > 100_000:
            _TOPIC_FIELD_CACHE.clear()
        _TOPIC_FIELD_CACHE[topic] = encoded
    return encoded


# ----------------------------------------------------------------------------- hosts, ids

_HOST_CACHE: dict[tuple[str, int], bytes] = {}


def pack_host(host: str, port: int) -> bytes:
    """8-byte IPv4 address + int32 port, as BORNHOST/STOREHOST hold it (cached)."""
    key = (host, port)
    packed = _HOST_CACHE.get(key)
    if packed is None:
        try:
            packed = HOST_V4.pack(socket.inet_aton(host), port)
        except (OSError, struct.error) as exc:
            raise MessageIllegalError(f"host {host}:{port} is not an IPv4 address and port") from exc
        if len(_HOST_CACHE) > 10_000:
            _HOST_CACHE.clear()
        _HOST_CACHE[key] = packed
    return packed


def unpack_host(raw: Buffer) -> tuple[str, int]:
    if len(raw) == 8:
        ip, port = HOST_V4.unpack(raw)
        return socket.inet_ntoa(ip), port
    ip, port = HOST_V6.unpack(raw)
    return socket.inet_ntop(socket.AF_INET6, ip), port


#: unpack_host for a decoder's hot loop (bytes only): a pulled batch names the same few hosts.
unpack_host_cached = functools.lru_cache(maxsize=4096)(unpack_host)


def create_offset_msg_id(store_host: bytes, commit_log_offset: int) -> str:
    """offsetMsgId: upper-case hex of store IP, port and physical offset (32 chars for IPv4)."""
    return (store_host + INT64.pack(commit_log_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """(store ip, store port, commit log offset) of an offsetMsgId."""
    try:
        raw = bytes.fromhex(msg_id)
    except (ValueError, TypeError) as exc:
        raise InvalidMessageIdError(f"message id {msg_id!r} is not hex") from exc
    if len(raw) == MSG_ID_V4.size:
        ip, port, offset = MSG_ID_V4.unpack(raw)
        return socket.inet_ntoa(ip), port, offset
    if len(raw) == MSG_ID_V6.size:
        ip, port, offset = MSG_ID_V6.unpack(raw)
        return socket.inet_ntop(socket.AF_INET6, ip), port, offset
    raise InvalidMessageIdError(f"message id {msg_id!r} has {len(msg_id)} chars, expected 32 or 56")


# ----------------------------------------------------------------------------- properties

def encode_properties(props: Mapping[str, str] | None) -> bytes:
    """name\\x01value\\x02... without the trailing \\x02 (as Java writes it)."""
    if not props:
        return b""
    return "\x02".join(f"{k}\x01{v}" for k, v in props.items()).encode("utf-8")


def decode_properties(raw: bytes | bytearray | memoryview | _np.ndarray | str) -> dict[str, str]:
    """MessageDecoder.string2messageProperties: skips segments without a name or a value (so any
    under 3 chars); accepts a trailing \\x02."""
    text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")
    props: dict[str, str] = {}
    for segment in text.split("\x02"):
        name, _, value = segment.partition("\x01")
        if value and name:
            props[name] = value
    return props


# ----------------------------------------------------------------------------- encode
# The one record encoder: append_record lays out every record the broker and the store write
# (encode_record for one; the send path's batch loop calls it per item).

_V4_HOSTS = ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)  # hosts are always packed as IPv4 (pack_host)


def check_sizes(body_len: int, props_len: int, max_body: int = DEFAULT_MAX_BODY) -> None:
    """MessageIllegalError for a body over max_body (maxMessageSize) or properties over 32767 bytes."""
    if body_len > max_body:
        raise MessageIllegalError(f"the message body is {body_len} bytes, over the {max_body}-byte limit "
                                  "(maxMessageSize)")
    if props_len > MAX_PROPERTIES_LENGTH:
        raise MessageIllegalError(f"the message properties are {props_len} bytes, over the "
                                  f"{MAX_PROPERTIES_LENGTH}-byte limit")


def append_record(parts: list[Buffer], body: Buffer, tfield: bytes, properties: bytes, queue_id: int, flag: int,
                  sys_flag: int, born_timestamp: int, born_host: bytes, store_host: bytes, reconsume_times: int,
                  prepared_tx_offset: int = 0, queue_offset: int = 0, physical_offset: int = 0,
                  store_timestamp: int = 0, _pack: Callable[..., bytes] = HEADER.pack,
                  _pack16: Callable[[int], bytes] = INT16.pack, _crc32: Callable[[Buffer], int] = zlib.crc32) -> int:
    """Append one record to parts as (header, body, tail) and return its size: b"".join(parts)
    is the record. tfield is a topic_field(), hosts are pack_host() values (so the IPv6 host
    flags are cleared). No limits are checked here (check_sizes)."""
    body_len = len(body)
    tail = tfield + _pack16(len(properties)) + properties
    total = HEADER_V4_SIZE + body_len + len(tail)
    parts += (_pack(total, MESSAGE_MAGIC, _crc32(body) & 0x7FFFFFFF, queue_id, flag, queue_offset, physical_offset,
                    sys_flag & _V4_HOSTS, born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
                    prepared_tx_offset, body_len), body, tail)
    return total


def encode_record(topic: str, queue_id: int, body: bytes | bytearray | memoryview, properties: bytes = b"",
                  *, flag: int = 0, sys_flag: int = 0, born_timestamp: int = 0, born_host: bytes = bytes(8),
                  store_host: bytes = bytes(8), reconsume_times: int = 0, prepared_tx_offset: int = 0,
                  queue_offset: int = 0, physical_offset: int = 0, store_timestamp: int = 0,
                  max_body: int = DEFAULT_MAX_BODY) -> bytes:
    """One complete record as new bytes. Hosts are pack_host() values; properties are
    encode_properties() bytes. Limits raise MessageIllegalError before anything is built."""
    tfield = topic_field(topic)
    check_sizes(len(body), len(properties), max_body)
    parts: list = []
    append_record(parts, body, tfield, properties, queue_id, flag, sys_flag, born_timestamp, born_host, store_host,
                  reconsume_times, prepared_tx_offset, queue_offset, physical_offset, store_timestamp)
    return b"".join(parts)


# ----------------------------------------------------------------------------- decode

@dataclass(slots=True)
class MessageExt:
    """A decoded store record (what a consumer sees for each pulled message)."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    body_crc: int = 0
    store_size: int = 0
    msg_id: str = ""  # offsetMsgId
    #: The broker a client pulled it from (Java's MessageExt.brokerName): with topic and queue_id,
    #: the message's MessageQueue, to seek or commit.
    broker_name: str = ""

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get("KEYS", "").split(" ") if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get("UNIQ_KEY")


def _host_lengths(sys_flag: int) -> tuple[int, int]:
    return (20 if sys_flag & BORNHOST_V6_FLAG else 8), (20 if sys_flag & STOREHOST_V6_FLAG else 8)


_MID = struct.Struct(">iq")  # RECONSUMETIMES, PREPAREDTXOFFSET


def _v6_fields(mv: memoryview, pos: int, sys_flag: int) -> tuple[bytes, int, bytes, int, int, int, int]:
    """BORNHOST .. BODYLEN of a record with an IPv6 host: (born host, store time, store host,
    reconsume times, prepared offset, body length, the body's position)."""
    born_len, store_len = _host_lengths(sys_flag)
    p = pos + POS_BORNHOST
    born_raw = bytes(mv[p:p + born_len])
    p += born_len
    store_ts = INT64.unpack_from(mv, p)[0]
    p += 8
    store_host_raw = bytes(mv[p:p + store_len])
    p += store_len
    reconsume, prepared = _MID.unpack_from(mv, p)
    p += 12
    return born_raw, store_ts, store_host_raw, reconsume, prepared, INT32.unpack_from(mv, p)[0], p + 4


def decode_record(buf: Buffer, pos: int = 0, *, check_crc: bool = False, with_body: bool = True) -> MessageExt:
    """Decode the record at buf[pos:]. Any inconsistency raises CorruptRecordError."""
    try:
        return _decode(memoryview(buf), pos, check_crc, with_body)
    except CorruptRecordError:
        raise
    except (struct.error, IndexError, ValueError, OSError) as exc:
        raise CorruptRecordError(f"undecodable record ({exc})", pos) from None


def _decode(mv: memoryview, pos: int, check_crc: bool, with_body: bool) -> MessageExt:
    avail = len(mv) - pos
    if avail < FIXED_SIZE:
        raise CorruptRecordError(f"truncated record: {avail} bytes left, at least {FIXED_SIZE} needed", pos)
    # one unpack of the whole IPv4 layout, the common case; IPv6 hosts move the fields after them
    (total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts, born_raw, store_ts, store_host_raw,
     reconsume, prepared, body_len) = HEADER.unpack_from(mv, pos)
    if magic != MESSAGE_MAGIC:
        raise CorruptRecordError(f"bad magic 0x{magic & 0xFFFFFFFF:08X}", pos)
    if total < FIXED_SIZE or total > avail:
        raise CorruptRecordError(f"bad total size {total} ({avail} bytes available)", pos)
    if sys_flag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG):
        born_raw, store_ts, store_host_raw, reconsume, prepared, body_len, p = _v6_fields(mv, pos, sys_flag)
    else:
        p = pos + HEADER_V4_SIZE
    born_host = unpack_host_cached(born_raw)
    store_host = unpack_host_cached(store_host_raw)
    end = pos + total
    if body_len < 0 or p + body_len + 3 > end:
        raise CorruptRecordError(f"bad body length {body_len}", pos)
    body_view = mv[p:p + body_len]
    if check_crc and (zlib.crc32(body_view) & 0x7FFFFFFF) != crc:
        raise CorruptRecordError("body CRC mismatch", pos)
    body = bytes(body_view) if with_body else b""
    p += body_len
    topic_len = mv[p]
    if topic_len == 0 or topic_len > MAX_TOPIC_LENGTH or p + 1 + topic_len + 2 > end:
        raise CorruptRecordError(f"bad topic length {topic_len}", pos)
    topic = bytes(mv[p + 1:p + 1 + topic_len]).decode("utf-8", "replace")
    p += 1 + topic_len
    props_len = INT16.unpack_from(mv, p)[0]
    p += 2
    if props_len < 0 or p + props_len != end:
        raise CorruptRecordError(f"bad properties length {props_len} for total size {total}", pos)
    properties = decode_properties(mv[p:end]) if props_len else {}
    return MessageExt(topic, queue_id, queue_offset, phys, sys_flag, flag, born_ts, born_host, store_ts,
                      store_host, reconsume, prepared, body, properties, crc, total,
                      (store_host_raw + INT64.pack(phys)).hex().upper())


def iter_records(buf: Buffer, *, check_crc: bool = False) -> Iterator[MessageExt]:
    """Decode concatenated records (a PULL/QUERY/VIEW body). Garbage raises CorruptRecordError."""
    mv = memoryview(buf)
    pos = 0
    end = len(mv)
    while pos < end:
        msg = decode_record(mv, pos, check_crc=check_crc)
        pos += msg.store_size
        yield msg


def decode_records(buf: Buffer, *, check_crc: bool = False) -> list[MessageExt]:
    return list(iter_records(buf, check_crc=check_crc))


# ----------------------------------------------------------------------------- validation walk

# TOTALSIZE, MAGIC, BODYCRC, PHYSICALOFFSET, SYSFLAG, BODYLEN (IPv4 position) in one read
_CHECK_HEAD = struct.Struct(">iii16xqi44xi")


def check_record(mv: Buffer, pos: int, limit: int, expected_phys: int | None = None) -> int:
    """Size of the well-formed record at mv[pos:limit] (magic, lengths, body CRC and, if given,
    the PHYSICALOFFSET field), else 0. Recovery's per-record test; never raises."""
    if limit - pos < HEADER_V4_SIZE + 3:
        return 0
    total, magic, crc, phys, sys_flag, body_len = _CHECK_HEAD.unpack_from(mv, pos)
    if magic != MESSAGE_MAGIC or total < FIXED_SIZE or total > limit - pos or (
            expected_phys is not None and phys != expected_phys):
        return 0
    fixed = FIXED_SIZE
    if sys_flag & 0x30:  # v6 hosts: BODYLEN moves
        extra = (12 if sys_flag & BORNHOST_V6_FLAG else 0) + (12 if sys_flag & STOREHOST_V6_FLAG else 0)
        fixed += extra
        if fixed > total:
            return 0
        body_len = INT32.unpack_from(mv, pos + POS_BODYLEN + extra)[0]
    p = pos + fixed - 3 + body_len  # TOPICLEN
    if body_len < 0 or fixed + body_len + 1 > total:
        return 0
    topic_len = mv[p]
    if topic_len == 0 or topic_len > MAX_TOPIC_LENGTH or fixed + body_len + topic_len > total or (
            INT16.unpack_from(mv, p + 1 + topic_len)[0] != total - fixed - body_len - topic_len):
        return 0
    if (zlib.crc32(mv[p - body_len:p]) & 0x7FFFFFFF) != crc:
        return 0
    return total


# ----------------------------------------------------------------------------- dispatch peek

class DispatchInfo(NamedTuple):
    """The fields dispatch needs, read without building a MessageExt."""

    size: int
    topic: bytes
    queue_id: int
    queue_offset: int
    sys_flag: int
    store_timestamp: int
    tags_code: int
    keys: bytes  # raw KEYS value (space separated), b"" when absent
    uniq_key: bytes  # b"" when absent


# TOTALSIZE, QUEUEID, QUEUEOFFSET, SYSFLAG, STORETIMESTAMP, BODYLEN of an IPv4 record in one read.
_PEEK_V4 = struct.Struct(">i8xi4xq8xi16xq20xi")
_DISPATCH_PROPS = re.compile(rb"(?:^|\x02)(TAGS|KEYS|UNIQ_KEY|DELAY)\x01([^\x02]*)")


def peek_head(mm: Buffer, pos: int, _unpack: Callable[[Buffer, int], tuple[Any, ...]] = _PEEK_V4.unpack_from
              ) -> tuple[int, bytes, int, int, int, int, bytes]:
    """(total size, topic, queue id, queue offset, sys flag, store time, raw properties) of a
    well-formed record at pos in an mmap, bytes or memoryview: the cheap half of a peek.
    CorruptRecordError when the body and topic lengths do not fit the total size."""
    total, queue_id, queue_offset, sys_flag, store_ts, body_len = _unpack(mm, pos)
    start = pos + 88
    if sys_flag & 0x30:  # BORNHOST_V6_FLAG | STOREHOST_V6_FLAG: later fields move
        extra = (12 if sys_flag & BORNHOST_V6_FLAG else 0) + (12 if sys_flag & STOREHOST_V6_FLAG else 0)
        if sys_flag & BORNHOST_V6_FLAG:
            store_ts = INT64.unpack_from(mm, pos + POS_STORETIMESTAMP + 12)[0]
        body_len = INT32.unpack_from(mm, pos + POS_BODYLEN + extra)[0]
        start += extra
    # tail = TOPICLEN, TOPIC, PROPLEN, PROPERTIES (whose length total already implies)
    tail = bytes(mm[start + body_len:pos + total]) if body_len >= 0 else b""
    topic_end = 1 + tail[0] if tail else 0
    if topic_end < 2 or topic_end + 2 > len(tail):
        raise CorruptRecordError(f"record lengths (body {body_len}) do not fit its size {total}", pos)
    return total, tail[1:topic_end], queue_id, queue_offset, sys_flag, store_ts, tail[topic_end + 2:]


def dispatch_properties(props: bytes, topic: bytes, store_ts: int, delay_levels_ms: tuple[int, ...] = (),
                        _findall: Callable[[bytes], list[tuple[bytes, bytes]]] = _DISPATCH_PROPS.findall,
                        _codes: Mapping[object, int] = _TAGS_CODES) -> tuple[int, bytes, bytes]:
    """(tags code, KEYS, UNIQ_KEY) from raw properties: the other half of a peek."""
    found = dict(_findall(props)) if props else {}
    tags = found.get(b"TAGS")
    code = (_codes.get(tags) or tags_code(tags)) if tags else 0
    if delay_levels_ms and b"DELAY" in found and topic == _SCHEDULE_TOPIC_BYTES:
        code = schedule_tags_code(found[b"DELAY"], store_ts, delay_levels_ms)
    return code, found.get(b"KEYS", b""), found.get(b"UNIQ_KEY", b"")


def peek_dispatch_fields(mm: Buffer, pos: int, delay_levels_ms: tuple[int, ...] = ()) -> tuple[Any, ...]:
    """peek_dispatch as a plain tuple in DispatchInfo's field order."""
    total, topic, queue_id, queue_offset, sys_flag, store_ts, props = peek_head(mm, pos)
    return (total, topic, queue_id, queue_offset, sys_flag, store_ts,
            *dispatch_properties(props, topic, store_ts, delay_levels_ms))


def peek_dispatch(mm: Buffer, pos: int = 0, delay_levels_ms: tuple[int, ...] = ()) -> DispatchInfo:
    """Dispatch fields of a well-formed record at pos, without building a MessageExt.
    For SCHEDULE_TOPIC_XXXX the tags code is the delivery time, as RocketMQ computes it."""
    return DispatchInfo(*peek_dispatch_fields(mm, pos, delay_levels_ms))


# ----------------------------------------------------------------------------- dispatch columns
# The same peek for a whole dispatch round at once, as a few numpy operations over a uint8
# view of a mapped file instead of Python work per record.

class DispatchColumns(NamedTuple):
    """peek_head's fields of many records, as int64 arrays (positions are in the file)."""

    size: _np.ndarray
    queue_id: _np.ndarray
    queue_offset: _np.ndarray
    sys_flag: _np.ndarray
    store_timestamp: _np.ndarray
    topic_start: _np.ndarray
    topic_len: _np.ndarray
    props_start: _np.ndarray
    props_end: _np.ndarray


class PropertyRows(NamedTuple):
    """Many records' properties in one uint8 buffer (see gather_properties)."""

    buf: _np.ndarray
    row_starts: _np.ndarray  # where each record's properties begin in buf
    lengths: _np.ndarray
    width: int  # rows are this far apart (0: packed, one after the other)


@functools.cache
def _head_v4() -> _np.dtype:
    """TOTALSIZE, QUEUEID, QUEUEOFFSET, SYSFLAG, STORETIMESTAMP, BODYLEN of an IPv4 record."""
    return _np.dtype({"names": ["size", "queue_id", "queue_offset", "sys_flag", "store_timestamp", "body_len"],
                      "formats": [">i4", ">i4", ">i8", ">i4", ">i8", ">i4"],
                      "offsets": [0, POS_QUEUEID, POS_QUEUEOFFSET, POS_SYSFLAG, POS_STORETIMESTAMP, POS_BODYLEN],
                      "itemsize": HEADER_V4_SIZE})


_PROPERTY_SEPARATOR = ord(PROPERTY_SEPARATOR)
_NAME_VALUE_SEPARATOR = ord(NAME_VALUE_SEPARATOR)
_KEY_SEPARATOR = ord(" ")
_PAD = 256  # bytes before and after the rows, so hash windows (<= 256 wide) stay in the buffer


def dispatch_columns(u8: _np.ndarray, positions: _np.ndarray, base: int = 0) -> DispatchColumns:
    """The dispatch fields of the well-formed records at positions (an int64 array) of a
    uint8 view of a mapped file starting at physical offset base. CorruptRecordError when a
    record's body and topic lengths do not fit its size."""
    rows = byte_rows(u8, positions, HEADER_V4_SIZE).view(_head_v4()).ravel()
    size = rows["size"].astype(_np.int64)
    sys_flag = rows["sys_flag"].astype(_np.int64)
    store_ts = rows["store_timestamp"].astype(_np.int64)
    body_at = positions + HEADER_V4_SIZE + rows["body_len"]
    for i in _np.flatnonzero(sys_flag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)).tolist():  # rare
        pos = int(positions[i])
        flag = int(sys_flag[i])
        born = 12 if flag & BORNHOST_V6_FLAG else 0
        extra = born + (12 if flag & STOREHOST_V6_FLAG else 0)
        store_ts[i] = INT64.unpack_from(u8, pos + POS_STORETIMESTAMP + born)[0]  # type: ignore[arg-type]  # a buffer
        body_len = INT32.unpack_from(u8, pos + POS_BODYLEN + extra)[0]  # type: ignore[arg-type]  # ndarray: a buffer
        body_at[i] = pos + HEADER_V4_SIZE + extra + body_len
    end = positions + size
    topic_len = u8.take(body_at, mode="clip").astype(_np.int64)
    props_start = body_at + topic_len + 3
    bad = (body_at < positions + HEADER_V4_SIZE) | (topic_len == 0) | (props_start > end)
    if bad.any():
        i = int(_np.argmax(bad))
        raise CorruptRecordError(f"record lengths do not fit its size {size[i]}", base + int(positions[i]))
    return DispatchColumns(size, rows["queue_id"].astype(_np.int64), rows["queue_offset"].astype(_np.int64),
                           sys_flag, store_ts, body_at + 1, topic_len, props_start, end)


def gather_properties(u8: _np.ndarray, starts: _np.ndarray, ends: _np.ndarray) -> PropertyRows:
    """The properties u8[starts[i]:ends[i]] of many records copied into one buffer, each
    followed by a \\x02 so no value runs into what follows. Usually as fixed-width rows (a
    row copy each; the bytes after a row's separator are left over from the file and never
    read as properties), when one record's long properties would make that wasteful as
    packed rows."""
    n = len(starts)
    lengths = ends - starts
    width = int(lengths.max()) + 1
    total = int(lengths.sum()) + n
    if n * width <= 2 * total + 4096:
        pad = -(-_PAD // width)
        edge = _np.full(pad, starts[0])
        rows = byte_rows(u8, _np.concatenate((edge, starts, edge)), width)
        rows[:pad] = 0
        rows[pad + n:] = 0
        row_starts = _np.arange(pad, pad + n) * width
        buf = rows.ravel()
    else:
        spans = lengths + 1
        row_starts = _PAD + _np.cumsum(spans) - spans
        buf = _np.zeros(total + 2 * _PAD, _np.uint8)
        idx = _np.arange(_PAD, _PAD + total, dtype=_np.int64) + _np.repeat(starts - row_starts, spans)
        buf[_PAD:_PAD + total] = u8.take(idx, mode="clip")
        width = 0
    buf[row_starts + lengths] = _PROPERTY_SEPARATOR
    return PropertyRows(buf, row_starts, lengths, width)


def property_values(props: PropertyRows, names: tuple[bytes, ...]) -> list[tuple]:
    """Per name (<= 8 bytes), (value start in buf, value length) int64 arrays with one row per
    record, start -1 when absent: what dict(_DISPATCH_PROPS.findall(props)) finds (a name
    right after a \\x02 or at the start, its value up to the next \\x02; the last one wins)."""
    buf, row_starts, lengths, width = props
    n = len(row_starts)
    eqs = _np.flatnonzero(buf == _NAME_VALUE_SEPARATOR)
    row = eqs // width - int(row_starts[0]) // width if width else _np.searchsorted(row_starts, eqs, "right") - 1
    col = eqs - row_starts[row]
    inside = col < lengths[row]  # not a left-over byte after a row's separator (the pads hold zeros)
    if not inside.all():
        eqs, row, col = eqs[inside], row[inside], col[inside]
    # the 8 bytes before each \x01 as one integer (a view of buf with an 8-byte item at every byte)
    tail = _np.ndarray((len(buf) - 7,), ">u8", buf, strides=(1,))[eqs - 8]
    seps = None
    out = []
    for name in names:
        size = len(name)
        start = _np.full(n, -1, _np.int64)
        length = _np.zeros(n, _np.int64)
        hit = _np.flatnonzero(((tail & _np.uint64((1 << 8 * size) - 1)) == int.from_bytes(name, "big")) & (col >= size))
        if len(hit):
            # the name must start its segment: at the row's start or after a \x02 (a name with
            # a \x01 in it never equals one of ours, so a hit is its segment's first \x01)
            hit = hit[(col[hit] == size) | (buf[eqs[hit] - size - 1] == _PROPERTY_SEPARATOR)]
        if len(hit):
            rows = row[hit]
            if len(rows) > 1:
                last = _np.append(rows[1:] != rows[:-1], True)  # the last occurrence in a row wins
                hit, rows = hit[last], rows[last]
            if seps is None:
                seps = _np.flatnonzero(buf == _PROPERTY_SEPARATOR)
            at = eqs[hit]
            start[rows] = at + 1
            length[rows] = seps[_np.searchsorted(seps, at)] - at - 1  # up to the next \x02
        out.append((start, length))
    return out


def key_tokens(buf: _np.ndarray, starts: _np.ndarray,
               lengths: _np.ndarray) -> tuple[_np.ndarray, _np.ndarray, _np.ndarray]:
    """(row, token start, token length) of the non-empty space-separated tokens of each row's
    KEYS value buf[start:start + length] (rows without one have length 0), in row order."""
    rows = _np.flatnonzero(lengths > 0)
    first = starts[rows]
    end = first + lengths[rows]
    spaces = _np.flatnonzero(buf == _KEY_SEPARATOR)
    owner = _np.searchsorted(first, spaces, "right") - 1
    inner = owner >= 0
    inner[inner] = spaces[inner] < end[owner[inner]]
    # boundaries in position order: before each value, its inner spaces, its end
    where = _np.concatenate((first - 1, spaces[inner], end))
    owners = _np.concatenate((_np.arange(len(rows)), owner[inner], _np.arange(len(rows))))
    is_end = _np.concatenate((_np.zeros(len(rows) + int(inner.sum()), bool), _np.ones(len(rows), bool)))
    order = _np.argsort(where, kind="stable")
    where, owners, is_end = where[order], owners[order], is_end[order]
    token_start = where[:-1] + 1
    token_len = where[1:] - token_start
    keep = ~is_end[:-1] & (token_len > 0)
    return rows[owners[:-1][keep]], token_start[keep], token_len[keep]


def schedule_tags_code(delay: bytes, store_ts: int, delay_levels_ms: tuple[int, ...]) -> int:
    """CommitLog.computeDeliverTimestamp: store time + the level's delay (level capped)."""
    try:
        level = int(delay)
    except ValueError:
        return store_ts
    if level <= 0:
        return store_ts
    return store_ts + delay_levels_ms[min(level, len(delay_levels_ms)) - 1]


def parse_delay_levels(spec: str) -> tuple[int, ...]:
    """'1s 5s 1m 2h' -> delays in ms."""
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    return tuple(int(tok[:-1]) * units[tok[-1]] for tok in spec.split())


def store_timestamp_at(mv: Buffer, pos: int) -> int:
    """STORETIMESTAMP of the record at pos (honours a v6 born host)."""
    sys_flag = INT32.unpack_from(mv, pos + POS_SYSFLAG)[0]
    return INT64.unpack_from(mv, pos + (POS_STORETIMESTAMP + 12 if sys_flag & BORNHOST_V6_FLAG
                                        else POS_STORETIMESTAMP))[0]


# ----------------------------------------------------------------------------- SEND_BATCH body

_BATCH_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGIC(0), BODYCRC(0), FLAG, BODYLEN


class BatchItem(NamedTuple):
    body: bytes
    flag: int
    properties: bytes  # encoded properties string


def encode_batch_body(items: list[BatchItem] | list[tuple[bytes, int, bytes]]) -> bytes:
    """MessageDecoder.encodeMessages: what a producer sends as SEND_BATCH_MESSAGE's body."""
    parts = []
    for body, flag, props in items:
        parts.append(_BATCH_HEAD.pack(22 + len(body) + len(props), 0, 0, flag, len(body)))
        parts.append(body)
        parts.append(INT16.pack(len(props)))
        parts.append(props)
    return b"".join(parts)


def decode_batch_body(data: Buffer) -> list[BatchItem]:
    """Split a SEND_BATCH body; malformed input raises CorruptRecordError."""
    mv = memoryview(data)
    out: list[BatchItem] = []
    pos = 0
    end = len(mv)
    while pos < end:
        if end - pos < 22:
            raise CorruptRecordError("truncated batch item", pos)
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(mv, pos)
        if body_len < 0 or total < 22 + body_len or pos + total > end:
            raise CorruptRecordError(f"bad batch item sizes (total {total}, body {body_len})", pos)
        p = pos + 20
        body = bytes(mv[p:p + body_len])
        p += body_len
        props_len = INT16.unpack_from(mv, p)[0]
        if props_len < 0 or 22 + body_len + props_len != total:
            raise CorruptRecordError(f"bad batch item properties length {props_len}", pos)
        out.append(BatchItem(body, flag, bytes(mv[p + 2:p + 2 + props_len])))
        pos += total
    return out
