"""Broker statistics: counted in the net actors, aggregated in the broker actor.

Net actors count what they serve (NetStats): messages and bytes stored per topic, messages and
bytes pulled per (group, topic), pulls found/missed, transactions committed and rolled back per
topic with their time from the half's birth, and the latency of every send and pull from
its arrival (for a long-polling pull: its last wake-up) to its response handed to the
connection. Every second, on the wall clock's second boundary, each net actor sends the deltas
to the broker actor as one channel event stamped with that boundary.

The broker actor (StatsBook) adds them into the window the stamp falls in (windows of
stats_interval seconds, aligned to the epoch: a delta stamped exactly on a window's end belongs
to that window), closes a window a little after its end, and writes one record per window
(docs/STATS.md; smartgo.broker.stats.stats_files). It also keeps running totals sampled every
second for TPS over 10 s, 1 min, 10 min and 1 h (runtime info), and 4.x's stats items
(stats_items.py: per topic and per topic@group, for VIEW_BROKER_STATS_DATA and consumeTps). A
delta that arrives after its window was written goes into the open window: counts are never
lost, only moved a window later.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter, deque
from dataclasses import dataclass, field

from smartgo.broker.stats.stats_items import (BROKER_GET_NUMS, BROKER_PUT_NUMS, GROUP_GET_NUMS, GROUP_GET_SIZE,
                                              RESOLUTIONS, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, StatsItems, group_key)
from smartgo.config import ConfigError, NodeConfig
from smartgo.stats_schema import LATENCY_BOUNDS, SCHEMA_VERSION

_FINITE_MS = [float(b) for b in LATENCY_BOUNDS if b is not None]
_FINE_PER_E = 25.0                   # fine buckets: e^(1/25) = 4% wide, for percentiles
FLUSH_INTERVAL = 1.0                 # s between a net actor's flushes (stamps are on this grid)
TOTALS = ("put_msgs", "put_bytes", "get_msgs", "get_bytes", "pulls_found", "pulls_missed", "connections_refused")
#: 5.x's rocketmq_message_size buckets: bytes (1 KiB .. 4 MiB), observed once per send request
#: with its records' average size, as 5.x records wroteBytes / msgNum.
SIZE_BOUNDS = (1024, 4096, 512 * 1024, 1024 * 1024, 2 * 1024 * 1024, 4 * 1024 * 1024)
#: A topic's put counts in a net actor: messages, bytes, requests, then its size histogram (a count
#: per SIZE_BOUNDS bucket and +Inf, the sum), one list so a send costs one lookup.
_PUT_FIELDS = 3 + len(SIZE_BOUNDS) + 2
_SMALL = SIZE_BOUNDS[0]
#: 5.x's rocketmq_finish_message_latency buckets: seconds from a half's birth to its commit or rollback.
FINISH_BOUNDS = (5, 60, 600, 3600, 12 * 3600, 24 * 3600)
#: A topic's transaction counts: commits, rollbacks, a count per FINISH_BOUNDS bucket and one over
#: them all, the seconds' sum.
_TX_FIELDS = 3 + len(FINISH_BOUNDS) + 1


def transaction_counts(counts: list[int]) -> tuple[int, int, list[int], int]:
    """(commits, rollbacks, bucket counts, seconds' sum) of a topic's transaction counts."""
    return counts[0], counts[1], counts[2:-1], counts[-1]


def window_seconds(config: NodeConfig) -> int:
    """stats_interval, checked: whole windows must tile an hour (the files are hourly)."""
    w = config.stats_interval
    if w <= 0 or 3600 % w:
        raise ConfigError(f"stats_interval must divide 3600 (whole windows per hour), got {w}")
    return w


def minute_sample_ms(config: NodeConfig) -> int:
    """stats_sample_interval in ms, checked."""
    if not config.stats_sample_interval > 0:
        raise ConfigError(f"stats_sample_interval must be above 0 seconds, got {config.stats_sample_interval}")
    return round(config.stats_sample_interval * 1000)


class LatencyHistogram:
    """The contract's fixed buckets (exact counts), fine log buckets (percentiles within 4%),
    count, sum (a Prometheus histogram's _sum) and max."""

    __slots__ = ("buckets", "fine", "count", "sum_ms", "max_ms")

    def __init__(self) -> None:
        self.buckets = [0] * len(LATENCY_BOUNDS)
        self.fine: dict[int, int] = {}
        self.count = 0
        self.sum_ms = 0.0
        self.max_ms = 0.0

    def observe(self, ms: float) -> None:
        self.buckets[bisect_left(_FINITE_MS, ms)] += 1
        i = int(math.log(ms * 1000.0) * _FINE_PER_E) if ms > 0.001 else 0
        self.fine[i] = self.fine.get(i, 0) + 1
        self.count += 1
        self.sum_ms += ms
        if ms > self.max_ms:
            self.max_ms = ms

    def to_wire(self) -> list:
        return [self.buckets, list(self.fine.items()), self.count, self.max_ms, self.sum_ms]

    def add_wire(self, wire: list) -> None:
        buckets, fine, count, max_ms, sum_ms = wire
        for i, n in enumerate(buckets):
            self.buckets[i] += n
        for i, n in fine:
            self.fine[i] = self.fine.get(i, 0) + n
        self.count += count
        self.sum_ms += sum_ms
        self.max_ms = max(self.max_ms, max_ms)

    def quantile(self, q: float) -> float:
        """The upper edge of the fine bucket holding the q-quantile, in ms (at most max_ms)."""
        if not self.count:
            return 0.0
        want = q * self.count
        seen = 0
        for i in sorted(self.fine):
            seen += self.fine[i]
            if seen >= want:
                return min(math.exp((i + 1) / _FINE_PER_E) / 1000.0, self.max_ms)
        return self.max_ms

    def record_json(self) -> dict:
        return {"count": self.count, "p50_ms": round(self.quantile(0.5), 3), "p90_ms": round(self.quantile(0.9), 3),
                "p99_ms": round(self.quantile(0.99), 3), "max_ms": round(self.max_ms, 3),
                "buckets": [[b, n] for b, n in zip(LATENCY_BOUNDS, self.buckets)]}


class NetStats:
    """A net actor's counters since its last flush: [messages, bytes, requests] per topic
    stored and per (group, topic) pulled."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.put: dict[str, list[int]] = {}
        self.get: dict[tuple[str, str], list[int]] = {}
        self.send = LatencyHistogram()
        self.pull = LatencyHistogram()
        self.pulls_found = 0
        self.pulls_missed = 0
        self.transactions: dict[str, list[int]] = {}
        self.forwarded: dict[tuple[int, str], int] = {}     # (request code, passed | failed): a slave's relays
        self.refused = 0            # connections closed at accept: the actor held all it may (net.limits)

    def relayed(self, code: int, passed: bool) -> None:
        """A slave passed a stale route's write on to its master, or could not (master_forward)."""
        key = (code, "passed" if passed else "failed")
        self.forwarded[key] = self.forwarded.get(key, 0) + 1

    def ended(self, topic: str, commit: bool, seconds: int) -> None:
        """A half message of topic committed or rolled back, seconds after its birth."""
        c = self.transactions.get(topic)
        if c is None:
            c = self.transactions[topic] = [0] * _TX_FIELDS
        c[0 if commit else 1] += 1
        c[2 + bisect_left(FINISH_BOUNDS, seconds)] += 1
        c[-1] += seconds

    def stored(self, topic: str, msgs: int, nbytes: int) -> None:
        c = self.put.get(topic)
        if c is None:
            c = self.put[topic] = [0] * _PUT_FIELDS
        c[0] += msgs
        c[1] += nbytes
        c[2] += 1
        size = nbytes // msgs
        c[3 if size <= _SMALL else 3 + bisect_left(SIZE_BOUNDS, size)] += 1    # most are in the first bucket
        c[-1] += size

    def pulled(self, group: str, topic: str, msgs: int, nbytes: int) -> None:
        """A pull answered; msgs 0 is a miss."""
        if not msgs:
            self.pulls_missed += 1
            return
        self.pulls_found += 1
        c = self.get.get((group, topic))
        if c is None:
            self.get[(group, topic)] = [msgs, nbytes, 1]
        else:
            c[0] += msgs
            c[1] += nbytes
            c[2] += 1

    def take(self) -> dict | None:
        """The deltas since the last take (channel-ready), None when nothing happened."""
        if not (self.send.count or self.pull.count or self.put or self.get or self.pulls_missed or self.transactions
                or self.forwarded or self.refused):
            return None
        wire = {"put": [[t, c[0], c[1], c[2]] for t, c in self.put.items()],
                "get": [[g, t, *c] for (g, t), c in self.get.items()],
                "send": self.send.to_wire(), "pull": self.pull.to_wire(),
                "found": self.pulls_found, "missed": self.pulls_missed,
                "tx": [[t, *c] for t, c in self.transactions.items()],
                "fw": [[code, result, n] for (code, result), n in self.forwarded.items()],
                "refused": self.refused,
                "sizes": [[t, *c[3:]] for t, c in self.put.items()]}
        self._reset()
        return wire


@dataclass(slots=True)
class Window:
    """One stats window's sums."""
    end_ms: int
    put: dict[str, list[int]] = field(default_factory=dict)
    get: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    send: LatencyHistogram = field(default_factory=LatencyHistogram)
    pull: LatencyHistogram = field(default_factory=LatencyHistogram)
    transactions: dict[str, list[int]] = field(default_factory=dict)   # topic -> [commits, rollbacks]
    dlq: Counter[tuple[str, str]] = field(default_factory=Counter)       # (original topic, group) -> messages

    def add(self, wire: dict) -> None:
        for t, m, b, _ in wire["put"]:
            c = self.put.setdefault(t, [0, 0])
            c[0] += m
            c[1] += b
        for g, t, m, b, _ in wire["get"]:
            c = self.get.setdefault((g, t), [0, 0])
            c[0] += m
            c[1] += b
        self.send.add_wire(wire["send"])
        self.pull.add_wire(wire["pull"])
        for t, commits, rollbacks, *_ in wire.get("tx", ()):
            c = self.transactions.setdefault(t, [0, 0])
            c[0] += commits
            c[1] += rollbacks

    def record(self, window_s: int, identity: dict, lag: list[dict]) -> dict:
        """The stats record of docs/STATS.md."""
        put_msgs = sum(m for m, _ in self.put.values())
        get_msgs = sum(m for m, _ in self.get.values())
        return {
            "v": SCHEMA_VERSION, "ts": self.end_ms, "window_s": window_s, **identity,
            "totals": {"put_msgs": put_msgs, "put_bytes": sum(b for _, b in self.put.values()),
                       "get_msgs": get_msgs, "get_bytes": sum(b for _, b in self.get.values()),
                       "put_tps": round(put_msgs / window_s, 2), "get_tps": round(get_msgs / window_s, 2)},
            "topics": [{"topic": t, "put_msgs": m, "put_bytes": b, "put_tps": round(m / window_s, 2)}
                       for t, (m, b) in sorted(self.put.items())],
            "groups": [{"group": g, "topic": t, "get_msgs": m, "get_bytes": b, "get_tps": round(m / window_s, 2)}
                       for (g, t), (m, b) in sorted(self.get.items())],
            "latency": {"send": self.send.record_json(), "pull": self.pull.record_json()},
            "lag": lag,
            "transactions": [{"topic": t, "commits": c, "rollbacks": r}
                             for t, (c, r) in sorted(self.transactions.items())],
            "dlq": [{"group": g, "topic": t, "msgs": n} for (t, g), n in sorted(self.dlq.items())],
        }


class Samples:
    """Cumulative counters sampled every `tick` seconds (`keep` samples): rates over windows."""

    def __init__(self, tick: float, keep: int) -> None:
        self.tick = tick
        self._samples: deque[tuple[float, dict]] = deque(maxlen=keep)

    def maybe_sample(self, now: float, values: dict) -> None:
        if not self._samples or now - self._samples[-1][0] >= self.tick - 1e-3:
            self._samples.append((now, dict(values)))

    def rate(self, key, seconds: float, now: float, current: int) -> float:
        """Per second over the last `seconds` (or since the oldest sample, if younger)."""
        if not self._samples:
            return 0.0
        t, values = self._samples[0]
        for st, sv in reversed(self._samples):
            if now - st >= seconds - 1e-3:
                t, values = st, sv
                break
        span = now - t
        return (current - values.get(key, 0)) / span if span > 0 else 0.0


class StatsBook:
    """The broker actor's statistics: open windows, running totals, rates."""

    def __init__(self, window_s: int, now_ms: int, not_before_ms: int = 0, cluster: str = "DefaultCluster",
                 now: float = 0.0, minute_sample_ms: int = RESOLUTIONS[0][0]) -> None:
        self.window_s = window_s
        self.window_ms = window_s * 1000
        self.windows: dict[int, Window] = {}
        # never (re)write a window ending at or before this: the last record already written
        self.closed_until = max(not_before_ms, self._end_of(now_ms) - self.window_ms)
        self.totals = dict.fromkeys(TOTALS, 0)
        self.send = LatencyHistogram()      # since start: runtime info's maxima, the metrics' histograms
        self.pull = LatencyHistogram()
        #: (original topic, group) -> messages sent back straight to the group's DLQ since start
        #: (5.x's rocketmq_send_to_dlq_messages_total; counted where the broker actor decides it).
        self.dlq: Counter[tuple[str, str]] = Counter()
        #: topic -> transaction counts since start (NetStats.transactions; 5.x's transaction families).
        self.transactions: dict[str, list[int]] = {}
        #: topic -> message size histogram since start (NetStats.sizes; 5.x's rocketmq_message_size).
        self.sizes: dict[str, list[int]] = {}
        #: (request code, passed | failed) -> a slave's relays of stale-route writes since start
        self.forwarded: Counter[tuple[int, str]] = Counter()
        self.broker_rates = Samples(1.0, 3601)
        self.cluster = cluster
        self.items = StatsItems(now, now_ms, minute_sample_ms)

    def _end_of(self, stamp_ms: int) -> int:
        return -(-stamp_ms // self.window_ms) * self.window_ms

    def _window(self, stamp_ms: int) -> Window:
        """The window a count stamped stamp_ms goes to (the open one if its own was written)."""
        end = max(self._end_of(stamp_ms), self.closed_until + self.window_ms)
        window = self.windows.get(end)
        if window is None:
            window = self.windows[end] = Window(end)
        return window

    def dead_lettered(self, topic: str, group: str, stamp_ms: int) -> None:
        """A message of topic that group sent back went to the group's DLQ."""
        self.dlq[(topic, group)] += 1
        self._window(stamp_ms).dlq[(topic, group)] += 1

    def add(self, stamp_ms: int, wire: dict) -> None:
        """A net actor's deltas up to stamp_ms."""
        self._window(stamp_ms).add(wire)
        t, items = self.totals, self.items
        for topic, m, b, n in wire["put"]:
            t["put_msgs"] += m
            t["put_bytes"] += b
            items.add(TOPIC_PUT_NUMS, topic, m, n)
            items.add(TOPIC_PUT_SIZE, topic, b, n)
            items.add(BROKER_PUT_NUMS, self.cluster, m, 0)
        for g, topic, m, b, n in wire["get"]:
            t["get_msgs"] += m
            t["get_bytes"] += b
            key = group_key(topic, g)
            items.add(GROUP_GET_NUMS, key, m, n)
            items.add(GROUP_GET_SIZE, key, b, n)
            items.add(BROKER_GET_NUMS, self.cluster, m, 0)
        t["pulls_found"] += wire["found"]
        t["pulls_missed"] += wire["missed"]
        t["connections_refused"] += wire.get("refused", 0)
        for table, key in ((self.transactions, "tx"), (self.sizes, "sizes")):
            for topic, *counts in wire.get(key, ()):
                total = table.get(topic)
                if total is None:
                    total = table[topic] = [0] * len(counts)
                for i, n in enumerate(counts):
                    total[i] += n
        for code, result, n in wire.get("fw", ()):
            self.forwarded[(code, result)] += n
        self.send.add_wire(wire["send"])
        self.pull.add_wire(wire["pull"])

    def due(self, now_ms: int, grace_ms: int) -> list[int]:
        """Ends of the windows to write now: every end up to now - grace not written yet (an
        idle window gets its record too)."""
        last = (now_ms - grace_ms) // self.window_ms * self.window_ms
        return list(range(self.closed_until + self.window_ms, last + 1, self.window_ms))

    def close(self, end_ms: int) -> Window:
        """Take window end_ms (empty if nothing came); later deltas for it go to the next one."""
        self.closed_until = max(self.closed_until, end_ms)
        return self.windows.pop(end_ms, None) or Window(end_ms)

    def open_end(self, now_ms: int) -> int:
        """End of the window open at now (what a clean stop writes early)."""
        return max(self._end_of(now_ms), self.closed_until + self.window_ms)

    # ---- rates -------------------------------------------------------------------------------------
    def sample(self, now: float, now_ms: int) -> None:
        self.broker_rates.maybe_sample(now, self.totals)
        self.items.tick(now, now_ms)

    def tps(self, name: str, seconds: float, now: float) -> float:
        return self.broker_rates.rate(name, seconds, now, self.totals[name])

    def group_tps(self, group: str, topic: str) -> float:
        """Messages the group pulled from the topic per second over the last minute
        (BrokerStatsManager.tpsGroupGetNums: consumeTps)."""
        return self.items.minute_tps(GROUP_GET_NUMS, group_key(topic, group))
