"""The master's side of replication (RocketMQ 4.x HAService / HAConnection), in the ha actor.

Each slave connects to the HA port and reports its CommitLog max offset (smartgo.net.ha_codec).
From its first report on, the master streams it the CommitLog from that offset - from the
oldest file still on disk when the slave is empty (4.x starts an empty slave at the newest file;
a slave that is to serve readers when the master is gone needs the backlog) or ends before that
file (it starts over: smartgo.broker.ha.reseed; 4.x stalls) - in frames of at most TRANSFER_BATCH
bytes read straight from the mapped files, up to commitlog.written.

Every report is an acknowledgement: the highest one over the connected slaves is published as
commitlog.slave_acked and the number of slaves as ha.slaves. Under --replication sync the net
actors answer a send once slave_acked passes its end; they ask for a doorbell through their
`<net>.flush_wait` word, as sync flush does with the flush actor.

Commit rings this actor (ha.sleeping) when it writes while a slave is connected and caught up.
Under async replication the actor then waits PACE before it looks again, so that under load one
wake-up (and one frame, and one report back) carries many of commit's batches; a sync master
does not wait, since its senders do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from smartgo.actors.logs import Repeats, gist
from smartgo.broker.bells import FlagBell, sleep_flagged
from smartgo.net.ha_codec import HAProtocolError, ReportDecoder, encode_header
from smartgo.net.loop import wait_within
from smartgo.store import CommitLogReader, OffsetGoneError

if TYPE_CHECKING:
    from smartgo.broker.actors.ha_actor import HAActor

log = logging.getLogger(__name__)

TRANSFER_BATCH = 32 * 1024      # haTransferBatchSize
SAFETY_CHECK = 1.0              # s: the longest sleep without looking at the written position
BIND_RETRY = 5.0                # s between attempts to listen while the HA port is taken
PACE = 0.001                    # s between wake-ups while data keeps coming (async replication)
RELEASE_EVERY = 64 << 20        # bytes sent between drops of the mapped pages from this actor's RSS


@dataclass(eq=False)
class SlaveLink:
    peer: str
    acked: int = -1
    sent: int = -1                   # the position the next frame starts at (-1 before the first)
    reported: asyncio.Event = field(default_factory=asyncio.Event)
    error: str | None = None         # why the connection ends


class HAService:
    def __init__(self, actor: HAActor) -> None:
        self.actor = actor
        cfg = actor.config
        b = actor.board
        self.written = b.scalar("commitlog.written")
        self.acked = b.scalar("commitlog.slave_acked", writer=actor.name)
        self.slaves = b.scalar("ha.slaves", writer=actor.name)
        self.sleeping = b.scalar("ha.sleeping", writer=actor.name)
        self.reader = CommitLogReader(actor.store.commitlog_dir, actor.store.commitlog_file_size)
        self.links: set[SlaveLink] = set()
        self.heartbeat = cfg.ha_heartbeat_interval
        self.silence = cfg.ha_housekeeping_interval
        self.net_bells = ([FlagBell(b, actor.ctx.run_path, net, f"{net}.flush_wait", self._waits_for_acked)
                           for net in actor.nets] if cfg.replication == "sync" else [])
        self.pace = 0.0 if cfg.replication == "sync" else PACE
        self._seen = self.written.get()
        self._moved: asyncio.Future = asyncio.get_running_loop().create_future()
        self._linked = asyncio.Event()          # set while a slave is connected
        self._unreleased = 0                    # bytes sent since the last release_pages
        self._quiet: dict[tuple[str, str], Repeats] = {}    # (slave host, which line)
        self.acked.set(0)
        self.slaves.set(0)
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self.actor.spawn(self._follow(), "follow")
        if not await self._bind():              # listening before the actor says it is ready ("node ready")
            self.actor.spawn(self._listen(), "listen")

    async def _listen(self) -> None:
        """A taken HA port costs replication, not the broker: clients are served meanwhile, and
        the error is logged until the port is free (4.x would not start at all)."""
        while True:
            await asyncio.sleep(BIND_RETRY)
            if await self._bind():
                return

    async def _bind(self) -> bool:
        cfg = self.actor.config
        try:
            self.server = await asyncio.start_server(self._serve, cfg.listen_host, cfg.ha_port, reuse_address=True)
        except OSError as exc:
            log.error("replication port %s:%d unavailable (%s): no slave can connect; trying again in %gs",
                      cfg.listen_host, cfg.ha_port, exc, BIND_RETRY)
            return False
        log.info("replication service on %s:%d (%s)", cfg.listen_host, cfg.ha_port,
                 "sync: sends wait for a slave" if cfg.replication == "sync" else "async")
        return True

    def _waits_for_acked(self, word: int) -> bool:
        return 0 < word <= self.acked.get()

    async def _follow(self) -> None:
        """Wake the push loops whenever the written position moves (commit rings only while a
        slave is connected)."""
        written = self.written
        while True:
            await self._linked.wait()
            await sleep_flagged(self.actor.bell, self.sleeping, lambda: written.get() > self._seen, SAFETY_CHECK)
            now = written.get()
            if now > self._seen:
                self._seen = now
                moved, self._moved = self._moved, asyncio.get_running_loop().create_future()
                moved.set_result(None)
                if self.pace:
                    await asyncio.sleep(self.pace)

    # ---- one slave --------------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = "%s:%s" % writer.get_extra_info("peername")[:2]
        link = SlaveLink(peer)
        self.links.add(link)
        self._publish_slaves()
        push = asyncio.get_running_loop().create_task(self._push(link, writer))
        try:
            decoder = ReportDecoder()
            while link.error is None:
                try:
                    data = await wait_within(reader.read(4096), self.silence)
                except TimeoutError:
                    link.error = f"sent nothing for {self.silence:g}s"
                    break
                if not data:
                    link.error = link.error or "closed the connection"
                    break
                acked = decoder.feed(data)
                if acked > self.written.get():          # it would release sync sends nobody has
                    raise HAProtocolError(f"a slave reported {acked}, ahead of this master's {self.written.get()}")
                if acked >= 0:
                    link.acked = acked
                    link.reported.set()
                    self._publish_acked()
        except HAProtocolError as exc:
            link.error = f"broke the protocol: {exc}"
        except OSError as exc:
            link.error = link.error or f"connection lost ({exc})"
        finally:
            push.cancel()
            await asyncio.gather(push, return_exceptions=True)
            writer.close()
            self.links.discard(link)
            self._publish_slaves()
        self._say(logging.WARNING, "drop", peer,
                  f"slave {peer} dropped: {link.error} (acknowledged up to {link.acked})")

    def _say(self, level: int, kind: str, peer: str, text: str) -> None:
        """A line about a slave's connection: one that comes back at every reconnect, numbers
        aside, is written once a minute per slave host."""
        host = peer.rpartition(":")[0]
        self._quiet.setdefault((host, kind), Repeats()).log(log, level, text, gist(text.replace(peer, host)))

    async def _push(self, link: SlaveLink, writer: asyncio.StreamWriter) -> None:
        try:
            await self._transfer(link, writer)
        except HAProtocolError as exc:
            link.error = str(exc)
            writer.close()              # the report loop sees the connection end
        except OSError as exc:
            link.error = f"connection lost ({exc})"
            writer.close()

    async def _transfer(self, link: SlaveLink, writer: asyncio.StreamWriter) -> None:
        await link.reported.wait()
        pos, oldest = link.acked, self.reader.min_offset()
        if pos > self.written.get():
            raise HAProtocolError(f"the slave is ahead of this master ({link.acked} > {self.written.get()}): "
                                  "its CommitLog is not a copy of this one")
        if 0 < pos < oldest:
            log.warning("slave %s: its CommitLog ends at %d, before this master's oldest file at %d: it must start "
                        "over from there", link.peer, pos, oldest)
        pos = max(pos, oldest)
        self._say(logging.INFO, "start", link.peer, f"slave {link.peer}: transfer from {pos}")
        last_sent = time.monotonic()
        while True:
            written = self.written.get()
            if pos < written:
                try:
                    mf = self.reader.segment(pos)
                except OffsetGoneError:
                    raise HAProtocolError(f"the slave needs {pos}, which this master has deleted") from None
                rel = pos - mf.start
                n = min(TRANSFER_BATCH, written - pos, mf.size - rel)
                writer.write(encode_header(pos, n))
                writer.write(mf.view[rel:rel + n])
                pos = link.sent = pos + n
                last_sent = time.monotonic()
                self._sent(n)
                await writer.drain()
                continue
            idle = time.monotonic() - last_sent
            if idle >= self.heartbeat:
                writer.write(encode_header(pos, 0))
                last_sent = time.monotonic()
                await writer.drain()
                continue
            try:
                await wait_within(asyncio.shield(self._moved), self.heartbeat - idle)
            except TimeoutError:
                pass

    def _sent(self, n: int) -> None:
        self._unreleased += n
        if self._unreleased >= RELEASE_EVERY:
            self._unreleased = 0
            self.reader.release_pages(min(link.sent for link in self.links if link.sent >= 0))

    # ---- published state ----------------------------------------------------------------------------------
    def _publish_slaves(self) -> None:
        self.slaves.set(len(self.links))
        if self.links:
            self._linked.set()
        else:
            self._linked.clear()

    def _publish_acked(self) -> None:
        """The highest report of a connected slave; it never goes back (push2SlaveMaxOffset)."""
        acked = max((link.acked for link in self.links), default=0)
        if acked > self.acked.get():
            self.acked.set(acked)
            for bell in self.net_bells:
                bell.ring()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        self.reader.close()
