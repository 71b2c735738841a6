"""A net actor: client connections and the wire codec of the broker (N of them per node).

Every net actor listens on listen_port and the VIP port (listen_port - 2) with SO_REUSEPORT,
so the kernel spreads connections over them. It serves sends (encoding and CRC here, storing
through the commit actor), pulls and queries (straight from the mapped store files), and hands
control requests to the broker actor. Its rings:

    send.<me>  -> commit     done.<me>  <- commit       (sends and their completions)
    park.<me>  -> hold       wake.<me>  <- hold         (long polling)
    ctl.<me>   -> broker     ctlr.<me>  <- broker       (the request channel)

One pump task drains the three inbound rings and answers sends whose sync flush completed; it
sleeps on this actor's doorbell, which the commit, hold and broker actors ring through the
rings and the flush actor rings through the board word `<me>.flush_wait`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from smartgo.actors.actor import Actor, ActorContext
from smartgo.actors.ring import CONSUMER, PRODUCER, wait_any
from smartgo.broker import profiling
from smartgo.broker.broker_actor import FORWARDED_CODES
from smartgo.broker.channel import BrokerLink, ChannelError, ClientRef, unpack_command
from smartgo.broker.net_view import NetView
from smartgo.broker.offset_processor import OffsetProcessor
from smartgo.broker.pull_processor import PullProcessor
from smartgo.broker.query_processor import QueryProcessor
from smartgo.broker.rings import DONE_RING_CAPACITY, SEND_RING_CAPACITY, SMALL_RING_CAPACITY, monotonic_ms
from smartgo.broker.send_processor import SendProcessor
from smartgo.broker.settings import store_config, vip_port
from smartgo.net.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, ConnectionEvent
from smartgo.net.errors import RemotingError
from smartgo.net.server import RemotingServer
from smartgo.store import StoreReader

log = logging.getLogger("smartgo.broker.net_actor")

DRAIN_TIMEOUT = 5.0        # s a stopping net actor waits for the answers of the sends it handed over
PUSH_TIMEOUT = 3.0


class NetActor(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self._pump: asyncio.Task | None = None
        self.server: RemotingServer | None = None
        self.every(0.1, self.housekeep)

    async def start(self) -> None:
        self._profile = profiling.start(self.name)
        cfg = self.config
        store = store_config(cfg)
        self.reader = StoreReader(store)
        self.view = NetView(self.board, cfg.store_path, self.reader)
        me = self.name
        self.send_ring = self.ring(f"send.{me}", PRODUCER, SEND_RING_CAPACITY)
        self.done_ring = self.ring(f"done.{me}", CONSUMER, DONE_RING_CAPACITY)
        self.park_ring = self.ring(f"park.{me}", PRODUCER, SMALL_RING_CAPACITY)
        self.wake_ring = self.ring(f"wake.{me}", CONSUMER, SMALL_RING_CAPACITY)
        self.ctl_ring = self.ring(f"ctl.{me}", PRODUCER, SMALL_RING_CAPACITY)
        self.ctlr_ring = self.ring(f"ctlr.{me}", CONSUMER, SMALL_RING_CAPACITY)
        self.link = BrokerLink(self.ctl_ring, self._push)
        self.sends = SendProcessor(self)
        self.pulls = PullProcessor(self)
        queries = QueryProcessor(self.view, store.default_query_max_num)
        offsets = OffsetProcessor(self.view)
        processors = {
            RequestCode.SEND_MESSAGE: self.sends.process,
            RequestCode.SEND_MESSAGE_V2: self.sends.process,
            RequestCode.SEND_BATCH_MESSAGE: self.sends.process,
            RequestCode.PULL_MESSAGE: self.pulls.process,
            RequestCode.QUERY_MESSAGE: queries.query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: queries.view_message_by_id,
            RequestCode.GET_MAX_OFFSET: offsets.get_max_offset,
            RequestCode.GET_MIN_OFFSET: offsets.get_min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: offsets.get_earliest_msg_storetime,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: offsets.search_offset_by_timestamp,
        }
        for code in FORWARDED_CODES:
            processors[code] = self._forward
        ports = [cfg.listen_port] + ([vip_port(cfg)] if vip_port(cfg) else [])
        self.server = RemotingServer(cfg.listen_host, ports, processors, reuse_port=True,
                                     max_frame=max(16 << 20, cfg.max_message_size + (1 << 20)),
                                     listeners=[self._on_connection_event])
        self._pump = self.spawn(self._run_pump(), "pump", through_stop=True)   # stop() drains through it
        await self.server.start()

    # ---- inbound rings --------------------------------------------------------------------------------
    async def _run_pump(self) -> None:
        done, wake, ctlr = self.done_ring, self.wake_ring, self.ctlr_ring
        rings = (done, wake, ctlr)
        sends = self.sends
        while True:
            busy = False
            records = done.read()
            if records:
                busy = True
                sends.on_completions(records)
                done.release()
            records = wake.read()
            if records:
                busy = True
                self.pulls.on_wakes(records)
                wake.release()
            records = ctlr.read()
            if records:
                busy = True
                self.link.on_records(records)
                ctlr.release()
            if sends.flush_ready():
                busy = True
                sends.release_flushed()
            if busy:
                await asyncio.sleep(0)       # replies go out; sockets are read before the next drain
            else:
                await wait_any(rings, self.bell, 0.5, sends.flush_ready)

    # ---- the broker channel ---------------------------------------------------------------------------
    async def _forward(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        try:
            raw = await self.link.forward(ClientRef(self.name, conn.id, conn.remote_address), request)
        except ChannelError as exc:
            return request.make_response(ResponseCode.SYSTEM_BUSY, f"broker actor unavailable: {exc}")
        return None if raw is None else unpack_command(raw)

    def _push(self, conn_id: int, cmd: RemotingCommand) -> None:
        """A request from the broker actor to one of our clients (oneway, or answered into the void)."""
        conn = self.server.connections.get(conn_id) if self.server else None
        if conn is None or conn.closed:
            return
        try:
            if cmd.flag & FLAG_ONEWAY:
                conn.invoke_oneway(cmd)
            else:
                conn.invoke_async(cmd, PUSH_TIMEOUT, lambda response, error: None)
        except RemotingError as exc:
            log.debug("push to %s failed: %s", conn, exc)

    def _on_connection_event(self, event: ConnectionEvent, conn: Connection, reason: str | None) -> None:
        if event in (ConnectionEvent.CLOSED, ConnectionEvent.DISCONNECT):
            self.link.event("conn_closed", conn=conn.id, addr=conn.remote_address)

    async def on_control(self, msg: dict) -> None:
        if msg.get("op") == "peer_up" and msg.get("name") == "hold":
            self.pulls.repark_all()

    # ---- periodic -------------------------------------------------------------------------------------------
    def housekeep(self) -> None:
        self.sends.watch_commit()
        self.sends.housekeep(time.monotonic())
        self.pulls.housekeep(monotonic_ms())

    async def stop(self) -> None:
        """Stop accepting, answer what is in flight, then close every connection."""
        if self.server is None:
            return
        self.server.stop_listening()
        self.pulls.answer_all()
        await self.sends.drain(DRAIN_TIMEOUT)
        await self.server.stop()
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        self.reader.close()
        profiling.dump(self._profile, self.name)
