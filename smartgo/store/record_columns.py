"""Columnar decoding of CommitLog records: a span of a mapped file in, numpy columns out.

decode_record (record.py) builds one MessageExt per call, which a scan over millions of
records cannot afford. read_records gives the same fields for every complete record of a
span as int64 arrays: it follows TOTALSIZE from record to record (the one sequential step),
gathers each fixed field of all records at once, and checks the records as check_record
does (magic, lengths, their own PHYSICALOFFSET, body CRC) plus a set store timestamp (the
commit actor copies a record in before it stamps it). The records returned are the leading
complete ones; the first one that is not (a torn tail, a BLANK filler, zeros, garbage, an
unstamped record) ends the data.

Variable parts stay where they are, as positions in the file: body, topic, properties.
properties() parses many records' properties at once, with decode_properties' rules, into
(name, value) spans of one buffer; topics(), hosts() and msg_ids() give the rest of the text.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

import numpy as np

from smartgo.store.java_hash import byte_rows
from smartgo.store.record import (
    BORNHOST_V6_FLAG, FIXED_SIZE, INT32, MAX_TOPIC_LENGTH, MESSAGE_MAGIC, NAME_VALUE_SEPARATOR, POS_BODY,
    POS_BODYCRC, POS_BODYLEN, POS_BORNHOST, POS_BORNTIMESTAMP, POS_FLAG, POS_MAGIC, POS_PHYSICALOFFSET,
    POS_PREPAREDTXOFFSET, POS_QUEUEID, POS_QUEUEOFFSET, POS_RECONSUMETIMES, POS_STOREHOST, POS_STORETIMESTAMP,
    POS_SYSFLAG, PROPERTY_SEPARATOR, STOREHOST_V6_FLAG, PropertyRows, decode_properties, encode_properties,
    gather_properties, unpack_host,
)

V6_EXTRA = 12  # a 16-byte address where IPv4 has 4
DEFAULT_MAX_RECORDS = 32_768
DEFAULT_MAX_BYTES = 64 << 20
_SEPARATOR = ord(PROPERTY_SEPARATOR)
_NAME_END = ord(NAME_VALUE_SEPARATOR)
_HEX = np.frombuffer(b"".join(b"%02X" % i for i in range(256)), np.uint16)  # byte -> its two hex digits
_NONE = np.zeros(0, np.int64)


class RecordColumns(NamedTuple):
    """Fields of many records, an int64 array each; positions are indexes into the file."""

    position: np.ndarray
    size: np.ndarray
    body_crc: np.ndarray
    queue_id: np.ndarray
    flag: np.ndarray
    queue_offset: np.ndarray
    commit_log_offset: np.ndarray
    sys_flag: np.ndarray
    born_timestamp: np.ndarray
    store_timestamp: np.ndarray
    reconsume_times: np.ndarray
    prepared_transaction_offset: np.ndarray
    born_host_at: np.ndarray  # a 4-byte address (16 with BORNHOST_V6_FLAG) and an int32 port
    store_host_at: np.ndarray  # the same with STOREHOST_V6_FLAG
    body_at: np.ndarray
    body_len: np.ndarray
    topic_at: np.ndarray
    topic_len: np.ndarray
    props_at: np.ndarray
    props_end: np.ndarray

    def select(self, rows: np.ndarray | slice) -> RecordColumns:
        """The records at rows (an index array, a boolean mask or a slice)."""
        return RecordColumns(*(c[rows] for c in self))


class Records(NamedTuple):
    columns: RecordColumns
    end: int  # where the record after the last one returned starts
    ended: bool  # the data ends at `end`: no complete record starts there


def read_records(u8: np.ndarray, begin: int, stop: int, base: int = 0, *, max_records: int = DEFAULT_MAX_RECORDS,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> Records:
    """The complete records that start in [begin, stop) of u8, a uint8 view of a whole
    CommitLog file whose first byte is physical offset base; begin is a record start (0, or
    the end of a previous call). At most max_records, none starting max_bytes or more after
    begin: the rest comes from a call at ``end``, unless ``ended``."""
    starts, end, bad = _walk(u8.data, begin, min(stop, begin + max_bytes), len(u8), max_records)
    cols, magic, props_len = _columns(u8, np.array(starts, np.int64))
    ok = _complete(u8, cols, magic, props_len, base)
    if not ok.all():
        first_bad = int(np.argmin(ok))
        return Records(cols.select(slice(0, first_bad)), starts[first_bad], True)
    return Records(cols, end, bad)


def _walk(mv: memoryview, pos: int, stop: int, limit: int, max_records: int) -> tuple[list[int], int, bool]:
    """(record starts from pos while they are below stop, where the walk ended, whether it
    ended at something that cannot be a record: a size below FIXED_SIZE or past limit)."""
    starts: list[int] = []
    append = starts.append
    unpack = INT32.unpack_from
    last = limit - FIXED_SIZE
    for _ in range(max_records):
        if pos >= stop:
            return starts, pos, False
        if pos > last:
            return starts, pos, True
        total = unpack(mv, pos)[0]
        if total < FIXED_SIZE or total > limit - pos:
            return starts, pos, True
        append(pos)
        pos += total
    return starts, pos, False


def _ints(u8: np.ndarray, dtype: str) -> np.ndarray:
    """u8 as big-endian integers of dtype starting at every byte: index it with positions."""
    width = np.dtype(dtype).itemsize
    return np.ndarray((max(len(u8) - width + 1, 0),), dtype, u8, strides=(1,))


def _columns(u8: np.ndarray, at: np.ndarray) -> tuple[RecordColumns, np.ndarray, np.ndarray]:
    """The fields of the records at `at` (each at least FIXED_SIZE bytes inside u8), their
    MAGIC and PROPERTIESLENGTH. Nothing is checked: a field a bad length would put outside
    u8 is read from inside it instead, for _complete to reject."""
    i2, i4, i8 = _ints(u8, ">i2"), _ints(u8, ">i4"), _ints(u8, ">i8")
    last = len(u8) - POS_BODY
    sys_flag = i4[at + POS_SYSFLAG]
    mid = tail = at  # where STORETIMESTAMP.. and RECONSUMETIMES.. are read from (moved by v6 hosts)
    if (sys_flag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)).any():
        mid = at + np.where(sys_flag & BORNHOST_V6_FLAG, V6_EXTRA, 0)
        tail = mid + np.where(sys_flag & STOREHOST_V6_FLAG, V6_EXTRA, 0)
        mid_in, tail_in = np.minimum(mid, last), np.minimum(tail, last)
    else:
        mid_in = tail_in = at
    body_len = i4[tail_in + POS_BODYLEN].astype(np.int64)
    body_at = tail + POS_BODY
    topic_at = body_at + body_len + 1
    topic_len = u8[np.minimum(np.maximum(topic_at - 1, 0), len(u8) - 1)].astype(np.int64)
    props_at = topic_at + topic_len + 2
    size = i4[at].astype(np.int64)
    cols = RecordColumns(
        at, size, i4[at + POS_BODYCRC], i4[at + POS_QUEUEID], i4[at + POS_FLAG], i8[at + POS_QUEUEOFFSET],
        i8[at + POS_PHYSICALOFFSET], sys_flag, i8[at + POS_BORNTIMESTAMP], i8[mid_in + POS_STORETIMESTAMP],
        i4[tail_in + POS_RECONSUMETIMES], i8[tail_in + POS_PREPAREDTXOFFSET], at + POS_BORNHOST, mid + POS_STOREHOST,
        body_at, body_len, topic_at, topic_len, props_at, at + size)
    cols = RecordColumns(*(c.astype(np.int64, copy=False) for c in cols))  # native byte order
    props_len = i2[np.minimum(np.maximum(props_at - 2, 0), len(i2) - 1)].astype(np.int64)
    return cols, i4[at + POS_MAGIC], props_len


def _complete(u8: np.ndarray, cols: RecordColumns, magic: np.ndarray, props_len: np.ndarray,
              base: int) -> np.ndarray:
    """check_record of every record (magic, lengths, own physical offset, body CRC) and a
    set store timestamp; the CRC only up to the first record that fails the rest."""
    ok = ((magic == MESSAGE_MAGIC) & (cols.commit_log_offset == cols.position + base) & (cols.body_len >= 0)
          & (cols.topic_len > 0) & (cols.topic_len <= MAX_TOPIC_LENGTH) & (props_len >= 0)
          & (props_len == cols.props_end - cols.props_at)
          & (cols.store_timestamp != 0))
    checked = len(ok) if ok.all() else int(np.argmin(ok))
    if checked:
        mv = u8.data
        body_at = cols.body_at[:checked]
        crc = np.fromiter(map(zlib.crc32, map(mv.__getitem__, map(slice, body_at.tolist(),
                                                                       (body_at + cols.body_len[:checked]).tolist()))),
                          np.int64, checked)
        ok[:checked] &= (crc & 0x7FFFFFFF) == cols.body_crc[:checked]
    return ok


# ----------------------------------------------------------------------------- text

def distinct_spans(u8: np.ndarray, at: np.ndarray, length: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """The distinct byte strings among u8[at[i]:at[i] + length[i]] (each under 256 bytes),
    and the index of each span's string. Records come in runs of one topic or host, so only
    the first of each run is compared with the others."""
    n = len(at)
    if n == 0:
        return [], _NONE
    width = int(length.max())
    keys = np.zeros((n, (width + 8) // 8 * 8), np.uint8)  # length, the bytes, zeros: 8-byte words
    keys[:, 0] = length
    if width:
        keys[:, 1:width + 1] = byte_rows(u8, at, width)
        if not (length == width).all():
            keys[:, 1:width + 1][np.arange(width) >= length[:, None]] = 0
    words = keys.view(np.uint64)
    starts_run = np.ones(n, bool)
    starts_run[1:] = (words[1:] != words[:-1]).any(axis=1)
    firsts = np.flatnonzero(starts_run)
    if len(firsts) <= 64:  # the usual case: a dict is cheaper than a sort
        seen: dict[bytes, int] = {}
        run_index = np.array([seen.setdefault(w, len(seen)) for w in map(bytes, words[firsts])], np.int64)
        first = firsts[np.unique(run_index, return_index=True)[1]]
    else:
        _, first, run_index = np.unique(words[firsts], axis=0, return_index=True, return_inverse=True)
        first = firsts[first]
    values = [u8[s:s + k].tobytes() for s, k in zip(at[first].tolist(), length[first].tolist())]
    return values, run_index.ravel()[np.cumsum(starts_run) - 1]


def topics(u8: np.ndarray, cols: RecordColumns) -> tuple[list[str], np.ndarray]:
    """(distinct topics, each record's index into them), decoded as decode_record does."""
    raw, index = distinct_spans(u8, cols.topic_at, cols.topic_len)
    return [t.decode("utf-8", "replace") for t in raw], index


def hosts(u8: np.ndarray, at: np.ndarray, sys_flag: np.ndarray, v6_flag: int) -> tuple[list[tuple[str, int]],
                                                                                       np.ndarray]:
    """(distinct (ip, port) hosts, each record's index into them) of the BORNHOST fields
    (at=born_host_at, v6_flag=BORNHOST_V6_FLAG) or the STOREHOST fields."""
    raw, index = distinct_spans(u8, at, np.where(sys_flag & v6_flag, 20, 8))
    return [unpack_host(h) for h in raw], index


def msg_ids(u8: np.ndarray, cols: RecordColumns) -> tuple[np.ndarray, np.ndarray]:
    """Every record's offsetMsgId (create_offset_msg_id) as ASCII in one uint8 array, and
    the n + 1 offsets of the ids in it (32 characters each, 56 with an IPv6 store host)."""
    n = len(cols.position)
    v6 = (cols.sys_flag & STOREHOST_V6_FLAG) != 0
    phys = cols.commit_log_offset.astype(">i8").view(np.uint8).reshape(n, 8)
    if not v6.any():
        raw = np.concatenate((byte_rows(u8, cols.store_host_at, 8), phys), axis=1)
        return _HEX[raw].view(np.uint8).ravel(), np.arange(n + 1, dtype=np.int64) * 32
    raw = np.zeros((n, 28), np.uint8)
    v4 = ~v6
    raw[v4, :8] = byte_rows(u8, cols.store_host_at[v4], 8)
    raw[v4, 8:16] = phys[v4]
    raw[v6, :20] = byte_rows(u8, cols.store_host_at[v6], 20)
    raw[v6, 20:] = phys[v6]
    length = np.where(v6, 56, 32)
    text = _HEX[raw].view(np.uint8)[np.arange(56) < length[:, None]]
    return text, np.concatenate(([0], np.cumsum(length)))


class Properties(NamedTuple):
    """decode_properties of many records as spans of one buffer: entry i is the name
    buf[key_at[i]:+key_len[i]] and value buf[value_at[i]:+value_len[i]] of record row[i];
    record r's entries are offsets[r]:offsets[r + 1], in its dict's order."""

    buf: np.ndarray
    offsets: np.ndarray
    row: np.ndarray
    key_at: np.ndarray
    key_len: np.ndarray
    value_at: np.ndarray
    value_len: np.ndarray

    def find(self, *names: bytes) -> list[np.ndarray]:
        """Per name, each record's index of the entry called so, -1 when it has none."""
        prefix = _name_prefixes(self)
        out = []
        for name in names:
            found = np.full(len(self.offsets) - 1, -1, np.int64)
            hit = (self.key_len == len(name)) & (prefix == _prefix(name))
            if len(name) > 8 and hit.any():
                hit[hit] = (byte_rows(self.buf, self.key_at[hit], len(name)) == np.frombuffer(name, np.uint8)).all(1)
            hit = np.flatnonzero(hit)
            found[self.row[hit]] = hit
            out.append(found)
        return out


def _prefix(name: bytes) -> int:
    return int.from_bytes(name[:8], "big")


def _name_prefixes(props: Properties) -> np.ndarray:
    """The first (up to) 8 bytes of every entry's name as one integer (the buffer has room
    after its last row, so an 8-byte read never leaves it)."""
    return _ints(props.buf, ">u8")[props.key_at] >> (8 * (8 - np.minimum(props.key_len, 8))).astype(np.uint64)


def properties(u8: np.ndarray, cols: RecordColumns) -> Properties:
    """The properties of every record, exactly as decode_properties reads them: segments
    split at \\x02, a name up to the first \\x01, empty names and values skipped, the last
    value of a repeated name kept, invalid UTF-8 replaced. Records where it matters (a name
    that may repeat, bytes that are not UTF-8) go through decode_properties itself."""
    n = len(cols.position)
    if n == 0:
        return Properties(np.zeros(0, np.uint8), np.zeros(1, np.int64), *([_NONE] * 5))
    rows = gather_properties(u8, cols.props_at, cols.props_end)
    props = _segments(rows)
    irregular = _irregular(rows, props)
    if len(irregular):
        props = _segments(_regularized(rows, irregular))
    return props


def _row_of(rows: PropertyRows, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, inside) of buffer positions: inside is False past a row's \\x02 terminator."""
    buf, row_starts, lengths, width = rows
    if width:
        row = pos // width - int(row_starts[0]) // width
    else:
        row = np.searchsorted(row_starts, pos, "right") - 1
    row = np.minimum(np.maximum(row, 0), len(row_starts) - 1)
    col = pos - row_starts[row]
    return row, (col >= 0) & (col <= lengths[row])


def _segments(rows: PropertyRows) -> Properties:
    """Every name\\x01value segment with a non-empty name and value, in buffer order. Found
    from the \\x01 and \\x02 bytes of all rows in one pass: a segment's name ends at the first
    of them after the previous \\x02, if that one is a \\x01."""
    buf, row_starts, _, _ = rows
    special = np.flatnonzero((buf - 1) <= _SEPARATOR - 1)  # \x01 or \x02 (0 wraps to 255)
    row, inside = _row_of(rows, special)
    if not inside.all():
        special, row = special[inside], row[inside]
    sep_index = np.flatnonzero(buf[special] == _SEPARATOR)  # each row ends with one
    seps, row = special[sep_index], row[sep_index]
    first = np.ones(len(seps), bool)
    first[1:] = row[1:] != row[:-1]
    seg_at = np.where(first, row_starts[row], np.concatenate(([0], seps[:-1] + 1)))
    after_previous = np.concatenate(([0], sep_index[:-1] + 1))
    eq = special[np.minimum(after_previous, len(special) - 1)]
    valid = (after_previous < sep_index) & (eq > seg_at) & (eq + 1 < seps)
    row, seg_at, eq, seps = row[valid], seg_at[valid], eq[valid], seps[valid]
    offsets = np.zeros(len(row_starts) + 1, np.int64)
    np.cumsum(np.bincount(row, minlength=len(row_starts)), out=offsets[1:])
    return Properties(buf, offsets, row, seg_at, eq - seg_at, eq + 1, seps - eq - 1)


def _irregular(rows: PropertyRows, props: Properties) -> np.ndarray:
    """Rows the byte-level parse may get wrong: bytes that are not UTF-8, or two names of
    one row with equal length, first 8 and last 8 bytes (a false alarm only costs time)."""
    bad = []
    high = np.flatnonzero(rows.buf >= 0x80)
    if len(high):
        row, inside = _row_of(rows, high)
        for r in np.unique(row[inside]).tolist():
            start = int(rows.row_starts[r])
            try:
                rows.buf[start:start + int(rows.lengths[r])].tobytes().decode("utf-8")
            except UnicodeDecodeError:
                bad.append(r)
    counts = np.diff(props.offsets)
    if len(counts) and counts.max() > 1:
        row, length = props.row, props.key_len
        prefix = _name_prefixes(props)
        suffix = np.where(length > 8, _ints(props.buf, ">u8")[props.key_at + length - 8], 0)
        if counts.max() > 8:  # many names in a row: sort them instead of comparing neighbours
            order = np.lexsort((suffix, prefix, length, row))
            row, length, prefix, suffix = row[order], length[order], prefix[order], suffix[order]
            distances: tuple[int, ...] | range = (1,)
        else:
            distances = range(1, int(counts.max()))
        for d in distances:
            same = (row[d:] == row[:-d]) & (length[d:] == length[:-d]) & (prefix[d:] == prefix[:-d]) & (
                suffix[d:] == suffix[:-d])
            bad.extend(row[d:][same].tolist())
    return np.unique(np.array(bad, np.int64))
def _regularized(rows: PropertyRows, irregular: np.ndarray) -> PropertyRows:
    """rows with each irregular row replaced by its decode_properties dict, re-encoded."""
    texts = []
    for r in irregular.tolist():
        start = int(rows.row_starts[r])
        texts.append(encode_properties(decode_properties(rows.buf[start:start + int(rows.lengths[r])])))
    source = np.concatenate((rows.buf, np.frombuffer(b"".join(texts), np.uint8)))
    length = np.fromiter(map(len, texts), np.int64, len(texts))
    starts = rows.row_starts.copy()
    ends = starts + rows.lengths
    starts[irregular] = len(rows.buf) + np.cumsum(length) - length
    ends[irregular] = starts[irregular] + length
    return gather_properties(source, starts, ends)
