"""``spark.read.format("smartgo").load(store_dir)``: the messages in a store's CommitLog, one row each.

A PySpark Python data source (pyspark.sql.datasource). Planning cuts the CommitLog files
into spans (each file, split every ``splitBytes``) and prunes them by time; every span is
one input partition, so cores and executors read in parallel. Each task decodes its span
in columns with the store's record_columns (see analytics.store_scan for what "complete"
means while a broker appends) and hands Spark Arrow record batches built from those
columns: no Python object per message.

Options: ``topics`` ("A,B"), ``since`` / ``until`` (ISO-8601 or epoch ms; store time in
[since, until)), ``includeBody`` (adds the binary ``body`` column), ``splitBytes`` (span
size), ``timeSkewMs`` (how far store time may step back, for pruning). With
``spark.sql.python.filterPushdown.enabled`` (SmartGo's sessions set it), WHERE clauses on
``topic`` and ``store_timestamp``/``store_timestamp_ms`` prune spans and records as well.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property

import numpy as np

from pyspark.sql.datasource import (
    DataSource, DataSourceReader, EqualTo, GreaterThan, GreaterThanOrEqual, In, InputPartition, LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType,
)

from analytics.store_scan import (
    DEFAULT_SKEW_MS, DEFAULT_SPLIT_BYTES, NO_LIMIT, Chunk, ScanFilter, Span, format_host, list_spans, prune, scan_span,
)
from analytics.timespec import parse_time
from smartgo.store import record_columns
from smartgo.store.record import BORNHOST_V6_FLAG, STOREHOST_V6_FLAG, key_tokens

FORMAT = "smartgo"

_MESSAGE_FIELDS = [
    StructField("topic", StringType(), False),
    StructField("queue_id", IntegerType(), False),
    StructField("queue_offset", LongType(), False),
    StructField("commit_log_offset", LongType(), False),
    StructField("tags", StringType(), True),
    StructField("keys", ArrayType(StringType(), False), False),
    StructField("uniq_key", StringType(), True),
    StructField("properties", MapType(StringType(), StringType(), False), False),
    StructField("born_timestamp", TimestampType(), False),
    StructField("store_timestamp", TimestampType(), False),
    StructField("born_timestamp_ms", LongType(), False),
    StructField("store_timestamp_ms", LongType(), False),
    StructField("born_host", StringType(), False),
    StructField("store_host", StringType(), False),
    StructField("body_size", IntegerType(), False),
    StructField("msg_id", StringType(), False),
    StructField("reconsume_times", IntegerType(), False),
    StructField("sys_flag", IntegerType(), False),
    StructField("flag", IntegerType(), False),
]
BODY_FIELD = StructField("body", BinaryType(), False)


def message_schema(include_body: bool = False) -> StructType:
    """One row per stored message; ``body`` (as stored: compressed if sys_flag & 1) on request."""
    return StructType(_MESSAGE_FIELDS + ([BODY_FIELD] if include_body else []))


def _flag(options, name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"option {name}={value!r} is not a boolean")


@dataclass(frozen=True, slots=True)
class ScanOptions:
    path: str
    filter: ScanFilter
    split_bytes: int = DEFAULT_SPLIT_BYTES

    @classmethod
    def from_options(cls, options) -> ScanOptions:
        path = options.get("path")
        if not path:
            raise ValueError('the smartgo source needs a store directory: .load("/path/to/store")')
        topics = options.get("topics")
        names = frozenset(t.strip() for t in topics.split(",") if t.strip()) if topics else None
        since = parse_time(options["since"]) if options.get("since") else 0
        until = parse_time(options["until"]) if options.get("until") else NO_LIMIT
        skew = int(options.get("timeSkewMs") or DEFAULT_SKEW_MS)
        split = int(options.get("splitBytes") or DEFAULT_SPLIT_BYTES)
        if split < 4096:
            raise ValueError(f"option splitBytes={split} is below 4096")
        return cls(path, ScanFilter(names or None, since, until, skew), split)

    def narrowed(self, flt: ScanFilter) -> ScanOptions:
        return ScanOptions(self.path, flt, self.split_bytes)


class SpanPartition(InputPartition):
    """A span of one CommitLog file (picklable: path and offsets)."""

    def __init__(self, span: Span):
        super().__init__(span.begin)
        self.span = span


class SmartGoReader(DataSourceReader):
    def __init__(self, options: ScanOptions, schema: StructType):
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        spans = prune(list_spans(self.options.path, self.options.split_bytes), self.options.filter)
        return [SpanPartition(s) for s in spans]

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, SpanPartition):
            return iter(())  # no files: Spark still runs one (empty) task
        return record_batches(partition.span, self.options.filter, self.schema)


class PushdownReader(SmartGoReader):
    """SmartGoReader that also narrows its scan with WHERE filters on topic and store time.
    The filters are returned to Spark as well (it re-checks them), so pruning never has to
    be exact, only safe."""

    def pushFilters(self, filters):
        flt = self.options.filter
        topics, since, until = flt.topics, flt.since_ms, flt.until_ms
        for f in filters:
            column = f.attribute[0] if len(f.attribute) == 1 else None
            if column == "topic" and isinstance(f, EqualTo):
                topics = _intersect(topics, {f.value})
            elif column == "topic" and isinstance(f, In):
                topics = _intersect(topics, set(f.value))
            elif column in ("store_timestamp", "store_timestamp_ms"):
                ms = _as_ms(f.value)
                if ms is not None and isinstance(f, (GreaterThan, GreaterThanOrEqual)):
                    since = max(since, ms)
                elif ms is not None and isinstance(f, LessThan):
                    until = min(until, ms)
                elif ms is not None and isinstance(f, LessThanOrEqual):
                    until = min(until, ms + 1)
        self.options = self.options.narrowed(ScanFilter(topics, since, until, flt.skew_ms))
        return filters


def _intersect(current: frozenset[str] | None, values: set) -> frozenset[str]:
    names = frozenset(v for v in values if isinstance(v, str))
    return names if current is None else current & names


def _as_ms(value) -> int | None:
    """A pushed-down literal as epoch ms, rounded so the range only widens."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return int(moment.timestamp() * 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


class SmartGoDataSource(DataSource):
    """The "smartgo" format. Schema: message_schema(includeBody), or any subset of its
    columns given with DataFrameReader.schema(...), which also skips decoding the rest."""

    reader_class: type[SmartGoReader] = SmartGoReader

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return message_schema(_flag(self.options, "includeBody", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        check_projection(schema)
        return self.reader_class(ScanOptions.from_options(self.options), schema)


class SmartGoPushdownDataSource(SmartGoDataSource):
    reader_class = PushdownReader


def check_projection(schema: StructType) -> None:
    """A user schema must name columns of message_schema(True) with their types (nullability
    aside)."""
    full = {f.name: f.dataType.simpleString() for f in message_schema(True).fields}
    for f in schema.fields:
        if full.get(f.name) != f.dataType.simpleString():
            expected = full.get(f.name, "none (unknown column)")
            raise ValueError(f"column {f.name} {f.dataType.simpleString()} is not in the smartgo schema "
                             f"(expected type: {expected}); see analytics.datasource.message_schema")


def register(spark) -> None:
    """Make ``spark.read.format("smartgo")`` available on this session. Spark refuses a
    reader with pushFilters when pushdown is off, so the variant follows the session's conf."""
    pushdown = spark.conf.get("spark.sql.python.filterPushdown.enabled", "false").lower() == "true"
    spark.dataSource.register(SmartGoPushdownDataSource if pushdown else SmartGoDataSource)


# ----------------------------------------------------------------------------- Arrow batches

def record_batches(span: Span, flt: ScanFilter, schema: StructType) -> Iterator:
    """The span's matching records as pyarrow RecordBatches of the schema's columns."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    for chunk in scan_span(span, flt):
        yield to_record_batch(chunk, arrow_schema)


def to_record_batch(chunk: Chunk, arrow_schema):
    """A chunk's records as a batch of exactly arrow_schema (columns of message_schema)."""
    import pyarrow as pa

    parts = _Parts(pa, chunk)
    return pa.RecordBatch.from_arrays([_COLUMNS[f.name](parts, f.type) for f in arrow_schema], schema=arrow_schema)


class _Parts:
    """What the Arrow columns of one chunk are made of, each part built on first use (a
    narrow schema builds few). Text is copied straight from the mapped file or the parsed
    properties buffer into Arrow arrays (span_array), never through Python strings."""

    def __init__(self, pa, chunk: Chunk):
        self.pa = pa
        self.u8 = chunk.u8
        self.cols = chunk.columns
        self.chunk = chunk

    @cached_property
    def props(self) -> record_columns.Properties:
        return record_columns.properties(self.u8, self.cols)

    @cached_property
    def values(self):
        """Every property value (entry order), for the map and the single-property columns."""
        props = self.props
        return span_array(self.pa, props.buf, props.value_at, props.value_len, self.pa.string())

    def value_of(self, name: bytes):
        """Each record's value of one property, null when it has none."""
        entry = self.props.find(name)[0]
        return self.values.take(self.pa.array(entry, mask=entry < 0))

    def hosts(self, at: np.ndarray, v6_flag: int, typ):
        hosts, index = record_columns.hosts(self.u8, at, self.cols.sys_flag, v6_flag)
        return self.pa.array([format_host(h) for h in hosts], typ).take(self.pa.array(index))


def span_array(pa, buf: np.ndarray, at: np.ndarray, length: np.ndarray, typ):
    """buf[at[i]:at[i] + length[i]] for every i as one Arrow string or binary array, for
    spans in buffer order that do not overlap: one take of every other element of an array
    of the spans and the gaps between them (a copy per span, no work per byte in Python)."""
    n = len(at)
    if n == 0:
        return pa.array([], typ)
    low, high = int(at[0]), int(at[-1] + length[-1])
    bounds = np.empty(2 * n, np.int64)
    bounds[0::2] = at - low
    bounds[1::2] = at + length - low
    large = high - low >= 1 << 31  # beyond int32 offsets
    whole_type = (pa.large_binary() if typ == pa.binary() else pa.large_string()) if large else typ
    whole = pa.Array.from_buffers(whole_type, 2 * n - 1, [None, pa.py_buffer(bounds if large else
                                                                             bounds.astype(np.int32)),
                                                          pa.py_buffer(buf[low:high])])
    spans = whole.take(pa.array(np.arange(0, 2 * n, 2)))
    return spans.cast(typ) if large else spans


def _int32(name: str):
    return lambda parts, typ: parts.pa.array(getattr(parts.cols, name).astype(np.int32), typ)


def _int64(name: str):
    return lambda parts, typ: parts.pa.array(getattr(parts.cols, name), typ)


def _timestamp(name: str):
    return lambda parts, typ: parts.pa.array(getattr(parts.cols, name) * 1000, parts.pa.int64()).cast(typ)


def _topic(parts: _Parts, typ):
    chunk = parts.chunk
    return parts.pa.array(chunk.topic_names, typ).take(parts.pa.array(chunk.topic_index))


def _keys(parts: _Parts, typ):
    """KEYS split at spaces, empty tokens dropped (MessageExt.keys)."""
    pa, props = parts.pa, parts.props
    entry = props.find(b"KEYS")[0]
    has = entry >= 0
    token_row, token_at, token_len = key_tokens(props.buf, np.where(has, props.value_at[entry], 0),
                                                np.where(has, props.value_len[entry], 0))
    return pa.ListArray.from_arrays(_offsets(pa, token_row, len(entry)),
                                    span_array(pa, props.buf, token_at, token_len, typ.value_type), type=typ)


def _properties(parts: _Parts, typ):
    pa, props = parts.pa, parts.props
    return pa.MapArray.from_arrays(pa.array(props.offsets.astype(np.int32)),
                                   span_array(pa, props.buf, props.key_at, props.key_len, typ.key_type),
                                   parts.values, type=typ)


def _msg_id(parts: _Parts, typ):
    text, offsets = record_columns.msg_ids(parts.u8, parts.cols)
    return parts.pa.Array.from_buffers(typ, len(offsets) - 1, [None, parts.pa.py_buffer(offsets.astype(np.int32)),
                                                               parts.pa.py_buffer(text)])


def _body(parts: _Parts, typ):
    return span_array(parts.pa, parts.u8, parts.cols.body_at, parts.cols.body_len, typ)


def _offsets(pa, rows: np.ndarray, n: int):
    """List offsets (int32, n + 1) of items that belong to rows (ascending) of n rows."""
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    return pa.array(offsets)


_COLUMNS = {
    "topic": _topic,
    "queue_id": _int32("queue_id"),
    "queue_offset": _int64("queue_offset"),
    "commit_log_offset": _int64("commit_log_offset"),
    "tags": lambda parts, typ: parts.value_of(b"TAGS"),
    "keys": _keys,
    "uniq_key": lambda parts, typ: parts.value_of(b"UNIQ_KEY"),
    "properties": _properties,
    "born_timestamp": _timestamp("born_timestamp"),
    "store_timestamp": _timestamp("store_timestamp"),
    "born_timestamp_ms": _int64("born_timestamp"),
    "store_timestamp_ms": _int64("store_timestamp"),
    "born_host": lambda parts, typ: parts.hosts(parts.cols.born_host_at, BORNHOST_V6_FLAG, typ),
    "store_host": lambda parts, typ: parts.hosts(parts.cols.store_host_at, STOREHOST_V6_FLAG, typ),
    "body_size": _int32("body_len"),
    "msg_id": _msg_id,
    "reconsume_times": _int32("reconsume_times"),
    "sys_flag": _int32("sys_flag"),
    "flag": _int32("flag"),
    "body": _body,
}
