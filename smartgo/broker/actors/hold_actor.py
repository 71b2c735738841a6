"""The hold actor (RocketMQ's PullRequestHoldService): parked long-poll pulls.

A net actor parks a pull with the suspend flag that found nothing (park.<net>: token, queue,
offset, deadline = now + suspendTimeoutMillis). The pull is woken - the owning net actor gets
its token back through wake.<net> and runs the pull again - when:

- dispatch reports (arrive ring, one record per dispatch round) that the queue's max offset
  passed the parked offset; the board's queue table is checked at park time too, so an arrival
  between the net actor's pull and the park is not missed. Dispatch sends these notices only
  while the board word `hold.watching` says some pull is parked (raised before that check,
  with a fence on both sides), so a node without waiting consumers never wakes this actor;
- its deadline passes (reason DEADLINE: the net actor answers whatever the pull finds);
- the safety re-check (every hold_check_interval, 5 s) finds the queue moved, in case an
  arrival notice was lost (dispatch or this actor restarted).

A turn that woke a pull for an arrival stamps the board word `hold.woken_ms`: while consumers
follow the head, dispatch keeps its rounds 1 ms apart; otherwise it lets records gather longer.

State lives only here; a restarted hold actor starts empty and the net actors park their
pulls again when they see it come up (and answer any pull past its deadline themselves).
"""

from __future__ import annotations

import asyncio
import heapq
from dataclasses import dataclass

from smartgo.actors.actor import Actor, ActorContext
from smartgo.actors.ring import CONSUMER, PRODUCER, full_fence, wait_any
from smartgo.broker.rings import (SMALL_RING_CAPACITY, WAKE, WAKE_ARRIVED, WAKE_DEADLINE, iter_arrivals,
                                  monotonic_ms, parse_park)


@dataclass(slots=True)
class Parked:
    net: int
    token: int
    topic: str
    queue_id: int
    offset: int
    deadline: int


class HoldActor(Actor):
    def __init__(self, ctx: ActorContext, *, nets: list[str]) -> None:
        super().__init__(ctx)
        self.nets = nets
        self.parked: dict[tuple[int, int], Parked] = {}                        # (net, token) ->
        self.by_queue: dict[tuple[str, int], dict[tuple[int, int], Parked]] = {}
        self._deadlines: list[tuple[int, int, int]] = []                        # heap (deadline, net, token)
        self._wakes: dict[int, list[bytes]] = {}
        self._arrived_wake = False                                              # this turn woke a pull on arrival

    async def start(self) -> None:
        self.parks = [self.ring(f"park.{net}", CONSUMER, SMALL_RING_CAPACITY) for net in self.nets]
        self.wake_rings = [self.ring(f"wake.{net}", PRODUCER, SMALL_RING_CAPACITY) for net in self.nets]
        self.arrive = self.ring("arrive", CONSUMER, SMALL_RING_CAPACITY)
        self.table = self.board.queues
        self.watching = self.board.scalar("hold.watching", writer=self.name)
        self.watching.set(0)
        self.woken_ms = self.board.scalar("hold.woken_ms", writer=self.name)
        self.spawn(self._run(), "loop")

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.table.get(topic, queue_id) or 0

    async def _run(self) -> None:
        rings = [*self.parks, self.arrive]
        interval_ms = int(self.config.hold_check_interval * 1000)
        next_check = monotonic_ms() + interval_ms
        while True:
            busy = self.drain()
            now = monotonic_ms()
            self.expire(now)
            if now >= next_check:
                self.recheck()
                next_check = now + interval_ms
            self.send_wakes()
            if busy:
                await asyncio.sleep(0)
                continue
            until = next_check if not self._deadlines else min(next_check, self._deadlines[0][0])
            await wait_any(rings, self.bell, max(0.0, (until - monotonic_ms()) / 1000))

    def drain(self) -> bool:
        busy = False
        for net, ring in enumerate(self.parks):
            records = ring.read()
            if records:
                busy = True
                for mv in records:
                    self.park(net, *parse_park(mv))
                ring.release()
        records = self.arrive.read()
        if records:
            busy = True
            for mv in records:
                for topic, queue_id, max_offset in iter_arrivals(mv):
                    self.arrived(topic, queue_id, max_offset)
            self.arrive.release()
        return busy

    def park(self, net: int, token: int, deadline: int, offset: int, queue_id: int, topic_raw: bytes) -> None:
        topic = topic_raw.decode()
        key = (net, token)
        p = Parked(net, token, topic, queue_id, offset, deadline)
        if not self.watching.get():
            self.watching.set(1)                                # dispatch sends arrivals from now on ...
            full_fence()                                        # ... and one of us sees the other's store
        if self.max_offset(topic, queue_id) > offset:        # arrived between the net actor's pull and now
            self._wake(p, WAKE_ARRIVED)
            if not self.parked:
                self.watching.set(0)
            return
        self.parked[key] = p
        self.by_queue.setdefault((topic, queue_id), {})[key] = p
        heapq.heappush(self._deadlines, (deadline, net, token))

    def arrived(self, topic: str, queue_id: int, max_offset: int) -> None:
        waiting = self.by_queue.get((topic, queue_id))
        if waiting:
            for p in [p for p in waiting.values() if p.offset < max_offset]:
                self._unpark(p, WAKE_ARRIVED)

    def expire(self, now: int) -> None:
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, net, token = heapq.heappop(heap)
            p = self.parked.get((net, token))
            if p is not None and p.deadline <= now:
                self._unpark(p, WAKE_DEADLINE)

    def recheck(self) -> None:
        for (topic, queue_id), waiting in list(self.by_queue.items()):
            max_offset = self.max_offset(topic, queue_id)
            for p in [p for p in waiting.values() if p.offset < max_offset]:
                self._unpark(p, WAKE_ARRIVED)

    def _unpark(self, p: Parked, reason: int) -> None:
        key = (p.net, p.token)
        del self.parked[key]
        if not self.parked:
            self.watching.set(0)                                # nothing parked: spare dispatch the notices
        waiting = self.by_queue[(p.topic, p.queue_id)]
        del waiting[key]
        if not waiting:
            del self.by_queue[(p.topic, p.queue_id)]
        self._wake(p, reason)

    def _wake(self, p: Parked, reason: int) -> None:
        if reason == WAKE_ARRIVED:
            self._arrived_wake = True
        self._wakes.setdefault(p.net, []).append(WAKE.pack(p.token, reason))

    def send_wakes(self) -> None:
        """One ring record per net actor per turn; a net actor that is down loses nothing it
        still needs (its parked pulls died with its connections)."""
        for net, parts in self._wakes.items():
            self.wake_rings[net].try_write([b"".join(parts)])
        self._wakes.clear()
        if self._arrived_wake:                                  # consumers follow the head: dispatch keeps pace
            self._arrived_wake = False
            self.woken_ms.set(monotonic_ms())
