"""The report's tables, computed by Spark from the stats records (analytics.stats_input).

All rates are messages per second: a minute's TPS is its message count over its window,
summed across brokers. Latency percentiles are never averaged: the brokers' histograms
are added bucket by bucket (per minute, and over the whole range), then read as follows.
For quantile q of N samples, the rank is q*N; the bucket holding that rank (by cumulative
count) is interpolated linearly from its lower bound (the previous fixed bound, 0 for the
first) to its upper bound (for +inf: the largest max_ms reported), and the result is capped
at that max_ms.
"""

from __future__ import annotations

from dataclasses import dataclass

from analytics.stats_schema import LATENCY_BOUNDS, LATENCY_KINDS

QUANTILES = {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99}
FINITE_BOUNDS = [float(b) for b in LATENCY_BOUNDS if b is not None]


@dataclass(frozen=True, slots=True)
class TimeRange:
    first_ts: int
    last_ts: int
    minutes: int  # distinct minute windows with at least one record
    window_s: int

    @property
    def seconds(self) -> int:
        return max(1, self.minutes * self.window_s)


def time_range(records) -> TimeRange:
    import pyspark.sql.functions as F

    row = records.agg(F.min("ts").alias("a"), F.max("ts").alias("b"), F.countDistinct("ts").alias("n"),
                      F.max("window_s").alias("w")).first()
    return TimeRange(row["a"], row["b"], row["n"], row["w"])


def compute_tables(records, span: TimeRange) -> dict:
    """name -> DataFrame, in the order the report shows them. The per-minute tables are
    cached (each is one pass over the records) and the summaries computed from them; the
    caller collects every table, then calls release(tables)."""
    from pyspark import StorageLevel

    def cached(df):
        return df.persist(StorageLevel.MEMORY_AND_DISK)

    topic_tps = cached(_topic_minutes(records))
    group_topic = cached(_group_topic_minutes(records))
    lag = cached(_lag_minutes(records))
    buckets = cached(_merged_buckets(_latency_buckets(records), ["kind", "ts"]))
    brokers = cached(_broker_minutes(records))
    group_tps, consumption, top_groups = _groups(group_topic, span)
    tables = {
        "topic_tps": topic_tps,
        "top_topics": _top_topics(topic_tps, span),
        "group_tps": group_tps,
        "consumption": consumption,
        "top_groups": top_groups,
        "consumer_lag": lag,
        "lag_summary": _lag_summary(lag),
        "latency": latency_percentiles(buckets, ["kind", "ts"]),
        "latency_overall": latency_percentiles(_merged_buckets(buckets, ["kind"]), ["kind"]),
        "broker_minutes": brokers,
        "broker_load": _broker_load(brokers, span),
        "transactions": _transactions(records),
        "dead_letters": _dead_letters(records),
        "mqtt": _mqtt_minutes(records),
    }
    tables["_cached"] = [topic_tps, group_topic, lag, buckets, brokers]
    return tables


# Row order of each collected table: (columns, ascending) - sorted on the driver, where
# the tables are small, instead of one more Spark job per table.
ORDER: dict[str, tuple[list[str], list[bool]]] = {
    "topic_tps": (["topic", "ts"], [True, True]),
    "top_topics": (["put_msgs", "topic"], [False, True]),
    "group_tps": (["group", "ts"], [True, True]),
    "consumption": (["get_msgs", "group", "topic"], [False, True, True]),
    "top_groups": (["get_msgs", "group"], [False, True]),
    "consumer_lag": (["group", "topic", "ts"], [True, True, True]),
    "lag_summary": (["latest_lag", "peak_lag", "group", "topic"], [False, False, True, True]),
    "latency": (["kind", "ts"], [False, True]),
    "latency_overall": (["kind"], [False]),
    "broker_minutes": (["broker", "broker_id", "ts"], [True, True, True]),
    "broker_load": (["put_msgs", "broker", "broker_id"], [False, True, True]),
    "transactions": (["commits", "topic"], [False, True]),
    "dead_letters": (["msgs", "group", "topic"], [False, True, True]),
    "mqtt": (["ts"], [True]),
}


def collect(tables: dict, on_table=None) -> dict:
    """Every table as a sorted pandas DataFrame (name -> frame); frees the caches."""
    frames = {}
    try:
        for name, df in tables.items():
            if name.startswith("_"):
                continue
            columns, ascending = ORDER[name]
            frames[name] = df.toPandas().sort_values(columns, ascending=ascending, kind="stable").reset_index(drop=True)
            if on_table is not None:
                on_table(name)
    finally:
        for df in tables.get("_cached", []):
            df.unpersist()
    return frames


def _zero(column: str):
    import pyspark.sql.functions as F

    return F.coalesce(F.col(column), F.lit(0))


def _topic_minutes(records):
    import pyspark.sql.functions as F

    rows = records.select("ts", "window_s", F.explode("topics").alias("t")).select(
        "ts", "window_s", "t.topic", _zero("t.put_msgs").alias("msgs"), _zero("t.put_bytes").alias("bytes"))
    return rows.groupBy("topic", "ts").agg(
        F.sum("msgs").alias("put_msgs"), F.sum("bytes").alias("put_bytes"),
        F.sum(F.col("msgs") / F.col("window_s")).alias("tps"))


def _top_topics(topic_tps, span: TimeRange):
    import pyspark.sql.functions as F

    return topic_tps.groupBy("topic").agg(
        F.sum("put_msgs").alias("put_msgs"), F.sum("put_bytes").alias("put_bytes"),
        F.max("tps").alias("peak_tps")).select(
        "topic", "put_msgs", "put_bytes", (F.col("put_msgs") / span.seconds).alias("avg_tps"), "peak_tps",
    )


def _group_topic_minutes(records):
    import pyspark.sql.functions as F

    rows = records.select("ts", "window_s", F.explode("groups").alias("g")).select(
        "ts", "window_s", "g.group", "g.topic", _zero("g.get_msgs").alias("msgs"), _zero("g.get_bytes").alias("bytes"))
    return rows.groupBy("group", "topic", "ts").agg(
        F.sum("msgs").alias("get_msgs"), F.sum("bytes").alias("get_bytes"),
        F.sum(F.col("msgs") / F.col("window_s")).alias("tps"))


def _groups(per_minute, span: TimeRange):
    import pyspark.sql.functions as F

    group_tps = per_minute.groupBy("group", "ts").agg(
        F.sum("get_msgs").alias("get_msgs"), F.sum("get_bytes").alias("get_bytes"), F.sum("tps").alias("tps"))
    consumption = per_minute.groupBy("group", "topic").agg(
        F.sum("get_msgs").alias("get_msgs"), F.sum("get_bytes").alias("get_bytes"),
        F.max("tps").alias("peak_tps")).select(
        "group", "topic", "get_msgs", "get_bytes", (F.col("get_msgs") / span.seconds).alias("avg_tps"), "peak_tps",
    )
    top = group_tps.groupBy("group").agg(
        F.sum("get_msgs").alias("get_msgs"), F.sum("get_bytes").alias("get_bytes"),
        F.max("tps").alias("peak_tps")).join(
        per_minute.groupBy("group").agg(F.concat_ws(",", F.array_sort(F.collect_set("topic"))).alias("topics")),
        "group").select(
        "group", "topics", "get_msgs", "get_bytes", (F.col("get_msgs") / span.seconds).alias("avg_tps"), "peak_tps",
    )
    return group_tps, consumption, top


def _lag_minutes(records):
    """Lag per (group, topic, minute), summed over queues and brokers. A master and its slaves
    report the same queues (a slave's offsets are copies of its master's): per broker name and
    queue the lowest brokerId's snapshot counts, so a slave's counts only while its master
    reports nothing."""
    import pyspark.sql.functions as F

    rows = records.select("ts", "broker", "broker_id", F.explode("lag").alias("l")).select(
        "ts", "broker", "broker_id", "l.group", "l.topic", "l.queue_id",
        F.greatest(_zero("l.lag"), F.lit(0)).alias("lag"))
    rows = rows.groupBy("ts", "broker", "group", "topic", "queue_id").agg(F.min_by("lag", "broker_id").alias("lag"))
    return rows.groupBy("group", "topic", "ts").agg(
        F.sum("lag").alias("lag"), F.max("lag").alias("max_queue_lag"), F.count("*").alias("queues"))


def _lag_summary(per_minute):
    import pyspark.sql.functions as F

    last = per_minute.groupBy("group", "topic").agg(
        F.max_by("lag", "ts").alias("latest_lag"), F.max("lag").alias("peak_lag"), F.avg("lag").alias("avg_lag"),
        F.max("ts").alias("latest_ts"))
    return last


def _transactions(records):
    """Per topic: transactions committed and rolled back in the range (records of older brokers
    have no transactions[]: they add nothing)."""
    import pyspark.sql.functions as F

    rows = records.select(F.explode("transactions").alias("x")).select(
        "x.topic", _zero("x.commits").alias("commits"), _zero("x.rollbacks").alias("rollbacks"))
    return rows.groupBy("topic").agg(F.sum("commits").alias("commits"), F.sum("rollbacks").alias("rollbacks")).select(
        "topic", "commits", "rollbacks",
        (F.col("rollbacks") * 100.0 / (F.col("commits") + F.col("rollbacks"))).alias("rollback_pct"))


def _dead_letters(records):
    """Per consumer group and original topic: messages sent to the group's DLQ in the range,
    and the last minute that sent any."""
    import pyspark.sql.functions as F

    rows = records.select("ts", F.explode("dlq").alias("d")).select("ts", "d.group", "d.topic",
                                                                   _zero("d.msgs").alias("msgs"))
    return rows.groupBy("group", "topic").agg(F.sum("msgs").alias("msgs"), F.max("ts").alias("last_ts"))


def _latency_buckets(records):
    """(kind, ts, max_ms, bound, n) rows: every histogram bucket of every record; bound
    null is +inf."""
    import pyspark.sql.functions as F

    parts = []
    for kind in LATENCY_KINDS:
        h = F.col(f"latency.{kind}")
        parts.append(records.where(h.isNotNull()).select(
            F.lit(kind).alias("kind"), "ts", h["max_ms"].alias("max_ms"), F.explode(h["buckets"]).alias("b")))
    rows = parts[0].unionByName(parts[1])
    return rows.select("kind", "ts", "max_ms", F.col("b")[0].alias("bound"),
                       F.coalesce(F.col("b")[1], F.lit(0.0)).cast("long").alias("n"))


def _merged_buckets(buckets, keys: list[str]):
    """Histograms added per keys: (keys..., bound, n, max_ms)."""
    import pyspark.sql.functions as F

    return buckets.groupBy(*keys, "bound").agg(F.sum("n").alias("n"), F.max("max_ms").alias("max_ms"))


def latency_percentiles(merged, keys: list[str]):
    """count, QUANTILES and max_ms per keys, read off merged histogram buckets."""
    import pyspark.sql.functions as F
    from pyspark.sql import Window

    whole = Window.partitionBy(*keys)
    upto = whole.orderBy(F.col("bound").asc_nulls_last()).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    finite = F.array(*[F.lit(b) for b in FINITE_BOUNDS])
    bound = F.col("bound")
    lower = F.when(bound.isNull(), F.lit(FINITE_BOUNDS[-1])).otherwise(
        F.aggregate(F.filter(finite, lambda b: b < bound), F.lit(0.0), lambda acc, b: F.greatest(acc, b)))
    top = F.max("max_ms").over(whole)
    cols = merged.select(
        *keys, "n", lower.alias("lower"), F.coalesce(bound, F.greatest(top, lower)).alias("upper"),
        F.sum("n").over(whole).alias("total"), F.sum("n").over(upto).alias("cum"), top.alias("top"))
    aggs = [F.first("total").alias("count")]
    for name, q in QUANTILES.items():
        rank = F.col("total") * q
        before = F.col("cum") - F.col("n")
        value = F.col("lower") + (F.col("upper") - F.col("lower")) * (rank - before) / F.col("n")
        capped = F.when(F.col("top") > 0, F.least(value, F.col("top"))).otherwise(value)
        hit = (F.col("n") > 0) & (before < rank) & (rank <= F.col("cum"))
        aggs.append(F.max(F.when(hit, capped)).alias(name))
    aggs.append(F.max("top").alias("max_ms"))
    return cols.groupBy(*keys).agg(*aggs)


def _mqtt_minutes(records):
    """Per minute, over the brokers with MQTT actors (records without an mqtt object add nothing):
    PUBLISH packets from devices and to devices by QoS and per second, and the connections,
    sessions and subscriptions the brokers had at the end of the minute."""
    import pyspark.sql.functions as F

    def qos(way: str, q: int):
        return F.coalesce(F.col(f"mqtt.messages_{way}")[q], F.lit(0))
    rows = records.where(F.col("mqtt").isNotNull()).select(
        "ts", "window_s", *(qos(way, q).alias(f"{way}_qos{q}") for way in ("in", "out") for q in range(3)),
        *(_zero(f"mqtt.{k}").alias(k) for k in ("connections", "sessions", "subscriptions", "dropped")))
    sums = rows.groupBy("ts").agg(F.max("window_s").alias("window_s"), *(F.sum(c).alias(c) for c in rows.columns
                                                                         if c not in ("ts", "window_s")))
    msgs_in = sum((F.col(f"in_qos{q}") for q in range(3)), F.lit(0))
    msgs_out = sum((F.col(f"out_qos{q}") for q in range(3)), F.lit(0))
    return sums.select("ts", msgs_in.alias("msgs_in"), msgs_out.alias("msgs_out"),
                       (msgs_in / F.col("window_s")).alias("in_tps"), (msgs_out / F.col("window_s")).alias("out_tps"),
                       *(f"{way}_qos{q}" for way in ("in", "out") for q in range(3)),
                       "connections", "sessions", "subscriptions", "dropped")


def _broker_minutes(records):
    import pyspark.sql.functions as F

    return records.select(
        "cluster", "broker", "broker_id", "addr", "ts",
        _zero("totals.put_msgs").alias("put_msgs"), _zero("totals.put_bytes").alias("put_bytes"),
        _zero("totals.get_msgs").alias("get_msgs"), _zero("totals.get_bytes").alias("get_bytes"),
        (_zero("totals.put_msgs") / F.col("window_s")).alias("put_tps"),
        (_zero("totals.get_msgs") / F.col("window_s")).alias("get_tps"),
    )


def _broker_load(per_minute, span: TimeRange):
    import pyspark.sql.functions as F

    load = per_minute.groupBy("cluster", "broker", "broker_id").agg(
        F.max("addr").alias("addr"), F.count("*").alias("minutes"),
        F.sum("put_msgs").alias("put_msgs"), F.sum("put_bytes").alias("put_bytes"),
        F.sum("get_msgs").alias("get_msgs"), F.sum("get_bytes").alias("get_bytes"),
        F.max("put_tps").alias("peak_put_tps"), F.max("get_tps").alias("peak_get_tps"))
    return load.crossJoin(load.agg(F.sum("put_msgs").alias("_all"))).select(
        "cluster", "broker", "broker_id", "addr", "minutes", "put_msgs", "put_bytes", "get_msgs", "get_bytes",
        (F.col("put_msgs") / span.seconds).alias("avg_put_tps"), "peak_put_tps",
        (F.col("get_msgs") / span.seconds).alias("avg_get_tps"), "peak_get_tps",
        (F.col("put_msgs") * 100.0 / F.greatest("_all", F.lit(1))).alias("put_share_pct"),
    )
