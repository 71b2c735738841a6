"""A load generator for very many idle MQTT connections (issue 45: a million devices on one node).

Each device is one MQTT 3.1.1 connection: CONNECT (client id `d<id>`, keep-alive 300 s), CONNACK,
SUBSCRIBE `devices/<id>/cmd`, SUBACK, then idle: it answers the commands it gets (PUBACK) and sends a
PINGREQ often enough to stay alive. The connections live in worker processes (spawned), each holding at
most `per_worker` of them (the per-process descriptor limit), each an epoll loop over raw non-blocking
sockets whose state is a few arrays indexed by file descriptor: no object, buffer or timer per
connection, so the generator costs little next to the broker it measures. Source addresses run
127.0.0.2, 127.0.0.3, ... (`per_source` devices each, each device on its own source port, bound with
SO_REUSEADDR), so more than 28,000 connections fit, and sockets left in TIME_WAIT by an earlier run
(towards another port, or reused as loopback allows) never make a connect fail.

The parent drives the workers over pipes: small control messages, and the bulky figures (ping round
trips, command arrivals) as raw arrays (send_bytes), never pickled. Failures are counted by reason:
`refused`, `reset`, `closed by the broker`, `CONNACK <code>`, `SUBACK <code>`, `timeout (no CONNACK)`, ...;
a connection lost after it was set up counts as `lost: <reason>`.

Devices may be spread over the nodes of a cluster (`ports`: device i on ports[i mod K]). With `reconnect`,
a device whose connection the broker closes connects again at once (same client id and clean flag, as a
real device after a broker restart); a failed attempt (refused, reset, CONNACK 3 "server unavailable",
no CONNACK in time, ...) is tried again after a backoff that doubles from `retry_min` up to `retry_max` s,
randomized by +-50 % so that the devices spread out. A device whose CONNACK
says session present goes back to idle without subscribing again (its subscription is the session's);
`reconnected` counts those CONNACKs, `resumed` the ones with session present, and `reconnects()` the closes
and retries by reason.
"""

from __future__ import annotations

import errno
import heapq
import math
import multiprocessing
import os
import random
import resource
import select
import socket
import struct
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smartgo.mqtt.loadgen import (PUBACK, ack_packet, connect_packet, packet_bounds, percentile, publish_packet,
                                  subscribe_packet)

_TS = struct.Struct(">q")
_U16 = struct.Struct(">H")
_ADDR = struct.Struct(">I")
PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
#: connection states, a bytearray indexed by file descriptor
FREE, CONNECTING, CONNACK_WAIT, SUBACK_WAIT, IDLE = range(5)
#: shared counters of a worker, in its Array("q")
COUNTERS = ("tcp", "connacked", "subscribed", "failed", "lost", "open", "pongs", "commands",
            "dropped", "reconnected", "resumed", "retries", "back_ns")
_C = {name: i for i, name in enumerate(COUNTERS)}
_LATEST = ("back_ns",)      # CLOCK_MONOTONIC ns of the last reconnect: the latest over the workers, not a sum
TICK = 0.25                 # seconds between a worker's timeout, keep-alive and counter rounds
ARRIVAL_FIELDS = 4          # device, send time ns (from the payload), arrival time ns, 1 if the topic was its own


class SwarmError(Exception):
    """A worker died or did not answer."""


@dataclass(frozen=True, slots=True)
class SwarmConfig:
    host: str
    port: int
    keep_alive: int = 300
    clean: bool = True              # False: a persistent session (3.1.1 clean session 0)
    sub_qos: int = 1
    per_worker: int = 18_000        # connections a worker process holds at most (descriptor limit 20,000)
    per_source: int = 25_000        # devices per source address: 127.0.0.<first_source + id // per_source>
    first_source: int = 2
    first_port: int = 10_000        # device id's source port: first_port + id % per_source (0: the kernel's pick)
    window: int = 128               # connections being set up at once in a worker
    connect_timeout: float = 30.0   # from connect() to SUBACK
    id_prefix: str = "d"
    topic: str = "devices/{}/cmd"
    ports: tuple[int, ...] = ()     # the nodes' MQTT ports: device i connects to ports[i % len]; () = port
    reconnect: bool = False         # a device connects again when the broker closes its connection
    retry_min: float = 0.1          # seconds before a failed reconnect is tried again, doubling with each
    retry_max: float = 3.0          # failure up to retry_max; each randomized by +-50 %
    reconnect_window: int = 1000    # reconnects being set up at once in a worker (devices storm a restarted node)

    def __post_init__(self) -> None:
        if self.first_port and self.first_port + self.per_source > 65536:
            raise ValueError(f"source ports {self.first_port} + {self.per_source} devices run past 65535")

    def source(self, device: int) -> tuple[str, int]:
        """The device's source address and port."""
        addr = socket.inet_ntoa(_ADDR.pack(0x7F000000 + self.first_source + device // self.per_source))
        return addr, self.first_port + device % self.per_source if self.first_port else 0

    def target(self, device: int) -> tuple[str, int]:
        """The broker address the device connects to."""
        return self.host, self.ports[device % len(self.ports)] if self.ports else self.port


def _bind(sock: socket.socket, source: tuple[str, int]) -> None:
    """Bind to the device's own source port: connect() then has no port to search for (the kernel's
    search over a nearly full range costs more system time than the rest of the set-up). A port
    some other socket holds (a listener on 0.0.0.0): the kernel picks one at connect()."""
    if source[1]:
        try:
            sock.bind(source)
            return
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
    sock.bind((source[0], 0))


def _reason(err: int) -> str:
    return {errno.ECONNREFUSED: "refused", errno.ECONNRESET: "reset", errno.ETIMEDOUT: "timeout (TCP)",
            errno.EADDRNOTAVAIL: "no free source port (EADDRNOTAVAIL)", errno.EMFILE: "descriptor limit (EMFILE)",
            errno.EPIPE: "reset"}.get(err, errno.errorcode.get(err, str(err)))


# ---- a worker process ---------------------------------------------------------------------------------------

class _Worker:
    """One process's connections: an epoll loop, state in arrays indexed by file descriptor."""

    def __init__(self, cfg: SwarmConfig, pipe: Any, counters: Any) -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self.slots = hard
        self.cfg = cfg
        self.pipe = pipe
        self.counters = counters
        self.ep = select.epoll()
        self.socks: list[socket.socket | None] = [None] * hard
        self.state = bytearray(hard)
        self.device = array("q", bytes(8 * hard))
        self.kpend = bytearray(hard)                  # keep-alive PINGREQs unanswered
        self.again = bytearray(hard)                  # 1: the connection being set up is a reconnect
        self.last_sent = array("d", bytes(8 * hard))  # monotonic s of the last packet written
        self.pending: dict[int, float] = {}           # fd -> set-up deadline
        self.tails: dict[int, bytes] = {}             # fd -> a packet's first bytes (rare: packets are tiny)
        self.todo: list[range] = []                   # devices still to open
        self.retry: list[tuple[float, int]] = []      # heap of (monotonic s due, device): reconnects to make
        self.attempts: dict[int, int] = {}            # device -> reconnects failed in a row
        self.storm: Counter[str] = Counter()          # connections closed and reconnects retried, by reason
        self.batch = 0                                # connections of the open request not yet done
        self.batch_failures: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.tcp_last = self.done_last = 0.0
        self.pings: dict[int, int] = {}               # fd -> send time ns of a measured PINGREQ
        self.ping_queue: list[int] = []
        self.ping_at = 0.0                            # monotonic s the next measured ping is due
        self.ping_gap = 0.0
        self.ping_deadline = 0.0
        self.ping_active = False
        self.ping_sent = 0
        self.rtts = array("d")
        self.arrivals = array("q")
        self.cursor = 0                               # the keep-alive walk
        self.running = True

    # -- the loop
    def run(self) -> None:
        pipe_fd = self.pipe.fileno()
        self.ep.register(pipe_fd, select.EPOLLIN)
        next_tick = 0.0
        while self.running:
            self.launch()
            busy = self.todo or self.pending or self.ping_active or self.retry
            for fd, _ in self.ep.poll(0.02 if busy else TICK, 4096):
                if fd == pipe_fd:
                    self.control(self.pipe.recv())
                elif self.state[fd] == CONNECTING:
                    self.connected(fd)
                else:
                    self.readable(fd)
            now = time.monotonic()
            if self.ping_active:
                self.ping_round(now)
            if now >= next_tick:
                next_tick = now + TICK
                self.expire(now)
                self.keep_alive(now)

    def control(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "open":
            self.todo.append(range(msg["first"], msg["first"] + msg["count"]))
            self.batch += msg["count"]
            self.batch_failures.clear()
            self.tcp_last = self.done_last = 0.0
            if not self.batch:
                self.batch_done()
        elif op == "ping":
            every = max(1, msg["every"])
            idle = [fd for fd in range(self.slots) if self.state[fd] == IDLE]
            self.ping_queue = idle[msg["offset"] % every::every]
            self.ping_queue.reverse()
            self.ping_sent = 0
            self.rtts = array("d")
            self.ping_gap = msg["spread"] / max(1, len(self.ping_queue))
            self.ping_at = time.monotonic()
            self.ping_deadline = self.ping_at + msg["spread"] + msg["timeout"]
            self.ping_active = True
        elif op == "arrivals":
            self.pipe.send_bytes(self.arrivals.tobytes())
            self.arrivals = array("q")
        elif op == "failures":
            self.pipe.send(dict(self.failures))
        elif op == "reconnects":
            self.pipe.send(dict(self.storm))
        elif op == "sources":
            self.pipe.send(dict(Counter(sock.getsockname()[0] for fd, sock in enumerate(self.socks)
                                        if sock is not None and self.state[fd] == IDLE)))
        elif op == "close":
            self.close_all()
            self.pipe.send({"op": "closed"})
            self.running = False

    # -- setting connections up
    def launch(self) -> None:
        """Start set-ups up to the windows: reconnects that are due first, then new devices."""
        now = time.monotonic()
        while True:
            setting_up = len(self.pending)
            if self.retry and self.retry[0][0] <= now and setting_up < self.cfg.reconnect_window:
                self.open(heapq.heappop(self.retry)[1], True)
            elif self.todo and setting_up < self.cfg.window:
                devices = self.todo[0]
                self.todo[0] = devices[1:]
                if not self.todo[0]:
                    self.todo.pop(0)
                self.open(devices[0], False)
            else:
                return

    def open(self, device: int, again: bool) -> None:
        cfg = self.cfg
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError as exc:
            self.not_set_up(device, again, _reason(exc.errno or 0))
            return
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            addr, port = cfg.source(device)
            # a reconnect: the kernel's pick of port, the last connection's may still be in TIME_WAIT at the broker
            _bind(sock, (addr, 0 if again else port))
            err = sock.connect_ex(cfg.target(device))
        except OSError as exc:
            err = exc.errno or 0
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            self.not_set_up(device, again, _reason(err))
            return
        fd = sock.fileno()
        self.socks[fd] = sock
        self.device[fd] = device
        self.state[fd] = CONNECTING
        self.again[fd] = again
        self.pending[fd] = time.monotonic() + cfg.connect_timeout
        self.ep.register(fd, select.EPOLLOUT)

    def not_set_up(self, device: int, again: bool, reason: str) -> None:
        """A set-up failed: a reconnect is tried again after a random backoff, a new device counts as failed."""
        if not again:
            self.setup_failed(reason)
            return
        self.counters[_C["retries"]] += 1
        self.storm[f"retry: {reason}"] += 1
        failed = self.attempts[device] = self.attempts.get(device, 0) + 1
        backoff = min(self.cfg.retry_max, self.cfg.retry_min * 2 ** min(failed - 1, 30))
        heapq.heappush(self.retry, (time.monotonic() + backoff * random.uniform(0.5, 1.5), device))

    def connected(self, fd: int) -> None:
        sock = self.socks[fd]
        assert sock is not None
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.drop(fd, _reason(err))
            return
        self.counters[_C["tcp"]] += 1
        self.tcp_last = time.monotonic()
        self.ep.modify(fd, select.EPOLLIN)
        self.state[fd] = CONNACK_WAIT
        self.write(fd, connect_packet(f"{self.cfg.id_prefix}{self.device[fd]}", self.cfg.keep_alive, self.cfg.clean))

    def setup_failed(self, reason: str) -> None:
        self.counters[_C["failed"]] += 1
        self.failures[reason] += 1
        self.batch_failures[reason] += 1
        self.one_done()

    def one_done(self) -> None:
        self.batch -= 1
        if not self.batch:
            self.batch_done()

    def batch_done(self) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.pipe.send({"op": "opened", "failures": dict(self.batch_failures), "tcp_last": self.tcp_last,
                        "done_last": self.done_last, "cpu_s": usage.ru_utime + usage.ru_stime})

    def expire(self, now: float) -> None:
        late = [fd for fd, deadline in self.pending.items() if deadline <= now]
        for fd in late:
            what = {CONNECTING: "TCP connect", CONNACK_WAIT: "CONNACK", SUBACK_WAIT: "SUBACK"}[self.state[fd]]
            self.drop(fd, f"timeout (no {what})")

    # -- traffic
    def write(self, fd: int, data: bytes) -> None:
        sock = self.socks[fd]
        assert sock is not None
        try:
            sent = sock.send(data)
        except OSError as exc:
            self.drop(fd, _reason(exc.errno or 0))
            return
        if sent != len(data):           # a few bytes to an idle socket: its buffer is never full
            self.drop(fd, "send buffer full")
            return
        self.last_sent[fd] = time.monotonic()

    def readable(self, fd: int) -> None:
        sock = self.socks[fd]
        if sock is None:
            return
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            self.drop(fd, _reason(exc.errno or 0))
            return
        if not data:
            self.drop(fd, "closed by the broker")
            return
        tail = self.tails.pop(fd, None)
        if tail:
            data = tail + data
        i = 0
        while (bounds := packet_bounds(data, i)) is not None:
            if not self.packet(fd, data[i], data, *bounds):
                return                  # the connection was dropped
            i = bounds[1]
        if i < len(data):
            self.tails[fd] = data[i:]

    def packet(self, fd: int, first: int, data: bytes, at: int, end: int) -> bool:
        """Handle one packet; False when it ended the connection."""
        kind = first & 0xF0
        state = self.state[fd]
        if kind == 0x30:                # PUBLISH: a command
            return self.command(fd, first, data, at, end)
        if kind == 0xD0:                # PINGRESP
            if self.kpend[fd]:
                self.kpend[fd] -= 1
            elif (sent := self.pings.pop(fd, None)) is not None:
                self.rtts.append((time.monotonic_ns() - sent) / 1e6)
                self.counters[_C["pongs"]] += 1
            return True
        if kind == 0x20 and state == CONNACK_WAIT:
            code = data[end - 1]
            if code:
                self.drop(fd, f"CONNACK {code}")
                return False
            self.counters[_C["connacked"]] += 1
            if self.again[fd]:
                self.resumed(fd, data[at] & 1)
                return True
            self.state[fd] = SUBACK_WAIT
            self.write(fd, subscribe_packet(1, self.cfg.topic.format(self.device[fd]), self.cfg.sub_qos))
            return self.state[fd] == SUBACK_WAIT
        if kind == 0x90 and state == SUBACK_WAIT:
            code = data[end - 1]
            if code >= 0x80:
                self.drop(fd, f"SUBACK {code:#x}")
                return False
            self.state[fd] = IDLE
            del self.pending[fd]
            self.counters[_C["subscribed"]] += 1
            self.counters[_C["open"]] += 1
            self.done_last = time.monotonic()
            self.one_done()
            return True
        self.drop(fd, f"unexpected packet {first:#x}")
        return False

    def resumed(self, fd: int, present: int) -> None:
        """A reconnect's CONNACK: idle again at once, subscribed or not as the session says (a device
        whose session was lost stays without its subscription: it counts, and gets no commands)."""
        self.again[fd] = 0
        self.state[fd] = IDLE
        del self.pending[fd]
        self.attempts.pop(self.device[fd], None)
        self.counters[_C["reconnected"]] += 1
        self.counters[_C["resumed"]] += present
        self.counters[_C["open"]] += 1
        self.counters[_C["back_ns"]] = time.monotonic_ns()
        if not present:
            self.storm["session lost"] += 1

    def command(self, fd: int, first: int, data: bytes, at: int, end: int) -> bool:
        now = time.monotonic_ns()
        size = _U16.unpack_from(data, at)[0]
        topic = data[at + 2:at + 2 + size]
        p = at + 2 + size
        if first & 0x06:
            self.write(fd, ack_packet(PUBACK, _U16.unpack_from(data, p)[0]))
            p += 2
        device = self.device[fd]
        sent = _TS.unpack_from(data, p)[0] if end - p >= 8 else 0
        own = topic == self.cfg.topic.format(device).encode()
        self.arrivals.extend((device, sent, now, int(own)))
        self.counters[_C["commands"]] += 1
        return self.state[fd] != FREE

    def ping_round(self, now: float) -> None:
        """Send the measured PINGREQs that are due; report once all are answered or the deadline passed."""
        while self.ping_queue and self.ping_at <= now:
            fd = self.ping_queue.pop()
            self.ping_at += self.ping_gap
            if self.state[fd] == IDLE and fd not in self.pings:
                self.pings[fd] = time.monotonic_ns()
                self.ping_sent += 1
                self.write(fd, PINGREQ)
        if (not self.ping_queue and not self.pings) or now >= self.ping_deadline:
            self.ping_active = False
            self.ping_queue = []
            self.pipe.send({"op": "pinged", "sent": self.ping_sent, "unanswered": len(self.pings)})
            self.pipe.send_bytes(self.rtts.tobytes())
            self.pings.clear()

    def keep_alive(self, now: float) -> None:
        """Walk the descriptors so that a full walk takes half the keep-alive; ping an idle
        connection that wrote nothing for that long."""
        if not self.cfg.keep_alive:
            return
        half = self.cfg.keep_alive / 2
        step = max(1, math.ceil(self.slots * TICK / half))
        start, self.cursor = self.cursor, (self.cursor + step) % self.slots
        for fd in range(start, min(start + step, self.slots)):
            if self.state[fd] == IDLE and now - self.last_sent[fd] >= half and fd not in self.pings:
                self.kpend[fd] += 1
                self.write(fd, PINGREQ)

    # -- the end of a connection
    def drop(self, fd: int, reason: str) -> None:
        state = self.state[fd]
        sock = self.socks[fd]
        if state == FREE or sock is None:
            return
        self.ep.unregister(fd)
        sock.close()
        self.socks[fd] = None
        self.state[fd] = FREE
        self.kpend[fd] = 0
        self.tails.pop(fd, None)
        self.pings.pop(fd, None)
        again, self.again[fd] = self.again[fd], 0
        if state != IDLE:
            del self.pending[fd]
            self.not_set_up(self.device[fd], bool(again), reason)
            return
        self.counters[_C["open"]] -= 1
        if self.cfg.reconnect:
            self.counters[_C["dropped"]] += 1
            self.storm[f"dropped: {reason}"] += 1
            heapq.heappush(self.retry, (time.monotonic(), self.device[fd]))     # at once, as a device does
        else:
            self.counters[_C["lost"]] += 1
            self.failures[f"lost: {reason}"] += 1

    def close_all(self) -> None:
        self.retry.clear()
        for fd, sock in enumerate(self.socks):
            if sock is None:
                continue
            if self.state[fd] == IDLE:
                try:
                    sock.send(DISCONNECT)
                except OSError:
                    pass
            sock.close()
            self.socks[fd] = None
            self.state[fd] = FREE
        self.counters[_C["open"]] = 0


def _worker_main(cfg: SwarmConfig, pipe: Any, counters: Any) -> None:
    worker = _Worker(cfg, pipe, counters)
    pipe.send({"op": "ready"})
    try:
        worker.run()
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        worker.close_all()          # the parent went away: leave nothing open


# ---- the parent -----------------------------------------------------------------------------------------------

@dataclass
class Grown:
    """What one grow() did: every device it asked for is subscribed or failed."""
    requested: int
    subscribed: int
    failures: dict[str, int]
    seconds: float                  # from the request to the last SUBACK (or failure)
    rate: float                     # connections set up (SUBACK) a second
    accept_rate: float              # TCP connections established a second
    cpu_s: float                    # the load generator's CPU (user + system, all workers) so far

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


@dataclass
class Pinged:
    sent: int
    answered: int
    rtts_ms: list[float] = field(repr=False)

    def percentile(self, p: float) -> float | None:
        return percentile(sorted(self.rtts_ms), p)


@dataclass(frozen=True, slots=True)
class Arrival:
    device: int                     # the connection's device
    sent_ns: int                    # CLOCK_MONOTONIC ns stamped in the payload's first 8 bytes (0: none)
    arrived_ns: int
    own_topic: bool                 # the PUBLISH's topic was this device's command topic

    @property
    def latency_ms(self) -> float:
        return (self.arrived_ns - self.sent_ns) / 1e6


@dataclass
class _Handle:
    proc: Any
    pipe: Any
    counters: Any
    devices: int = 0                # assigned to it


class Swarm:
    """Worker processes holding devices 0 .. devices-1; grow() opens more. Use as a context manager."""

    def __init__(self, cfg: SwarmConfig) -> None:
        self.cfg = cfg
        self.ctx = multiprocessing.get_context("spawn")
        self.workers: list[_Handle] = []
        self.devices = 0

    def __enter__(self) -> Swarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self) -> _Handle:
        parent, child = self.ctx.Pipe()
        counters = self.ctx.Array("q", len(COUNTERS), lock=False)
        proc = self.ctx.Process(target=_worker_main, args=(self.cfg, child, counters), daemon=True,
                                name=f"swarm-{len(self.workers)}")
        proc.start()
        child.close()
        handle = _Handle(proc, parent, counters)
        self.workers.append(handle)
        self._recv(handle, 60)          # imported and listening: grow() times connections, not start-ups
        return handle

    def _recv(self, h: _Handle, timeout: float) -> Any:
        if not h.pipe.poll(timeout):
            raise SwarmError(f"worker {h.proc.pid} did not answer within {timeout:.0f} s")
        try:
            return h.pipe.recv()
        except (EOFError, OSError):
            raise SwarmError(f"worker {h.proc.pid} died (exit code {h.proc.exitcode})") from None

    def counts(self) -> dict[str, int]:
        """The workers' counters summed (COUNTERS; back_ns: the latest)."""
        return {name: (max if name in _LATEST else sum)([0, *(h.counters[i] for h in self.workers)])
                for i, name in enumerate(COUNTERS)}

    def grow(self, n: int, progress: Callable[[dict[str, int], float], None] | None = None,
             interval: float = 0.5) -> Grown:
        """Open n more devices (ids devices .. devices+n-1), spread evenly over as many workers as
        per_worker requires (started first, outside the time measured); return once each is
        subscribed or failed."""
        total = self.devices + n
        while len(self.workers) < math.ceil(total / self.cfg.per_worker):
            self._spawn()
        start = time.monotonic()
        share, extra = divmod(total, len(self.workers))
        asked = []
        for i, h in enumerate(self.workers):
            count = max(0, share + (i < extra) - h.devices)
            if count:
                h.pipe.send({"op": "open", "first": self.devices, "count": count})
                self.devices += count
                h.devices += count
                asked.append(h)
        before = self.counts()
        replies: list[dict] = []
        waiting = list(asked)
        next_report = start + interval
        while waiting:
            for h in list(waiting):
                if h.pipe.poll():
                    replies.append(self._recv(h, 0))
                    waiting.remove(h)
                elif not h.proc.is_alive():
                    raise SwarmError(f"worker {h.proc.pid} died (exit code {h.proc.exitcode})")
            now = time.monotonic()
            if progress is not None and now >= next_report:
                progress(self.counts(), now - start)
                next_report = now + interval
            if waiting:
                waiting[0].pipe.poll(0.05)
        failures: Counter[str] = Counter()
        for r in replies:
            failures.update(r["failures"])
        after = self.counts()
        done = max([r["done_last"] for r in replies] + [start])
        tcp = max([r["tcp_last"] for r in replies] + [start])
        subscribed = after["subscribed"] - before["subscribed"]
        accepted = after["tcp"] - before["tcp"]
        return Grown(n, subscribed, dict(failures), round(max(done, tcp) - start, 3),
                     round(subscribed / max(done - start, 1e-6), 1), round(accepted / max(tcp - start, 1e-6), 1),
                     round(sum(r["cpu_s"] for r in replies), 2))

    def ping(self, sample: int = 0, spread: float = 1.0, timeout: float = 30.0) -> Pinged:
        """A PINGREQ to `sample` open connections (0: all), spread evenly over `spread` seconds;
        the round trip of each that is answered within `timeout` after the last is sent."""
        open_now = max(1, self.counts()["open"])
        every = max(1, open_now // sample) if sample else 1
        for i, h in enumerate(self.workers):
            h.pipe.send({"op": "ping", "every": every, "offset": i, "spread": spread, "timeout": timeout})
        sent = answered = 0
        rtts: list[float] = []
        for h in self.workers:
            r = self._recv(h, spread + timeout + 30)
            sent += r["sent"]
            answered += r["sent"] - r["unanswered"]
            rtts += array("d", h.pipe.recv_bytes()).tolist()
        return Pinged(sent, answered, rtts)

    def arrivals(self) -> list[Arrival]:
        """The commands received since the last call, by every worker."""
        out: list[Arrival] = []
        for h in self.workers:
            h.pipe.send({"op": "arrivals"})
        for h in self.workers:
            if not h.pipe.poll(30):
                raise SwarmError(f"worker {h.proc.pid} did not answer within 30 s")
            flat = array("q", h.pipe.recv_bytes())
            out += [Arrival(flat[i], flat[i + 1], flat[i + 2], bool(flat[i + 3]))
                    for i in range(0, len(flat), ARRIVAL_FIELDS)]
        return out

    def _summed(self, op: str) -> dict[str, int]:
        total: Counter[str] = Counter()
        for h in self.workers:
            h.pipe.send({"op": op})
        for h in self.workers:
            total.update(self._recv(h, 30))
        return dict(total)

    def failures(self) -> dict[str, int]:
        """Every failure so far, by reason (set-up failures and `lost: ...` connections)."""
        return self._summed("failures")

    def reconnects(self) -> dict[str, int]:
        """Connections the broker closed (`dropped: <reason>`), reconnects tried again (`retry: <reason>`)
        and reconnects whose session was gone (`session lost`), so far."""
        return self._summed("reconnects")

    def sources(self) -> dict[str, int]:
        """The open connections by source address, as the kernel has them bound (getsockname)."""
        return self._summed("sources")

    def pids(self) -> list[int]:
        return [h.proc.pid for h in self.workers if h.proc.pid is not None]

    def close(self, timeout: float = 60.0) -> None:
        """DISCONNECT and close every connection, end the workers."""
        for h in self.workers:
            try:
                h.pipe.send({"op": "close"})
            except (BrokenPipeError, OSError):
                pass
        for h in self.workers:
            try:
                if h.pipe.poll(timeout):
                    h.pipe.recv()
            except (EOFError, OSError):
                pass
            h.proc.join(10)
            if h.proc.is_alive():
                h.proc.kill()
                h.proc.join(5)
            h.pipe.close()
        self.workers.clear()


# ---- the device that sends commands ---------------------------------------------------------------------------

class Commander:
    """One MQTT connection that publishes commands stamped with their send time (CLOCK_MONOTONIC ns,
    one clock for every process of the host) to `devices/<id>/cmd`."""

    def __init__(self, host: str, port: int, client_id: str = "commander", qos: int = 1,
                 topic: str = "devices/{}/cmd", timeout: float = 10.0) -> None:
        self.qos = qos
        self.topic = topic
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.sendall(connect_packet(client_id, 300, True))
        if self._read_packet()[0] != 0x20:
            raise SwarmError("the commander got no CONNACK")
        self.next_id = 0
        self.unacked: set[int] = set()

    def _read_packet(self) -> tuple[int, bytes]:
        head = self._exactly(2)
        length, shift, b = 0, 0, head[1]
        while True:
            length |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            b = self._exactly(1)[0]
        return head[0], self._exactly(length)

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise SwarmError("the broker closed the commander's connection")
            buf += chunk
        return buf

    def send(self, device: int, pad: int = 8) -> int:
        """Publish a command to the device; its send time stamp (ns)."""
        packet_id = 0
        if self.qos:
            self.next_id = packet_id = self.next_id % 0xFFFF + 1
            self.unacked.add(packet_id)
        stamp = time.monotonic_ns()
        self.sock.sendall(publish_packet(self.topic.format(device), _TS.pack(stamp) + bytes(pad), self.qos,
                                         packet_id))
        return stamp

    def drain(self, timeout: float = 10.0) -> int:
        """Wait for the PUBACKs still due; the number still missing."""
        deadline = time.monotonic() + timeout
        while self.unacked and time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                kind, body = self._read_packet()
            except TimeoutError:
                break
            if kind & 0xF0 == PUBACK:
                self.unacked.discard(_U16.unpack_from(body)[0])
        return len(self.unacked)

    def close(self) -> None:
        try:
            self.sock.sendall(DISCONNECT)
        except OSError:
            pass
        self.sock.close()


PSS_FIELDS = ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")


def pss_parts(pid: int) -> dict[str, int]:
    """A process's proportional set size (KiB, /proc/PID/smaps_rollup) and its anonymous, file-mapped
    and shared-memory parts; zeros once it is gone."""
    parts = dict.fromkeys(PSS_FIELDS, 0)
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in parts:
                    parts[name] = int(rest.split()[0])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return parts


def pss_kib(pid: int) -> int:
    return pss_parts(pid)["Pss"]


def tcp_mem_kib() -> int:
    """The kernel's TCP socket memory now (the `mem` pages of /proc/net/sockstat), in KiB."""
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                fields = line.split()
                return int(fields[fields.index("mem") + 1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    return 0


#: the kernel's slab caches a TCP socket held by a process costs (the socket, its inode, file and dentry, an
#: epoll entry)
SOCKET_SLABS = ("TCP", "sock_inode_cache", "filp", "dentry", "eventpoll_epi")


def socket_slab_kib() -> int | None:
    """The KiB the SOCKET_SLABS caches hold machine-wide (active objects x size); None when
    /proc/slabinfo is not readable (it needs root)."""
    try:
        with open("/proc/slabinfo") as f:
            rows = [line.split() for line in f]
    except OSError:
        return None
    return sum(int(r[1]) * int(r[3]) for r in rows if r and r[0] in SOCKET_SLABS) // 1024
