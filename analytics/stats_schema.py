"""The broker statistics file contract (docs/STATS.md, schema v1) as the readers need it.

Names, latency bounds and file naming come from smartgo.stats_schema, the one module the
broker's writer uses too; this adds the Spark schema of a record.
"""

from __future__ import annotations

from smartgo.stats_schema import (FILE_GLOB, FILE_RE, HOUR_MS, LATENCY_BOUNDS, LATENCY_KINDS,  # noqa: F401
                                  SCHEMA_VERSION, file_hour_ms, file_name)

_HISTOGRAM = ("struct<count: bigint, p50_ms: double, p90_ms: double, p99_ms: double, max_ms: double, "
              "buckets: array<array<double>>>")
# Spark DDL of one record; _corrupt receives lines that are not JSON or not of these types.
SPARK_DDL = (
    "v bigint, ts bigint, window_s bigint, cluster string, broker string, broker_id bigint, addr string, "
    "totals struct<put_msgs: bigint, put_bytes: bigint, get_msgs: bigint, get_bytes: bigint, "
    "put_tps: double, get_tps: double>, "
    "topics array<struct<topic: string, put_msgs: bigint, put_bytes: bigint, put_tps: double>>, "
    "groups array<struct<group: string, topic: string, get_msgs: bigint, get_bytes: bigint, get_tps: double>>, "
    f"latency struct<send: {_HISTOGRAM}, pull: {_HISTOGRAM}>, "
    "lag array<struct<group: string, topic: string, queue_id: bigint, broker_offset: bigint, "
    "consumer_offset: bigint, lag: bigint>>, "
    "transactions array<struct<topic: string, commits: bigint, rollbacks: bigint>>, "
    "dlq array<struct<group: string, topic: string, msgs: bigint>>, "
    "mqtt struct<connections: bigint, sessions: bigint, subscriptions: bigint, retained: bigint, connects: bigint, "
    "dropped: bigint, bad_packets: bigint, auth_failures: bigint, messages_in: array<bigint>, "
    "messages_out: array<bigint>>, "
    "_corrupt string"
)
CORRUPT_COLUMN = "_corrupt"
