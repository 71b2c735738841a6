"""An MQTT 3.1.1 load generator for any broker: raw sockets, packets encoded once with struct, the
connections spread over worker processes (spawned), an asyncio loop (uvloop when installed) in each.

It carries its own dozen lines of encoding instead of the codec (smartgo.mqtt.codec): a generator
must cost the shared cores as little as possible, and a packet built once and patched in place
(packet id, timestamp) costs less than a dataclass encoded per message. It speaks only what a
3.1.1 client needs: CONNECT, SUBSCRIBE, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, PINGREQ, DISCONNECT.

What is counted (every figure over the measured window of `seconds`, totals after the drain):
  accepted    publishes the broker confirmed: QoS 1 PUBACK, QoS 2 PUBCOMP; QoS 0 has no answer, so a
              publisher sends a PINGREQ after every chunk of publishes and counts the chunk when its
              PINGRESP comes back (a broker reads a connection in order: the answer to a ping says
              it has taken every publish written before it). Its chunks in flight are bounded, so
              msgs/s is what the broker takes in, not what the client can write into a socket.
  delivered   PUBLISH packets the subscribers received (deliveries/s); a subscriber waits after the
              window until it has every message published or the broker has been quiet `quiet` s.
  latency     the payload's first 8 bytes carry the send time (CLOCK_MONOTONIC ns, one clock for every
              process of the host): publish -> subscriber (delivery_*) and publish -> confirmation
              (ack_*: PUBACK, PUBCOMP, or the PINGRESP after a QoS 0 chunk), sampled when numerous.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import resource
import struct
import time
from array import array
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from smartgo.net.loop import new_event_loop

_U16 = struct.Struct(">H")
_TS = struct.Struct(">q")
PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"
CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, PINGRESP = 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x90, 0xD0
QOS0_CHUNK = 64             # publishes per PINGREQ at QoS 0 (Load.chunk)
MAX_SAMPLES = 100_000       # latency samples kept per worker and kind (then every other one, and so on)


class LoadError(Exception):
    """The broker refused or dropped a connection, or a worker failed."""


# ---- encoding ---------------------------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _varint(len(body)) + body


def _string(s: str) -> bytes:
    b = s.encode()
    return _U16.pack(len(b)) + b


def packet_bounds(data: bytes, i: int) -> tuple[int, int] | None:
    """Where the body of the packet at data[i] starts and where the packet ends; None while it is not
    all there (its remaining length included)."""
    n = len(data)
    length, shift, j = 0, 0, i + 1
    while j < n:
        b = data[j]
        j += 1
        length |= (b & 0x7F) << shift
        if b < 0x80:
            end = j + length
            return (j, end) if end <= n else None
        shift += 7
    return None


def connect_packet(client_id: str, keep_alive: int = 0, clean: bool = True) -> bytes:
    return _packet(0x10, _string("MQTT") + bytes((4, 0x02 if clean else 0)) + _U16.pack(keep_alive)
                   + _string(client_id))


def subscribe_packet(packet_id: int, topic_filter: str, qos: int) -> bytes:
    return _packet(0x82, _U16.pack(packet_id) + _string(topic_filter) + bytes((qos,)))


def publish_packet(topic: str, payload: bytes, qos: int = 0, packet_id: int = 0) -> bytes:
    return _packet(0x30 | qos << 1, _string(topic) + (_U16.pack(packet_id) if qos else b"") + payload)


def ack_packet(kind: int, packet_id: int) -> bytes:
    """PUBACK, PUBREC, PUBREL (flags 0b0010) or PUBCOMP."""
    return bytes((kind | (2 if kind == PUBREL else 0), 2)) + _U16.pack(packet_id)


@dataclass(frozen=True, slots=True)
class Template:
    """A PUBLISH built once; stamp() patches the send time (and packet id) into a copy."""
    packet: bytes
    id_at: int      # offset of the packet id (QoS > 0)
    ts_at: int      # offset of the payload, whose first 8 bytes are the send time

    @classmethod
    def of(cls, topic: str, size: int, qos: int) -> Template:
        if size < _TS.size:
            raise ValueError(f"payload size {size} < {_TS.size}: the payload carries the send time")
        packet = publish_packet(topic, bytes(size), qos, 1)
        ts_at = len(packet) - size
        return cls(packet, ts_at - 2, ts_at)

    def stamp(self, now_ns: int, packet_id: int = 0) -> bytearray:
        buf = bytearray(self.packet)
        if packet_id:
            _U16.pack_into(buf, self.id_at, packet_id)
        _TS.pack_into(buf, self.ts_at, now_ns)
        return buf

    def chunk(self, now_ns: int, n: int) -> bytearray:
        """n QoS 0 publishes and a PINGREQ, in one buffer."""
        step = len(self.packet)
        buf = bytearray(self.packet * n + PINGREQ)
        for i in range(n):
            _TS.pack_into(buf, self.ts_at + i * step, now_ns)
        return buf


# ---- one worker process's connections ----------------------------------------------------------------------

class Samples:
    """Latency samples (ms), at most MAX_SAMPLES: when full, every other one goes and the stride doubles."""
    __slots__ = ("values", "stride", "skip")

    def __init__(self) -> None:
        self.values = array("d")
        self.stride = self.skip = 1

    def due(self) -> bool:
        self.skip -= 1
        if self.skip:
            return False
        self.skip = self.stride
        return True

    def add(self, ms: float) -> None:
        self.values.append(ms)
        if len(self.values) >= MAX_SAMPLES:
            self.values = self.values[::2]
            self.stride *= 2


class Stats:
    """One worker's counters, shared by its connections."""
    __slots__ = ("end_ns", "sent", "accepted", "accepted_total", "delivered", "delivered_total", "ack", "delivery",
                 "errors")

    def __init__(self) -> None:
        self.end_ns = 1 << 62
        self.sent = self.accepted = self.accepted_total = self.delivered = self.delivered_total = 0
        self.ack, self.delivery = Samples(), Samples()
        self.errors: list[str] = []


class Connection(asyncio.Protocol):
    """One MQTT client connection: publisher, subscriber or both. Replies and the publishes that a
    batch of answers lets go are written once per data_received."""
    __slots__ = ("stats", "transport", "tail", "out", "waiter", "template", "qos", "window", "sending", "inflight",
                 "next_id", "pings", "closed", "sent", "chunk")

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.transport: asyncio.Transport | None = None
        self.tail = b""
        self.out: list[bytes | bytearray] = []
        self.waiter: asyncio.Future[int] | None = None    # CONNACK / SUBACK code
        self.template: Template | None = None
        self.qos = 0
        self.window = 0             # QoS > 0: publishes unconfirmed; QoS 0: chunks unconfirmed
        self.sending = False
        self.inflight: dict[int, int] = {}           # packet id -> send time (ns)
        self.next_id = 0
        self.pings: deque[tuple[int, int]] = deque()   # QoS 0 chunks: (send time ns, publishes)
        self.closed = False
        self.sent = 0
        self.chunk = QOS0_CHUNK

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection's transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.stats.errors.append(f"connection lost: {exc or 'closed by the broker'}")
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(LoadError(f"connection closed by the broker: {exc or 'EOF'}"))

    def data_received(self, data: bytes) -> None:
        if self.tail:
            data = self.tail + data
        now = time.monotonic_ns()
        i = 0
        while (bounds := packet_bounds(data, i)) is not None:
            self.packet(data[i], data, *bounds, now)
            i = bounds[1]
        self.tail = data[i:]
        if self.out:
            self.flush()

    # -- packets
    def packet(self, first: int, data: bytes, at: int, end: int, now: int) -> None:
        kind = first & 0xF0
        stats = self.stats
        if kind == PUBLISH:
            qos = (first >> 1) & 3
            p = at + 2 + _U16.unpack_from(data, at)[0]
            if qos:
                self.out.append(ack_packet(PUBACK if qos == 1 else PUBREC, _U16.unpack_from(data, p)[0]))
                p += 2
            stats.delivered_total += 1
            if now < stats.end_ns:
                stats.delivered += 1
            if end - p >= 8 and stats.delivery.due():
                stats.delivery.add((now - _TS.unpack_from(data, p)[0]) / 1e6)
        elif kind == PUBACK or kind == PUBCOMP:
            self.confirmed(_U16.unpack_from(data, at)[0], now)
        elif kind == PINGRESP:
            if self.pings:
                sent_at, count = self.pings.popleft()
                self.accept(count, sent_at, now)
                self.pump(now)
        elif kind == PUBREC:
            self.out.append(ack_packet(PUBREL, _U16.unpack_from(data, at)[0]))
        elif kind == PUBREL:
            self.out.append(ack_packet(PUBCOMP, _U16.unpack_from(data, at)[0]))
        elif kind == CONNACK or kind == SUBACK:
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(data[end - 1])

    def confirmed(self, packet_id: int, now: int) -> None:
        sent_at = self.inflight.pop(packet_id, None)
        if sent_at is None:
            self.stats.errors.append(f"an answer for packet id {packet_id}, not in flight")
            return
        self.accept(1, sent_at, now)
        self.pump(now)

    def accept(self, count: int, sent_at: int, now: int) -> None:
        stats = self.stats
        stats.accepted_total += count
        if now < stats.end_ns:
            stats.accepted += count
        if stats.ack.due():
            stats.ack.add((now - sent_at) / 1e6)

    def pump(self, now: int) -> None:
        """Publish as fast as the window lets (flat-out publishers)."""
        if not self.sending:
            return
        if self.qos:
            while len(self.inflight) < self.window:
                self.publish(now)
        else:
            while len(self.pings) < self.window:
                self.publish_chunk(now, self.chunk)

    def publish(self, now: int) -> None:
        """One QoS > 0 publish."""
        assert self.template is not None
        pid = self.next_id
        while True:
            pid = pid % 0xFFFF + 1
            if pid not in self.inflight:
                break
        self.next_id = pid
        self.inflight[pid] = now
        self.out.append(self.template.stamp(now, pid))
        self.sent += 1

    def publish_chunk(self, now: int, n: int) -> None:
        """n QoS 0 publishes and the PINGREQ that confirms them."""
        assert self.template is not None
        self.pings.append((now, n))
        self.out.append(self.template.chunk(now, n))
        self.sent += n

    def flush(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def outstanding(self) -> int:
        return len(self.inflight) + len(self.pings)

    # -- set-up and end
    async def request(self, packet: bytes, timeout: float) -> int:
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(packet)
        try:
            return await asyncio.wait_for(self.waiter, timeout)
        finally:
            self.waiter = None

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.write(DISCONNECT)
            self.transport.close()


# ---- the plan of a run ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Load:
    """What to run against host:port. Publishers publish to `<prefix>/<i>` (or all to `<prefix>/0` when
    one_topic), subscribers subscribe to that topic (one_topic) or `<prefix>/#`."""
    host: str
    port: int
    seconds: float = 5.0
    publishers: int = 1
    subscribers: int = 0
    qos: int = 0                # of the publishes
    sub_qos: int = 0            # of the subscriptions
    inflight: int = 256         # publishes unconfirmed over all publishers (QoS 0: whole chunks, at least one)
    rate: float = 0.0           # total publishes a second (0: as fast as the windows let)
    size: int = 128             # payload bytes
    processes: int = 2
    one_topic: bool = False
    quiet: float = 5.0          # a subscriber stops waiting for the rest after this long without a delivery
    drain: float = 30.0         # at most this long after the window for the answers and deliveries still due
    chunk: int = QOS0_CHUNK     # QoS 0 publishes a PINGREQ confirms (flat out)
    backlog: int = 0            # deliveries on their way allowed (0: no limit); publishers pause above it, so
                                # that the subscribers, not the broker's queues, set the pace of a fan-out
    connect_timeout: float = 60.0
    prefix: str = ""            # topic prefix (default: smartgo-bench/<random>)

    def topic(self, publisher: int) -> str:
        return f"{self.prefix}/{0 if self.one_topic else publisher}"

    def topic_filter(self) -> str:
        return self.topic(0) if self.one_topic else f"{self.prefix}/#"


@dataclass(frozen=True, slots=True)
class Part:
    """One worker process's share: publisher indexes, their windows, its subscriber count."""
    worker: int
    publishers: tuple[int, ...]
    windows: tuple[int, ...]
    subscribers: int


def split(load: Load) -> list[Part]:
    """Connections dealt round-robin over the processes; the in-flight total dealt over the publishers."""
    n = max(1, min(load.processes, load.publishers + load.subscribers))
    windows = [load.inflight // load.publishers + (1 if i < load.inflight % load.publishers else 0)
               for i in range(load.publishers)]
    if min(windows, default=1) < 1:
        raise ValueError(f"--inflight {load.inflight} < {load.publishers} publishers: each needs one at least")
    if not load.qos:            # chunks, each confirmed by its PINGREQ
        windows = [max(1, w // load.chunk) for w in windows]
    parts = []
    for w in range(n):
        pubs = tuple(range(w, load.publishers, n))
        subs = load.subscribers // n + (1 if n - 1 - w < load.subscribers % n else 0)   # from the last one
        parts.append(Part(w, pubs, tuple(windows[i] for i in pubs), subs))
    return parts


@dataclass
class Result:
    """A run's figures: rates over the measured window, totals after the drain."""
    scenario: str
    broker: str
    seconds: float
    publishers: int
    subscribers: int
    qos: int
    sent: int                   # publishes written
    accepted: int               # confirmed within the window
    accepted_total: int         # confirmed in all
    delivered: int              # deliveries within the window (all subscribers)
    delivered_total: int        # deliveries in all
    expected_deliveries: int    # sent x subscribers (each subscriber matches every publish)
    msgs_s: float
    deliveries_s: float
    ack_p50_ms: float | None
    ack_p99_ms: float | None
    delivery_p50_ms: float | None
    delivery_p99_ms: float | None
    errors: int
    error_lines: list[str] = field(default_factory=list)
    loadgen_cpu_s: float = 0.0

    @property
    def p50_ms(self) -> float | None:
        """Publish -> delivery when there are subscribers, else publish -> confirmation."""
        return self.delivery_p50_ms if self.subscribers else self.ack_p50_ms

    @property
    def p99_ms(self) -> float | None:
        return self.delivery_p99_ms if self.subscribers else self.ack_p99_ms

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "p50_ms": self.p50_ms, "p99_ms": self.p99_ms}


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(p / 100 * len(values)))], 3)


# ---- the worker process --------------------------------------------------------------------------------------

@dataclass
class _Shared:
    """What the parent and the workers share (multiprocessing objects of one context)."""
    go: Any             # Event: start (or abort, when start < 0)
    start: Any          # Value("d"): CLOCK_MONOTONIC seconds of the window's start
    published: Any      # Value("q"): publishes written, summed as publishers finish
    pubs_done: Any      # Value("i"): workers whose publishers finished
    progress: Any       # Array("q"): per worker PROGRESS figures so far
    out: Any            # Queue: one result dict per worker
    ready: Any          # Value("i"): workers connected (or failed)
    failed: Any         # Value("i"): 1 when a worker failed


PROGRESS = ("accepted", "delivered", "delivered_total", "sent")


def _worker(load: Load, part: Part, shared: _Shared, pub_workers: int) -> None:
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(_work(load, part, shared, pub_workers))
    except BaseException as exc:  # noqa: B036 - reported to the parent, which raises it
        first: BaseException = exc
        while isinstance(first, BaseExceptionGroup):    # a TaskGroup's: its first error says what happened
            first = first.exceptions[0]
        result = {"error": f"{type(first).__name__}: {first}"}
        shared.failed.value = 1
        with shared.ready.get_lock():
            shared.ready.value += 1
    finally:
        loop.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_s"] = usage.ru_utime + usage.ru_stime
    shared.out.put(result)


async def _connect(load: Load, stats: Stats, client_id: str) -> Connection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: Connection(stats), load.host, load.port)
    code = await conn.request(connect_packet(client_id), load.connect_timeout)
    if code:
        conn.close()
        raise LoadError(f"CONNACK return code {code} for {client_id}")
    return conn


async def _subscriber(load: Load, stats: Stats, client_id: str) -> Connection:
    conn = await _connect(load, stats, client_id)
    code = await conn.request(subscribe_packet(1, load.topic_filter(), load.sub_qos), load.connect_timeout)
    if code >= 0x80:
        raise LoadError(f"SUBACK refused the subscription {load.topic_filter()!r} of {client_id}")
    return conn


async def _work(load: Load, part: Part, shared: _Shared, pub_workers: int) -> dict[str, Any]:
    stats = Stats()
    run = f"{os.getpid()}-{part.worker}"
    gate = asyncio.Semaphore(64)            # connections being set up at once

    async def gated(setup: Callable[[Load, Stats, str], Awaitable[Connection]], client_id: str) -> Connection:
        async with gate:
            return await setup(load, stats, client_id)
    async with asyncio.TaskGroup() as group:      # the first failure cancels the others
        sub_tasks = [group.create_task(gated(_subscriber, f"sgb-s-{run}-{i}")) for i in range(part.subscribers)]
        pub_tasks = [group.create_task(gated(_connect, f"sgb-p-{run}-{i}")) for i in part.publishers]
    subs, pubs = [t.result() for t in sub_tasks], [t.result() for t in pub_tasks]
    for conn, index, window in zip(pubs, part.publishers, part.windows):
        conn.template = Template.of(load.topic(index), load.size, load.qos)
        conn.qos, conn.window, conn.chunk = load.qos, window, load.chunk
    with shared.ready.get_lock():
        shared.ready.value += 1
    while not shared.go.is_set():
        await asyncio.sleep(0.005)
    start = shared.start.value
    if start < 0:
        for c in [*subs, *pubs]:
            c.close()
        return {"aborted": True}
    end = start + load.seconds
    stats.end_ns = int(end * 1e9)
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    reporter = asyncio.ensure_future(_report(stats, pubs, shared, part.worker))
    if pubs:
        await (_paced(load, pubs, start, end) if load.rate else _flat_out(load, pubs, end, shared))
        await _until(lambda: not any(c.outstanding() for c in pubs), time.monotonic() + load.drain)
        with shared.published.get_lock():
            shared.published.value += sum(c.sent for c in pubs)
        with shared.pubs_done.get_lock():
            shared.pubs_done.value += 1
    if subs:
        await _until(lambda: shared.pubs_done.value >= pub_workers, end + load.drain)
        expected = shared.published.value * len(subs)
        last = [stats.delivered_total, time.monotonic()]

        def settled() -> bool:
            if stats.delivered_total != last[0]:
                last[:] = [stats.delivered_total, time.monotonic()]
            return stats.delivered_total >= expected or time.monotonic() - last[1] >= load.quiet
        await _until(settled, end + load.drain)
    reporter.cancel()
    for c in [*subs, *pubs]:
        c.close()
    await asyncio.sleep(0.05)          # let the DISCONNECTs go out
    return {"sent": sum(c.sent for c in pubs), "accepted": stats.accepted, "accepted_total": stats.accepted_total,
            "delivered": stats.delivered, "delivered_total": stats.delivered_total,
            "ack": stats.ack.values.tolist(), "delivery": stats.delivery.values.tolist(),
            "errors": stats.errors[:20], "error_count": len(stats.errors)}


async def _report(stats: Stats, pubs: list[Connection], shared: _Shared, worker: int) -> None:
    at = len(PROGRESS) * worker
    while True:
        shared.progress[at:at + len(PROGRESS)] = [stats.accepted, stats.delivered, stats.delivered_total,
                                                  sum(c.sent for c in pubs)]
        await asyncio.sleep(0.02)


def _progress(shared: _Shared, figure: str) -> int:
    return sum(shared.progress[PROGRESS.index(figure)::len(PROGRESS)])


async def _until(done: Callable[[], bool], deadline: float) -> None:
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


async def _flat_out(load: Load, pubs: list[Connection], end: float, shared: _Shared) -> None:
    """Publish as fast as the windows let until `end`; with a load.backlog, pause while more deliveries
    than that are on their way (the counts of the other workers are up to 20 ms old)."""
    paused = True
    while (now := time.monotonic()) < end:
        pause = bool(load.backlog) and (_progress(shared, "sent") * load.subscribers
                                        - _progress(shared, "delivered_total") > load.backlog)
        if paused and not pause:
            now_ns = time.monotonic_ns()
            for c in pubs:
                c.sending = True
                c.pump(now_ns)
                c.flush()
        for c in pubs:
            c.sending = not pause
        paused = pause
        await asyncio.sleep(0.002 if load.backlog else end - now)
    for c in pubs:
        c.sending = False


async def _paced(load: Load, pubs: list[Connection], start: float, end: float) -> None:
    """load.rate publishes a second over all publishers, in 2 ms ticks; a QoS 0 tick ends with a
    PINGREQ; a QoS > 0 publisher whose window is full sends what is due when answers free it."""
    each = load.rate / load.publishers
    while (now := time.monotonic()) < end:
        now_ns = time.monotonic_ns()
        for c in pubs:
            due = int(each * (now - start)) - c.sent
            if load.qos:
                for _ in range(max(0, min(due, c.window - len(c.inflight)))):
                    c.publish(now_ns)
            elif due > 0:
                c.publish_chunk(now_ns, due)
            if c.out:
                c.flush()
        await asyncio.sleep(0.002)


# ---- the parent ------------------------------------------------------------------------------------------------

def run(load: Load, scenario: str = "custom", on_tick: Callable[[float, int, int], None] | None = None,
        interval: float = 1.0) -> Result:
    """Run `load` in worker processes; on_tick(elapsed s, accepted, delivered) every interval while the
    window runs. LoadError when a connection is refused or a worker fails."""
    if load.qos not in (0, 1, 2) or load.sub_qos not in (0, 1, 2):
        raise ValueError("QoS must be 0, 1 or 2")
    if load.publishers < 1 and load.subscribers < 1:
        raise ValueError("no publisher and no subscriber: nothing to run")
    if not load.prefix:
        load = _with_prefix(load, f"smartgo-bench/{os.urandom(4).hex()}")
    parts = split(load)
    ctx = multiprocessing.get_context("spawn")
    shared = _Shared(ctx.Event(), ctx.Value("d", 0.0), ctx.Value("q", 0), ctx.Value("i", 0),
                     ctx.Array("q", len(PROGRESS) * len(parts), lock=False), ctx.Queue(), ctx.Value("i", 0),
                     ctx.Value("i", 0))
    pub_workers = sum(1 for p in parts if p.publishers)
    procs = [ctx.Process(target=_worker, args=(load, p, shared, pub_workers), daemon=True) for p in parts]
    for p in procs:
        p.start()
    try:
        return _conduct(load, scenario, parts, procs, shared, on_tick, interval)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()


def _with_prefix(load: Load, prefix: str) -> Load:
    return Load(**{**{f: getattr(load, f) for f in Load.__dataclass_fields__}, "prefix": prefix})


def _conduct(load: Load, scenario: str, parts: list[Part], procs: list[Any], shared: _Shared,
             on_tick: Callable[[float, int, int], None] | None, interval: float) -> Result:
    deadline = time.monotonic() + load.connect_timeout + 30
    while shared.ready.value < len(parts):
        if time.monotonic() > deadline or any(p.exitcode is not None for p in procs):
            break
        time.sleep(0.01)
    ok = shared.ready.value == len(parts) and not shared.failed.value
    shared.start.value = time.monotonic() + 0.05 if ok else -1.0
    shared.go.set()
    results: list[dict[str, Any]] = []
    start = shared.start.value
    next_tick = start + interval
    while len(results) < len(parts):
        try:
            results.append(shared.out.get(timeout=0.05))
        except queue.Empty:
            if all(p.exitcode is not None for p in procs) and shared.out.empty():
                raise LoadError("a load generator process died") from None
        if on_tick is not None and ok and time.monotonic() >= next_tick and next_tick <= start + load.seconds + 1e-6:
            on_tick(next_tick - start, _progress(shared, "accepted"), _progress(shared, "delivered"))
            next_tick += interval
    failed = [r["error"] for r in results if "error" in r]
    if failed or not ok:
        raise LoadError("; ".join(failed) or "the load generators did not get ready in time")
    return _result(load, scenario, results)


def _result(load: Load, scenario: str, results: list[dict[str, Any]]) -> Result:
    def total(key: str) -> int:
        return sum(r[key] for r in results)
    ack = sorted(x for r in results for x in r["ack"])
    delivery = sorted(x for r in results for x in r["delivery"])
    return Result(scenario, f"{load.host}:{load.port}", load.seconds, load.publishers, load.subscribers, load.qos,
                  total("sent"), total("accepted"), total("accepted_total"), total("delivered"),
                  total("delivered_total"), total("sent") * load.subscribers,
                  round(total("accepted") / load.seconds, 1), round(total("delivered") / load.seconds, 1),
                  percentile(ack, 50), percentile(ack, 99), percentile(delivery, 50), percentile(delivery, 99),
                  total("error_count"), [e for r in results for e in r["errors"]][:20],
                  round(sum(r["cpu_s"] for r in results), 2))


# ---- the scenarios of benchmarks/bench_mqtt.py ------------------------------------------------------------------

def qos0_publish(host: str, port: int, seconds: float = 5.0, publishers: int = 16, inflight_each: int = 256,
                 processes: int = 2, size: int = 128, **kw: Any) -> Result:
    """Many QoS 0 publishers as fast as the broker takes them in: chunks of QOS0_CHUNK, each confirmed
    by a PINGREQ, `inflight_each` publishes unconfirmed a publisher."""
    return run(Load(host, port, seconds, publishers, qos=0, inflight=inflight_each * publishers, size=size,
                    processes=processes), "qos0_publish", **kw)


def qos1_publish(host: str, port: int, seconds: float = 5.0, publishers: int = 16, inflight: int = 256,
                 processes: int = 2, size: int = 128, **kw: Any) -> Result:
    """QoS 1 publishers with `inflight` publishes awaiting their PUBACK in all."""
    return run(Load(host, port, seconds, publishers, qos=1, inflight=inflight, size=size, processes=processes),
               "qos1_publish", **kw)


def fanout(host: str, port: int, seconds: float = 5.0, subscribers: int = 1000, qos: int = 0, processes: int = 2,
           size: int = 128, inflight: int = 16, backlog: int = 64, **kw: Any) -> Result:
    """One publisher, `subscribers` subscribers of its one topic: deliveries/s. The publisher has
    `inflight` publishes unconfirmed at most (QoS 0: one per PINGREQ) and pauses while more than
    `backlog` a subscriber are on their way."""
    return run(Load(host, port, seconds, 1, subscribers, qos=qos, sub_qos=qos, inflight=inflight, size=size,
                    processes=processes, one_topic=True, chunk=1, backlog=backlog * subscribers), "fanout", **kw)


def latency(host: str, port: int, seconds: float = 5.0, rate: float = 2000.0, qos: int = 1, processes: int = 2,
            size: int = 128, **kw: Any) -> Result:
    """One publisher at a fixed rate, one subscriber: publish -> delivery p50/p99."""
    return run(Load(host, port, seconds, 1, 1, qos=qos, sub_qos=qos, inflight=1000, rate=rate, size=size,
                    processes=processes, one_topic=True), "latency", **kw)


SCENARIOS: dict[str, Callable[..., Result]] = {"qos0_publish": qos0_publish, "qos1_publish": qos1_publish,
                                               "fanout": fanout, "latency": latency}

