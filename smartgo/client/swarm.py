"""A load generator for very many RocketMQ client connections to a broker (issue 45: 100,000 clients
heartbeating every 30 s).

Each simulated client is one TCP connection to the broker's remoting port behaving like a RocketMQ 4.x
Java push consumer's connection: a HEART_BEAT (34) right after connect and then one every
`heartbeat_interval` seconds, in the Java client's encoding (JSON header, language JAVA, version 4.9.8,
a rising opaque; HeartbeatData body with its own clientID `<source address>@<tag>#<n>`, consumer group
`<group_prefix><n % groups>`, CLUSTERING, CONSUME_PASSIVELY, one subscription to `topic` "*", and the
CLIENT_INNER_PRODUCER producer group every Java client instance reports). It checks each response
(SUCCESS, else counted by code and remark) and times it; requests the broker pushes
(NOTIFY_CONSUMER_IDS_CHANGED when a group's members change) are counted by code.

The sockets are smartgo.mqtt.swarm's, whose worker and parent classes this module extends (its
SwarmConfig names the broker, the source addresses and ports and the processes' share; its worker opens,
times out, drops and counts the connections): worker processes of at most `per_worker` raw non-blocking
sockets each, an epoll loop whose per-connection state is a few arrays indexed by file descriptor. What
is RocketMQ's is here: the first HEART_BEAT takes the place of CONNECT and SUBSCRIBE (a client counts
as `subscribed` once it is answered SUCCESS), frames are read with smartgo.net.frame, and the keep-alive
walk sends heartbeats. A heartbeat body is two precomputed halves per group around the client id, so
the generator costs little next to the broker it measures. Heartbeats are spread evenly: a walk over the descriptors
takes one interval, and a connection whose turn comes sends its next heartbeat (unless the last
one is still unanswered: it is then counted as late).

The subscription's subVersion is one value for the whole swarm (a Java consumer stamps it when it
subscribes): with a version per client the broker would see each new client's subscription as newer
and re-publish the group's state at every join.
"""

from __future__ import annotations

import os
import socket
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from smartgo.client import api
from smartgo.client.subscription import build_subscription
from smartgo.mqtt import swarm as base
from smartgo.mqtt.loadgen import percentile
from smartgo.mqtt.swarm import CONNECTING, IDLE, SwarmConfig, _reason
from smartgo.net.codes import CURRENT_VERSION, FLAG_RESPONSE, LanguageCode, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.errors import FrameError, HeaderError
from smartgo.net.frame import FrameDecoder, encode_frame

#: the base worker's set-up state: here the first HEART_BEAT is out, its answer awaited
REGISTERING = base.CONNACK_WAIT
#: this module's counters, after the base's (tcp, subscribed = registered, failed, lost, open, ...)
COUNTERS = ("beats", "answered", "refused", "late", "pushed")
_C = {name: len(base.COUNTERS) + i for i, name in enumerate(COUNTERS)}
MAX_RTTS = 500_000          # round trips a worker keeps between two reads
_CID = "\x01CID\x01"        # where the client id goes in a group's body template


@dataclass(frozen=True, slots=True)
class ClientSwarmConfig:
    net: SwarmConfig                    # broker address, source addresses and ports, per_worker, window, timeout
    heartbeat_interval: float = 30.0    # 0: bare connections, which never heartbeat (what a connection alone costs)
    groups: int = 100
    group_prefix: str = "swarm_group_"
    topic: str = "SwarmTopic"
    tag: str = field(default_factory=lambda: str(os.getpid()))   # clientID: <source address>@<tag>#<n>
    sub_version: int = field(default_factory=lambda: int(time.time() * 1000))

    def group(self, client: int) -> str:
        return f"{self.group_prefix}{client % self.groups}"

    def client_id(self, client: int) -> str:
        return f"{self.net.source(client)[0]}@{self.tag}#{client}"

    def body_halves(self, group: str) -> tuple[bytes, bytes]:
        """The group's HeartbeatData body before and after its client id."""
        consumer = api.consumer_data(group, "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET",
                                     [build_subscription(self.topic, "*", self.sub_version).to_json()])
        body = api.heartbeat_request(_CID, [api.CLIENT_INNER_PRODUCER_GROUP], [consumer]).body_bytes()
        head, tail = body.split(_CID.encode("ascii").replace(b"\x01", b"\\u0001"))
        return head, tail


# ---- a worker process ---------------------------------------------------------------------------------------

class _Worker(base._Worker):
    """One process's clients: the base's sockets, RocketMQ's frames and heartbeats."""

    def __init__(self, cfg: ClientSwarmConfig, pipe: Any, counters: Any) -> None:
        super().__init__(cfg.net, pipe, counters)
        self.client = cfg
        self.sent_ns = array("q", bytes(8 * self.slots))   # the heartbeat in flight (0: none)
        self.opaques = array("q", bytes(8 * self.slots))   # and its opaque, which its response echoes
        self.top = 0                                        # highest descriptor in use + 1: the walk's span
        self.due = 0.0                                      # descriptors the walk is behind by
        self.walked = time.monotonic()
        self.opaque = 0
        self.halves = {cfg.group(n): cfg.body_halves(cfg.group(n)) for n in range(cfg.groups)}
        self.decoder = FrameDecoder()
        self.partial: dict[int, FrameDecoder] = {}         # fd -> a decoder holding a frame's first bytes (rare)
        self.pushed: Counter[int] = Counter()               # requests from the broker, by code

    def control(self, msg: dict[str, Any]) -> None:
        if msg["op"] != "beats":
            super().control(msg)
            return
        in_flight = sum(1 for fd in range(self.top) if self.state[fd] == IDLE and self.sent_ns[fd])
        self.pipe.send({"failures": dict(self.failures), "pushed": dict(self.pushed), "in_flight": in_flight,
                        "counts": {name: self.counters[i] for name, i in _C.items()}})   # as of the round trips
        self.pipe.send_bytes(self.rtts.tobytes())
        self.rtts = array("d")

    def connected(self, fd: int) -> None:
        """TCP is up: the first HEART_BEAT registers the client, as a Java client's does at its start."""
        sock = self.socks[fd]
        assert sock is not None
        if err := sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.drop(fd, _reason(err))
            return
        self.counters[base._C["tcp"]] += 1
        self.tcp_last = time.monotonic()
        self.top = max(self.top, fd + 1)
        self.ep.modify(fd, base.select.EPOLLIN)
        if self.client.heartbeat_interval:
            self.state[fd] = REGISTERING
            self.heartbeat(fd)
        else:
            self.registered(fd)         # a bare connection: it never heartbeats

    def expire(self, now: float) -> None:
        for fd in [fd for fd, deadline in self.pending.items() if deadline <= now]:
            self.drop(fd, "timeout (TCP connect)" if self.state[fd] == CONNECTING else
                      "timeout (no HEART_BEAT answer)")

    # -- heartbeats
    def heartbeat(self, fd: int) -> None:
        client = self.device[fd]
        head, tail = self.halves[self.client.group(client)]
        self.opaque += 1
        self.opaques[fd] = self.opaque
        body = b"".join((head, self.client.client_id(client).encode(), tail))
        self.sent_ns[fd] = time.monotonic_ns()
        self.counters[_C["beats"]] += 1
        self.write(fd, encode_frame(RemotingCommand(RequestCode.HEART_BEAT, LanguageCode.JAVA, CURRENT_VERSION,
                                                    self.opaque, body=body)))

    def keep_alive(self, now: float) -> None:
        """Walk the descriptors due since the last walk, at a pace that covers them all once a heartbeat
        interval: each connection whose turn comes heartbeats (late: its last one is still unanswered)."""
        span = self.top
        if not self.client.heartbeat_interval:
            return
        self.due += span * (now - self.walked) / self.client.heartbeat_interval
        self.walked = now
        step = min(int(self.due), span)
        if not step:
            return
        self.due -= step
        start, self.cursor = self.cursor % span, (self.cursor + step) % span
        for fd in [*range(start, min(start + step, span)), *range(0, max(0, start + step - span))]:
            if self.state[fd] == IDLE:
                if self.sent_ns[fd]:
                    self.counters[_C["late"]] += 1
                else:
                    self.heartbeat(fd)

    def readable(self, fd: int) -> None:
        """The frames there are: responses to heartbeats, and requests the broker pushes (counted)."""
        if (sock := self.socks[fd]) is None:
            return                      # dropped earlier in this poll round
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            data, reason = b"", _reason(exc.errno or 0)
        else:
            reason = "closed by the broker"
        decoder = self.partial.pop(fd, None) or self.decoder
        try:
            commands = decoder.feed(data) if data else None
        except (FrameError, HeaderError) as exc:
            self.decoder = FrameDecoder()
            commands, reason = None, f"bad frame: {exc}"
        if commands is None:
            self.drop(fd, reason)
            return
        if decoder.buffered:
            self.partial[fd] = decoder
            if decoder is self.decoder:
                self.decoder = FrameDecoder()
        for cmd in commands:
            if not cmd.flag & FLAG_RESPONSE:
                self.pushed[cmd.code] += 1
                self.counters[_C["pushed"]] += 1
            elif not self.answered(fd, cmd):
                return

    def answered(self, fd: int, resp: RemotingCommand) -> bool:
        """A response to the heartbeat in flight; False when it ended the connection."""
        sent = self.sent_ns[fd]
        if not sent or resp.opaque != self.opaques[fd]:
            self.drop(fd, "a response to no heartbeat in flight (opaque)")
            return False
        self.sent_ns[fd] = 0
        if resp.code != ResponseCode.SUCCESS:
            reason = f"HEART_BEAT {resp.code}: {resp.remark}"
            if self.state[fd] == REGISTERING:
                self.drop(fd, reason)
                return False
            self.failures[reason] += 1
            self.counters[_C["refused"]] += 1
            return True
        self.counters[_C["answered"]] += 1
        if len(self.rtts) < MAX_RTTS:
            self.rtts.append((time.monotonic_ns() - sent) / 1e6)
        if self.state[fd] == REGISTERING:
            self.registered(fd)
        return True

    def registered(self, fd: int) -> None:
        self.state[fd] = IDLE
        del self.pending[fd]
        self.counters[base._C["subscribed"]] += 1
        self.counters[base._C["open"]] += 1
        self.done_last = time.monotonic()
        self.one_done()

    # -- the end of a connection
    def drop(self, fd: int, reason: str) -> None:
        self.sent_ns[fd] = 0
        self.partial.pop(fd, None)
        super().drop(fd, reason)

    def close_all(self) -> None:
        """A RocketMQ client just closes: no connection is left idle for the base to send MQTT's DISCONNECT."""
        for fd in range(self.top):
            if self.state[fd] == IDLE:
                self.state[fd] = REGISTERING
        super().close_all()


def _worker_main(cfg: ClientSwarmConfig, pipe: Any, counters: Any) -> None:
    worker = _Worker(cfg, pipe, counters)
    pipe.send({"op": "ready"})
    try:
        worker.run()
    finally:
        worker.close_all()          # after a close request: nothing is left; the parent went away: leave nothing


# ---- the parent -----------------------------------------------------------------------------------------------

@dataclass
class Beats:
    """The heartbeats since the last beats() call: the counters' growth, and every round trip."""
    sent: int
    answered: int
    refused: int                    # answered with another code than SUCCESS
    late: int                       # turns skipped because the heartbeat before was still unanswered
    in_flight: int                  # sent and not answered yet, now
    pushed: dict[int, int]          # requests the broker sent, by code (all so far)
    failures: dict[str, int]        # all so far, by reason
    rtts_ms: list[float] = field(repr=False)

    def percentile(self, p: float) -> float | None:
        return percentile(sorted(self.rtts_ms), p)


class ClientSwarm(base.Swarm):
    """Worker processes holding clients 0 .. devices-1; grow() opens more (its Grown.subscribed counts
    the clients registered). Use as a context manager."""

    def __init__(self, cfg: ClientSwarmConfig) -> None:
        super().__init__(cfg.net)
        self.client = cfg
        self.last = dict.fromkeys(COUNTERS, 0)     # this module's counters at the last beats()

    def __enter__(self) -> ClientSwarm:
        return self

    def _spawn(self) -> base._Handle:
        """The base's, with this module's worker and counters."""
        counters = self.ctx.Array("q", len(base.COUNTERS) + len(COUNTERS), lock=False)
        pipe, child = self.ctx.Pipe()
        handle = base._Handle(self.ctx.Process(target=_worker_main, args=(self.client, child, counters), daemon=True,
                                               name=f"client-swarm-{len(self.workers)}"), pipe, counters)
        handle.proc.start()
        child.close()
        self.workers.append(handle)
        self._recv(handle, 60)          # imported and listening: grow() times connections, not start-ups
        return handle

    def counts(self) -> dict[str, int]:
        """The base's counters and this module's, summed over the workers."""
        return {**super().counts(), **{name: sum(h.counters[i] for h in self.workers) for name, i in _C.items()}}

    def beats(self) -> Beats:
        """The heartbeats since the last call (or the start)."""
        for h in self.workers:
            h.pipe.send({"op": "beats"})
        rtts: list[float] = []
        pushed: Counter[int] = Counter()
        failures: Counter[str] = Counter()
        in_flight = 0
        now: Counter[str] = Counter()
        for h in self.workers:
            r = self._recv(h, 30)
            rtts += array("d", h.pipe.recv_bytes()).tolist()
            pushed.update(r["pushed"])
            failures.update(r["failures"])
            in_flight += r["in_flight"]
            now.update(r["counts"])
        grew = {name: now[name] - self.last[name] for name in COUNTERS}
        self.last = {name: now[name] for name in COUNTERS}
        return Beats(grew["beats"], grew["answered"], grew["refused"], grew["late"], in_flight, dict(pushed),
                     dict(failures), rtts)

    def client_ids(self, group: str) -> set[str]:
        """The ids of the clients opened so far that heartbeat into `group`."""
        return {self.client.client_id(n) for n in range(self.devices) if self.client.group(n) == group}
