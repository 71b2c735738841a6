"""Read-only scanning of CommitLog files for analytics, without Spark.

A live broker may be appending to the newest file while we read it, and a crashed one may
have left a torn record. So a file is read as recovery reads it: record by record, while
each record is complete and valid (magic, lengths, body CRC and its own PHYSICALOFFSET, as
the codec's check_record tests them) and already stamped by the writer (the commit actor
copies a record in, then patches offsets and store time: a zero store time means "not
finished yet"). A BLANK filler ends the file. Files are opened O_RDONLY and mapped
read-only: a scan never writes to the store. The records themselves are decoded in
columns, many at a time, by the store's smartgo.store.record_columns.

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
from typing import NamedTuple

import numpy as np

from smartgo.store.mapped_file import segment_name, segment_starts
from smartgo.store.record import BLANK_MAGIC, INT32, MESSAGE_MAGIC, SIZE_MAGIC, check_record, store_timestamp_at
from smartgo.store.record_columns import RecordColumns, read_records, topics

log = logging.getLogger("smartgo.analytics.store_scan")

DEFAULT_SKEW_MS = 60_000
DEFAULT_SPLIT_BYTES = 32 << 20
CHUNK_ROWS = 32_768
CHUNK_BYTES = 64 << 20
NO_LIMIT = (1 << 63) - 1
_MAGIC_BYTES = INT32.pack(MESSAGE_MAGIC)


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


class Chunk(NamedTuple):
    """Records of a span that pass the filter, in log order, as columns over their file."""

    u8: np.ndarray  # the whole file, mapped read-only (unmapped when the last chunk is dropped)
    columns: RecordColumns
    topic_names: list[str]
    topic_index: np.ndarray  # per record, its topic's index in topic_names


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


def scan_span(span: Span, flt: ScanFilter = ScanFilter(), *, max_rows: int = CHUNK_ROWS,
              max_bytes: int = CHUNK_BYTES) -> Iterator[Chunk]:
    """The complete records of a span that pass ``flt``, in log order, in chunks of the
    records found among at most max_rows records or max_bytes bytes of the file."""
    mm = _map_readonly(span.path)
    if mm is None:
        return
    u8 = np.frombuffer(mm, np.uint8)  # keeps the mapping open while a chunk refers to it
    del mm
    base = span.file_start
    stop = len(u8) if span.end is None else min(span.end, len(u8))
    stop_after = flt.until_ms + flt.skew_ms if flt.until_ms < NO_LIMIT - flt.skew_ms else NO_LIMIT
    pos = span.begin
    while pos < stop:
        got = read_records(u8, pos, stop, base, max_records=max_rows, max_bytes=max_bytes)
        cols = got.columns
        late = np.flatnonzero(cols.store_timestamp >= stop_after)
        if len(late):  # store time only grows (skew aside): nothing after this is wanted
            cols = cols.select(slice(0, int(late[0])))
        chunk = _filtered(u8, cols, flt)
        if len(chunk.topic_index):
            yield chunk
        if len(late):
            return
        if got.ended:
            _log_end(u8, base, got.end)
            return
        pos = got.end


def _filtered(u8: np.ndarray, cols: RecordColumns, flt: ScanFilter) -> Chunk:
    names, index = topics(u8, cols)
    ts = cols.store_timestamp
    keep = (ts >= flt.since_ms) & (ts < flt.until_ms)
    if flt.topics is not None:
        keep &= np.array([name in flt.topics for name in names], bool)[index]
    if not keep.all():
        kept = np.flatnonzero(keep)
        cols, index = cols.select(kept), index[kept]
    return Chunk(u8, cols, names, index)


def _log_end(u8: np.ndarray, base: int, pos: int) -> None:
    """Say why the data ends at pos, unless it is the normal end (a filler, or zeros)."""
    if pos + 8 > len(u8):
        return
    total, magic = SIZE_MAGIC.unpack_from(u8, pos)  # type: ignore[arg-type]  # ndarray: a buffer; stubs miss it
    if magic != BLANK_MAGIC and (total or magic):
        log.info("CommitLog %s: data ends at %d (torn or incomplete record)", segment_name(base), base + pos)


def format_host(host: tuple[str, int]) -> str:
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
