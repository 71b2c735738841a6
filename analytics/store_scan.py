"""Read-only scanning of CommitLog files for analytics, without Spark.

A live broker may be appending to the newest file while we read it, and a crashed one may
have left a torn record. So a file is read as recovery reads it: record by record, while
each record is complete and valid (the codec's check_record: magic, lengths, body CRC and
its own PHYSICALOFFSET) and already stamped by the writer (the commit actor copies a record
in, then patches offsets and store time: a zero store time means "not finished yet"). A
BLANK filler ends the file. Files are opened O_RDONLY and mapped read-only: a scan never
writes to the store.

Work is split into spans: each CommitLog file, and within a file every ``split_bytes``
(so one 1 GiB file still feeds many cores). A span after the first starts at the first
valid record at or after its nominal offset; since a record must carry its own physical
offset and body CRC, a stray match inside another record's body is not taken for a record.
Spans are found at planning time, which also reads each span's first store timestamp for
time pruning: store time is non-decreasing along the CommitLog (the SmartGo writer
guarantees it; a Java broker stamps outside its put lock, so ``skew_ms`` of slack).
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from smartgo.store.mapped_file import segment_name, segment_starts
from smartgo.store.record import (
    BLANK_MAGIC, BORNHOST_V6_FLAG, HEADER, HEADER_V4_SIZE, INT32, MESSAGE_MAGIC, SIZE_MAGIC, STOREHOST_V6_FLAG,
    MessageExt, check_record, create_offset_msg_id, decode_properties, decode_record, store_timestamp_at,
    unpack_host,
)

log = logging.getLogger("smartgo.analytics.store_scan")

DEFAULT_SKEW_MS = 60_000
DEFAULT_SPLIT_BYTES = 32 << 20
CHUNK_ROWS = 16_384
CHUNK_BODY_BYTES = 64 << 20
NO_LIMIT = (1 << 63) - 1
_MAGIC_BYTES = INT32.pack(MESSAGE_MAGIC)
_V6_HOSTS = BORNHOST_V6_FLAG | STOREHOST_V6_FLAG

# Row layout yielded by scan_span (the data source turns columns of these into Arrow).
ROW_FIELDS = ("topic", "queue_id", "queue_offset", "commit_log_offset", "properties", "born_timestamp",
              "store_timestamp", "born_host", "store_host", "body_size", "msg_id", "reconsume_times",
              "sys_flag", "flag", "body")


@dataclass(frozen=True, slots=True)
class Span:
    """Records of one CommitLog file from byte ``begin`` (a record start) up to ``end`` (the
    next span's first record; None: to the end of the data)."""

    path: str
    file_start: int  # physical offset of the file (its name)
    begin: int
    end: int | None
    first_store_ts: int | None  # None: no complete record at begin (yet)


@dataclass(frozen=True, slots=True)
class ScanFilter:
    """Which records a scan yields: topics (None = all) and store time in [since, until)."""

    topics: frozenset[str] | None = None
    since_ms: int = 0
    until_ms: int = NO_LIMIT
    skew_ms: int = DEFAULT_SKEW_MS


@dataclass(frozen=True, slots=True)
class Wanted:
    """Which costly parts of a record a scan decodes (unwanted ones come back empty)."""

    properties: bool = True
    msg_id: bool = True
    body: bool = False


def commitlog_dir(path: str | os.PathLike) -> Path:
    """The CommitLog folder of a store root (``<root>/commitlog``), or path itself when it is
    already one. FileNotFoundError when neither holds CommitLog files."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"store directory {root} does not exist")
    if (root / "commitlog").is_dir():
        return root / "commitlog"
    if segment_starts(root):
        return root
    raise FileNotFoundError(f"{root} is neither a store directory (no commitlog/ inside) nor a CommitLog folder")


def _map_readonly(path: str) -> mmap.mmap | None:
    """A read-only mapping of the whole file as it is now (None when empty or gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        log.warning("CommitLog file %s disappeared (cleanup?) before it was read", path)
        return None
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
    finally:
        os.close(fd)


def _complete_at(mv: memoryview, pos: int, file_start: int) -> int:
    """Store time of the complete, stamped record at pos, else 0."""
    if not check_record(mv, pos, len(mv), file_start + pos):
        return 0
    return store_timestamp_at(mv, pos)


def _resync(mm: mmap.mmap, mv: memoryview, file_start: int, pos: int, stop: int) -> tuple[int, int] | None:
    """(offset, store time) of the first complete record starting in [pos, stop)."""
    i = mm.find(_MAGIC_BYTES, pos + 4, stop + 8)
    while i != -1:
        ts = _complete_at(mv, i - 4, file_start)
        if ts:
            return i - 4, ts
        i = mm.find(_MAGIC_BYTES, i + 1, stop + 8)
    return None


def file_spans(path: str, file_start: int, split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Span]:
    """The spans of one CommitLog file: [0, ...), then one per split_bytes window in which a
    record starts. The first window without one ends the search: that is the end of the
    data (a preallocated file is zeros after it, which need not be read) or a record longer
    than a window, which the previous span then reads through."""
    mm = _map_readonly(path)
    if mm is None:
        return []
    mv = memoryview(mm)
    try:
        starts = [(0, _complete_at(mv, 0, file_start) or None)]
        for nominal in range(split_bytes, len(mm), split_bytes):
            if nominal <= starts[-1][0]:
                continue
            found = _resync(mm, mv, file_start, nominal, nominal + split_bytes)
            if found is None:
                break
            starts.append(found)
    finally:
        mv.release()
        mm.close()
    ends = [s[0] for s in starts[1:]] + [None]
    return [Span(path, file_start, begin, end, ts) for (begin, ts), end in zip(starts, ends)]


def list_spans(store_dir: str | os.PathLike, split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Span]:
    """Every span of a store's CommitLog, in log order."""
    directory = commitlog_dir(store_dir)
    spans: list[Span] = []
    for start in segment_starts(directory):
        spans.extend(file_spans(str(directory / segment_name(start)), start, split_bytes))
    return spans


def prune(spans: list[Span], flt: ScanFilter) -> list[Span]:
    """Drop spans that cannot hold a record in [since, until): one whose first record is
    already past ``until``, or one whose successor starts before ``since``."""
    kept = []
    for i, span in enumerate(spans):
        if span.first_store_ts is not None and span.first_store_ts - flt.skew_ms >= flt.until_ms:
            continue
        nxt = spans[i + 1].first_store_ts if i + 1 < len(spans) else None
        if nxt is not None and nxt + flt.skew_ms < flt.since_ms:
            continue
        kept.append(span)
    return kept


def scan_span(span: Span, flt: ScanFilter = ScanFilter(), wanted: Wanted = Wanted(), *,
              max_rows: int = CHUNK_ROWS, max_body_bytes: int = CHUNK_BODY_BYTES) -> Iterator[list[tuple]]:
    """The complete records of a span that pass ``flt``, in log order, in chunks of at most
    max_rows tuples in ROW_FIELDS order (hosts as "ip:port"; properties {}, msg_id "" and
    body None when not wanted); with bodies, a chunk also ends past max_body_bytes."""
    mm = _map_readonly(span.path)
    if mm is None:
        return
    mv = memoryview(mm)
    try:
        yield from _walk(mm, mv, span, flt, wanted, max_rows, max_body_bytes)
    finally:
        mv.release()
        mm.close()


def _walk(mm: mmap.mmap, mv: memoryview, span: Span, flt: ScanFilter, wanted: Wanted, max_rows: int,
          max_body_bytes: int) -> Iterator[list[tuple]]:
    """IPv4 records (all SmartGo writes) are read with the codec's HEADER struct in one call
    and their properties with decode_properties: 3x faster than building a MessageExt,
    which stays the path for IPv6 hosts. Rows are handed over in chunks: a generator step
    per record would cost a tenth of the scan."""
    base = span.file_start
    size = len(mm)
    limit = size if span.end is None else min(span.end, size)
    topics = flt.topics
    since, until = flt.since_ms, flt.until_ms
    stop_after = until + flt.skew_ms if until < NO_LIMIT - flt.skew_ms else NO_LIMIT
    with_props, with_id, with_body = wanted.properties, wanted.msg_id, wanted.body
    unpack_header = HEADER.unpack_from
    names: dict[bytes, str] = {}
    hosts: dict[bytes, str] = {}
    rows: list[tuple] = []
    append = rows.append
    body_bytes = 0
    pos = span.begin
    while pos < limit:
        total = check_record(mv, pos, size, base + pos)
        if not total:
            _log_end(mm, base, pos)
            break
        (_, _, _, queue_id, flag, queue_offset, phys, sys_flag, born_ts, born_raw, store_ts, store_raw,
         reconsume, _, body_len) = unpack_header(mm, pos)
        end = pos + total
        if sys_flag & _V6_HOSTS:
            row = _row_from_ext(decode_record(mv, pos), wanted)
            store_ts = row[6]
        else:
            row = None
        if store_ts == 0:
            break  # copied in but not stamped yet: the writer is still at it
        if not since <= store_ts < until:
            if store_ts >= stop_after:
                break
            pos = end
            continue
        if row is None:
            p = pos + HEADER_V4_SIZE + body_len
            topic_end = p + 1 + mm[p]
            raw = mm[p + 1:topic_end]
            topic = names.get(raw)
            if topic is None:
                topic = names[raw] = raw.decode("utf-8", "replace")
            if topics is not None and topic not in topics:
                pos = end
                continue
            row = (topic, queue_id, queue_offset, phys,
                   decode_properties(mm[topic_end + 2:end]) if with_props and topic_end + 2 < end else {},
                   born_ts, store_ts, hosts.get(born_raw) or _host(hosts, born_raw),
                   hosts.get(store_raw) or _host(hosts, store_raw), body_len,
                   create_offset_msg_id(store_raw, phys) if with_id else "", reconsume, sys_flag, flag,
                   mm[pos + HEADER_V4_SIZE:p] if with_body else None)
        elif topics is not None and row[0] not in topics:
            pos = end
            continue
        pos = end
        append(row)
        if with_body:
            body_bytes += row[9]
        if len(rows) >= max_rows or body_bytes >= max_body_bytes:
            yield rows
            rows = []
            append = rows.append
            body_bytes = 0
    if rows:
        yield rows


def _log_end(mm: mmap.mmap, base: int, pos: int) -> None:
    """Say why the data ends at pos, unless it is the normal end (a filler, or zeros)."""
    if pos + 8 > len(mm):
        return
    total, magic = SIZE_MAGIC.unpack_from(mm, pos)
    if magic != BLANK_MAGIC and (total or magic):
        log.info("CommitLog %s: data ends at %d (torn or incomplete record)", segment_name(base), base + pos)


def _host(cache: dict[bytes, str], raw: bytes) -> str:
    text = cache[raw] = format_host(unpack_host(raw))
    return text


def format_host(host: tuple[str, int]) -> str:
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _row_from_ext(msg: MessageExt, wanted: Wanted) -> tuple:
    return (msg.topic, msg.queue_id, msg.queue_offset, msg.commit_log_offset, msg.properties, msg.born_timestamp,
            msg.store_timestamp, format_host(msg.born_host), format_host(msg.store_host), len(msg.body),
            msg.msg_id, msg.reconsume_times, msg.sys_flag, msg.flag, msg.body if wanted.body else None)
