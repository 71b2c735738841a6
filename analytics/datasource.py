"""``spark.read.format("smartgo").load(store_dir)``: the messages in a store's CommitLog, one row each.

A PySpark Python data source (pyspark.sql.datasource). Planning cuts the CommitLog files
into spans (each file, split every ``splitBytes``) and prunes them by time; every span is
one input partition, so cores and executors read in parallel. Each task walks its span
with the store's record codec (see analytics.store_scan for what "complete" means while a
broker appends) and hands Spark Arrow record batches built column by column, which costs
far less than Python rows.

Options: ``topics`` ("A,B"), ``since`` / ``until`` (ISO-8601 or epoch ms; store time in
[since, until)), ``includeBody`` (adds the binary ``body`` column), ``splitBytes`` (span
size), ``timeSkewMs`` (how far store time may step back, for pruning). With
``spark.sql.python.filterPushdown.enabled`` (SmartGo's sessions set it), WHERE clauses on
``topic`` and ``store_timestamp``/``store_timestamp_ms`` prune spans and records as well.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import accumulate, chain

from pyspark.sql.datasource import (
    DataSource, DataSourceReader, EqualTo, GreaterThan, GreaterThanOrEqual, In, InputPartition, LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType,
)

from analytics.store_scan import (
    DEFAULT_SKEW_MS, DEFAULT_SPLIT_BYTES, NO_LIMIT, ROW_FIELDS, ScanFilter, Span, Wanted, list_spans, prune, scan_span,
)
from analytics.timespec import parse_time

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


_PROPERTY_COLUMNS = frozenset({"tags", "keys", "uniq_key", "properties"})


def wanted_for(schema: StructType) -> Wanted:
    names = set(schema.fieldNames())
    return Wanted(properties=bool(names & _PROPERTY_COLUMNS), msg_id="msg_id" in names, body="body" in names)


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
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    # Rows hold no reference cycles; the cyclic GC would only rescan the growing chunk
    # (measured: a quarter of the scan time). Off while this task's generator runs.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for rows in scan_span(span, flt, wanted_for(schema)):
            yield to_record_batch(pa, rows, arrow_schema)
    finally:
        if gc_was_enabled:
            gc.enable()


def to_record_batch(pa, rows: list[tuple], arrow_schema):
    """Transpose scan_span rows (ROW_FIELDS order) into a batch of exactly arrow_schema."""
    columns = dict(zip(ROW_FIELDS, zip(*rows)))
    return pa.RecordBatch.from_arrays([_COLUMNS[f.name](pa, columns, f.type) for f in arrow_schema],
                                      schema=arrow_schema)


def _plain(source: str):
    return lambda pa, columns, typ: pa.array(columns[source], typ)


def _timestamp(source: str):
    def build(pa, columns, typ):
        import pyarrow.compute as pc

        return pc.multiply(pa.array(columns[source], pa.int64()), 1000).cast(typ)
    return build


def _property(name: str):
    return lambda pa, columns, typ: pa.array([p.get(name) for p in columns["properties"]], typ)


def _keys(pa, columns, typ):
    lists = [k.split(" ") if k else () for k in (p.get("KEYS") for p in columns["properties"])]
    if any("" in k for k in lists):  # doubled or edge spaces: keep the real keys only
        lists = [[x for x in k if x] for k in lists]
    return pa.ListArray.from_arrays(_offsets(pa, lists), pa.array(list(chain.from_iterable(lists)), pa.string()),
                                    type=typ)


def _properties(pa, columns, typ):
    props = columns["properties"]
    return pa.MapArray.from_arrays(_offsets(pa, props), pa.array(list(chain.from_iterable(props)), pa.string()),
                                   pa.array(list(chain.from_iterable(p.values() for p in props)), pa.string()),
                                   type=typ)


def _offsets(pa, lists) -> object:
    """List offsets (0, len0, len0+len1, ...) as an int32 array."""
    return pa.array(list(accumulate(map(len, lists), initial=0)), pa.int32())


_COLUMNS = {name: _plain(name) for name in (
    "topic", "queue_id", "queue_offset", "commit_log_offset", "born_host", "store_host", "body_size", "msg_id",
    "reconsume_times", "sys_flag", "flag", "body")}
_COLUMNS.update({
    "tags": _property("TAGS"),
    "uniq_key": _property("UNIQ_KEY"),
    "keys": _keys,
    "properties": _properties,
    "born_timestamp": _timestamp("born_timestamp"),
    "store_timestamp": _timestamp("store_timestamp"),
    "born_timestamp_ms": _plain("born_timestamp"),
    "store_timestamp_ms": _plain("store_timestamp"),
})
