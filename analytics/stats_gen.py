"""Stats files with known contents, for tests and benchmarks (schema v1, docs/STATS.md).

``StatsRecord`` builds one broker-minute line from the numbers a test chose; ``write_stats``
files records as a broker does (one JSONL file per UTC hour); ``synthetic_stats`` makes a
deterministic workload of any size and returns the totals a report must find.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from analytics.stats_schema import LATENCY_BOUNDS, SCHEMA_VERSION, file_name

MINUTE_MS = 60_000


@dataclass(frozen=True, slots=True)
class Broker:
    name: str
    broker_id: int = 0
    addr: str = "127.0.0.1:10911"
    cluster: str = "DefaultCluster"


Histogram = Mapping[float | None, int]  # upper bound (None = +inf) -> count


@dataclass(slots=True)
class StatsRecord:
    """One broker's minute. topics: topic -> (msgs, bytes); groups: (group, topic) -> (msgs,
    bytes); lag: (group, topic, queue_id) -> (broker_offset, consumer_offset); transactions:
    topic -> (commits, rollbacks); dlq: (group, topic) -> messages."""

    broker: Broker
    ts: int
    topics: dict[str, tuple[int, int]] = field(default_factory=dict)
    groups: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    send: Histogram = field(default_factory=dict)
    pull: Histogram = field(default_factory=dict)
    send_max_ms: float = 0.0
    pull_max_ms: float = 0.0
    lag: dict[tuple[str, str, int], tuple[int, int]] = field(default_factory=dict)
    transactions: dict[str, tuple[int, int]] = field(default_factory=dict)
    dlq: dict[tuple[str, str], int] = field(default_factory=dict)
    window_s: int = 60
    mqtt: dict | None = None     # the MQTT actors' object (docs/STATS.md); None: a broker without them

    def to_json(self) -> dict:
        w = self.window_s
        put_msgs = sum(m for m, _ in self.topics.values())
        put_bytes = sum(b for _, b in self.topics.values())
        get_msgs = sum(m for m, _ in self.groups.values())
        get_bytes = sum(b for _, b in self.groups.values())
        return {
            "v": SCHEMA_VERSION, "ts": self.ts, "window_s": w,
            "cluster": self.broker.cluster, "broker": self.broker.name, "broker_id": self.broker.broker_id,
            "addr": self.broker.addr,
            "totals": {"put_msgs": put_msgs, "put_bytes": put_bytes, "get_msgs": get_msgs, "get_bytes": get_bytes,
                       "put_tps": round(put_msgs / w, 2), "get_tps": round(get_msgs / w, 2)},
            "topics": [{"topic": t, "put_msgs": m, "put_bytes": b, "put_tps": round(m / w, 2)}
                       for t, (m, b) in self.topics.items() if m],
            "groups": [{"group": g, "topic": t, "get_msgs": m, "get_bytes": b, "get_tps": round(m / w, 2)}
                       for (g, t), (m, b) in self.groups.items() if m],
            "latency": {"send": histogram_json(self.send, self.send_max_ms),
                        "pull": histogram_json(self.pull, self.pull_max_ms)},
            "lag": [{"group": g, "topic": t, "queue_id": q, "broker_offset": bo, "consumer_offset": co,
                     "lag": max(0, bo - co)} for (g, t, q), (bo, co) in self.lag.items()],
            "transactions": [{"topic": t, "commits": c, "rollbacks": r} for t, (c, r) in self.transactions.items()],
            "dlq": [{"group": g, "topic": t, "msgs": n} for (g, t), n in self.dlq.items()],
            **({} if self.mqtt is None else {"mqtt": self.mqtt}),
        }

    def line(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))


def histogram_json(hist: Histogram, max_ms: float) -> dict:
    """The contract's histogram object; percentiles are the bucket upper bounds (a broker
    computes them from samples; readers use the buckets)."""
    count = sum(hist.values())
    counts = [hist.get(b, 0) for b in LATENCY_BOUNDS]
    buckets = [[b, c] for b, c in zip(LATENCY_BOUNDS, counts)]

    def upper(q: float) -> float:
        seen = 0
        for b, c in zip(LATENCY_BOUNDS, counts):
            seen += c
            if c and seen >= q * count:
                return max_ms if b is None else b
        return 0.0
    return {"count": count, "p50_ms": upper(0.5), "p90_ms": upper(0.9), "p99_ms": upper(0.99), "max_ms": max_ms,
            "buckets": buckets}


def write_stats(directory: str | Path, records: Iterable[StatsRecord | str]) -> list[Path]:
    """Append records (or raw lines, e.g. malformed ones) to the hour files of a stats
    folder, as a broker does. Raw lines go to the file of the previous record."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[str]] = defaultdict(list)
    current = None
    for rec in records:
        if isinstance(rec, StatsRecord):
            current = file_name(rec.ts)
            lines[current].append(rec.line())
        else:
            lines[current or "stats-19700101-00.jsonl"].append(rec)
    paths = []
    for name, content in lines.items():
        path = directory / name
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in content))
        paths.append(path)
    return paths


@dataclass(slots=True)
class Expected:
    """What a report over synthetic_stats must find."""

    records: int = 0
    put_msgs: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # per topic
    get_msgs: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # per group
    broker_put_msgs: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def synthetic_stats(directory: str | Path, *, brokers: int = 2, topics: int = 100, groups: int = 50,
                    minutes: int = 1440, start_ms: int = 1_795_000_020_000, queues: int = 4,
                    seed: int = 7) -> Expected:
    """A deterministic day: every broker reports every minute with a daily traffic wave,
    each topic on every broker, each group consuming one topic (some falling behind for
    hours), send latency rising with load; one folder per broker, <directory>/<broker>/."""
    rng = random.Random(seed)
    start_ms -= start_ms % MINUTE_MS
    topic_names = [f"Topic{i:03d}" for i in range(topics)]
    weights = [1 + rng.randrange(1000) for _ in topic_names]
    subscriptions = [(f"Group{i:02d}", topic_names[i % topics]) for i in range(groups)]
    expected = Expected()
    for b in range(brokers):
        broker = Broker(f"broker-{chr(ord('a') + b)}", 0, f"127.0.0.1:{10911 + b * 100}")
        offsets: dict[tuple[str, int], int] = defaultdict(int)
        records = []
        for minute in range(minutes):
            wave = 1.0 + 0.6 * math.sin(2 * math.pi * (minute + 60 * b) / 1440)
            rec = StatsRecord(broker, start_ms + minute * MINUTE_MS)
            for name, weight in zip(topic_names, weights):
                msgs = int(weight * wave) + (minute * 7 + b) % 50
                rec.topics[name] = (msgs, msgs * 128)
                expected.put_msgs[name] += msgs
                expected.broker_put_msgs[broker.name] += msgs
                for q in range(queues):
                    offsets[name, q] += msgs // queues + (1 if q < msgs % queues else 0)
            for i, (group, topic) in enumerate(subscriptions):
                behind = (i % 7) * ((minute // 60) % 6) * 10  # a backlog that builds up, then drains
                got = rec.topics[topic][0] - (minute % 3)
                rec.groups[group, topic] = (got, got * 128)
                expected.get_msgs[group] += got
                for q in range(queues):
                    broker_offset = offsets[topic, q]
                    rec.lag[group, topic, q] = (broker_offset, max(0, broker_offset - (minute % 5) - q - behind))
            total = sum(m for m, _ in rec.topics.values())
            center = 3 + 4 * (wave - 0.4) / 1.2  # slower when busier
            shape = [math.exp(-((i - center) ** 2) / 3) for i in range(len(LATENCY_BOUNDS))]
            rec.send = dict(zip(LATENCY_BOUNDS, _spread(total, shape)))
            rec.pull = {0.5: 100, 1: 50, 5: 10 + minute % 20}
            rec.send_max_ms, rec.pull_max_ms = 6000.0, 4.5
            records.append(rec)
            expected.records += 1
        write_stats(Path(directory) / broker.name, records)
    return expected


def _spread(total: int, shape: list[float]) -> list[int]:
    """total split in proportion to shape, in whole counts that add up to total."""
    scale = sum(shape)
    counts = [int(total * w / scale) for w in shape]
    counts[max(range(len(shape)), key=shape.__getitem__)] += total - sum(counts)
    return counts
