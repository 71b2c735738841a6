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

The only net actor of a node hosts the commit stage itself (commit_in_net; smartgo.broker.
commit_stage): its sends are appended in its own loop, with no send/done ring, and the pump also
drains the schedule actor's send ring into the stage and watches the failover fence.

Requests and woken pulls run within a per-turn time budget (smartgo.net.budget): the loop turns
about every 2 ms however many pulls the consumers of 1,024 queues keep in flight or wake at
once, and each counts on the actor's board slot, the progress the supervisor's watchdog reads.

Control plane: the broker actor's group states arrive as channel events into a GroupsView
(pulls check subscriptions against it); at start, and whenever the broker actor restarts or an
event went missing, the net actor asks for the whole table ("want_state") and, at start, waits
for it before it accepts connections. It keeps the last HEART_BEAT of each connection, so a
restarted broker actor gets every live client's heartbeat again at once. UPDATE_CONSUMER_OFFSET
and the offsets carried by pulls go to the broker actor coalesced; statistics (NetStats) go
every second, on the wall clock's second boundary.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from smartgo.actors.actor import Actor, ActorContext
from smartgo.actors.ring import CONSUMER, PRODUCER, wait_any
from smartgo.broker import profiling
from smartgo.broker.acl.acl_guard import node_guard
from smartgo.broker.ha.master_forward import MasterForward
from smartgo.broker.processor.message_filter import CheckClientConfigProcessor, Filters
from smartgo.broker.processor.admin_processor import CALL_CLIENT_TIMEOUT
from smartgo.broker.actors.broker_actor import FORWARDED_CODES, RELAYED_CODES
from smartgo.broker.commit_stage import CommitStage
from smartgo.broker.channel import INVOKE_MARGIN, BrokerLink, ChannelError, ClientRef, InvokeError, unpack_command
from smartgo.broker.processor.end_transaction_processor import EndTransactionProcessor
from smartgo.broker.net_view import NetView
from smartgo.broker.processor.offset_processor import OffsetProcessor
from smartgo.broker.processor.pull_processor import PullProcessor
from smartgo.broker.processor.query_processor import QueryProcessor
from smartgo.broker.rings import (CTL_RING_CAPACITY, DONE_RING_CAPACITY, SEND_RING_CAPACITY, SMALL_RING_CAPACITY,
                                  monotonic_ms)
from smartgo.broker.processor.reply_processor import ReplyProcessor
from smartgo.broker.processor.resume_half_processor import ResumeHalfProcessor
from smartgo.broker.processor.send_back_processor import SendBackProcessor
from smartgo.broker.processor.send_processor import SendProcessor
from smartgo.broker.settings import commit_in_net, net_capacity, ring_producers, store_config, vip_port
from smartgo.broker.stats.stats import FLUSH_INTERVAL, NetStats
from smartgo.broker.managers.subscriptions import GroupsView
from smartgo.common.bodies import BodyError
from smartgo.common.heartbeat import parse_heartbeat
from smartgo.net.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, ConnectionEvent, Processor, eager
from smartgo.net.errors import RemotingError, RemotingTimeoutError
from smartgo.net.budget import TurnBudget
from smartgo.net.limits import open_files_limit, worth_logging
from smartgo.net.loop import wait_within
from smartgo.net.server import RemotingServer
from smartgo.net.tls import node_server_options
from smartgo.store import StoreReader

log = logging.getLogger(__name__)

DRAIN_TIMEOUT = 5.0        # s a stopping net actor waits for the answers of the sends it handed over
# run even when the loop turn's budget is spent (smartgo.net.budget): a catch-up's pulls keep it spent
SENDS = frozenset((RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE))
SETTLE_TIMEOUT = 1.0       # ... and of the requests it forwarded to the broker actor (which may be gone)
PUSH_TIMEOUT = 3.0
FORWARD_TIMEOUT = 3.0      # s a forwarded request waits for the broker actor
REPLAY_SLICE = 256 << 10   # bytes of heartbeats replayed to a restarted broker actor a turn (its ring: 4 MiB)
REPLAY_PAUSE = 0.05        # s between slices
STATE_WAIT = 5.0           # s a starting net actor waits for the broker actor's group table


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
        self.ctl_ring = self.ring(f"ctl.{me}", PRODUCER, CTL_RING_CAPACITY)
        self.ctlr_ring = self.ring(f"ctlr.{me}", CONSUMER, CTL_RING_CAPACITY)
        self.stage = CommitStage(self, ring_producers(cfg)) if commit_in_net(cfg) else None
        self.link = BrokerLink(self.ctl_ring, self.push, self.invoke)
        self.link.events.update({"group": self._on_group, "groups": self._on_groups, "config": self._on_config,
                                 "acl": self._on_acl})
        self.link.on_gap = self._want_state
        self.stats = NetStats()
        self.budget = TurnBudget(asyncio.get_running_loop(), cell=self.progress_cell(), urgent=SENDS)
        self.groups = GroupsView()
        self._groups_loaded = asyncio.Event()
        # connection id -> its last HEART_BEAT; None: registered, but the next one goes in full
        self.heartbeats: dict[int, RemotingCommand | None] = {}
        self._touched: list[int] = []           # connections whose unchanged heartbeat was answered here
        self._refused = 0                       # connections closed at accept since start
        self.producers: dict[str, int] = {}     # client id -> the connection its producer heartbeats on
        self._producer_conns: dict[int, str] = {}   # and back, to forget it when the connection closes
        self.sends = SendProcessor(self)
        self.filters = Filters(cfg.enable_property_filter)
        self.pulls = PullProcessor(self)
        queries = QueryProcessor(self.view, store.default_query_max_num)
        replies = ReplyProcessor(self)
        offsets = OffsetProcessor(self.view, self.link)
        halves = ResumeHalfProcessor(self)
        self.link.events["given_up"] = halves.given_up
        processors: dict[int, Processor] = {
            RequestCode.SEND_MESSAGE: self.sends.process,
            RequestCode.SEND_MESSAGE_V2: self.sends.process,
            RequestCode.SEND_BATCH_MESSAGE: self.sends.process,
            RequestCode.SEND_REPLY_MESSAGE: replies.process,
            RequestCode.SEND_REPLY_MESSAGE_V2: replies.process,
            RequestCode.PULL_MESSAGE: self.pulls.process,
            RequestCode.QUERY_MESSAGE: queries.query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: queries.view_message_by_id,
            RequestCode.GET_MAX_OFFSET: offsets.get_max_offset,
            RequestCode.GET_MIN_OFFSET: offsets.get_min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: offsets.get_earliest_msg_storetime,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: offsets.search_offset_by_timestamp,
            RequestCode.UPDATE_CONSUMER_OFFSET: offsets.update_consumer_offset,
            RequestCode.CONSUMER_SEND_MSG_BACK: SendBackProcessor(self).process,
            RequestCode.END_TRANSACTION: EndTransactionProcessor(self).process,
            RequestCode.RESUME_CHECK_HALF_MESSAGE: halves.process,
            RequestCode.CHECK_CLIENT_CONFIG: CheckClientConfigProcessor(self.filters).process,
        }
        for code in FORWARDED_CODES:
            processors[code] = self._forward
        for code in RELAYED_CODES:          # the broker actor waits for a client before it answers
            processors[code] = functools.partial(self._forward, timeout=CALL_CLIENT_TIMEOUT + 2 * INVOKE_MARGIN)
        processors[RequestCode.HEART_BEAT] = self._heart_beat
        processors[RequestCode.UNREGISTER_CLIENT] = self._unregister_client
        self.master_forward = None
        if self.sends.slave and cfg.slave_forward_writes:
            self.master_forward = MasterForward(cfg.outbound_tls(), self.stats)
            processors = self.master_forward.wrap(processors)
        self.acl = node_guard(cfg, me)
        if self.acl is not None:
            processors = self.acl.guard(processors)
        ports = [cfg.listen_port] + ([vip_port(cfg)] if vip_port(cfg) else [])
        tls = node_server_options(cfg.server_tls, me)
        self.server = RemotingServer(cfg.listen_host, ports, processors, reuse_port=True,
                                     max_frame=max(16 << 20, cfg.max_message_size + (1 << 20)),
                                     listeners=[self._on_connection_event], busy_poll_us=cfg.net_busy_poll_us,
                                     budget=self.budget, max_connections=net_capacity(cfg, open_files_limit(True)),
                                     **tls)
        self._pump = self.spawn(self._run_pump(), "pump", through_stop=True)   # stop() drains through it
        self._want_state()
        try:
            await wait_within(self._groups_loaded.wait(), STATE_WAIT)
        except asyncio.TimeoutError:
            log.warning("%s: no group table from the broker actor within %gs; pulls relying on registered "
                        "subscriptions get SUBSCRIPTION_NOT_EXIST until it comes", me, STATE_WAIT)
        self.spawn(self._flush_stats(), "stats")
        await self.server.start()

    # ---- inbound rings --------------------------------------------------------------------------------
    async def _run_pump(self) -> None:
        done, wake, ctlr = self.done_ring, self.wake_ring, self.ctlr_ring
        stage = self.stage
        rings = (done, wake, ctlr, *(stage.inputs if stage is not None else ()))
        sends = self.sends
        ready = sends.flush_ready if stage is None else lambda: sends.flush_ready() or stage.fence_moved()
        while True:
            busy = stage is not None and stage.turn()
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
                await wait_any(rings, self.bell, 0.5, ready)

    # ---- the broker channel ---------------------------------------------------------------------------
    async def _forward(self, conn: Connection, request: RemotingCommand,
                       timeout: float = FORWARD_TIMEOUT) -> RemotingCommand | None:
        try:
            raw = await self.link.forward(ClientRef(self.name, conn.id, conn.remote_address), request, timeout)
        except ChannelError as exc:
            return request.make_response(ResponseCode.SYSTEM_BUSY, f"broker actor unavailable: {exc}")
        return None if raw is None else unpack_command(raw)

    @eager
    async def _heart_beat(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        """A heartbeat the same as this connection's last accepted one changes nothing but the
        client's last-seen time: it is answered here, and the broker actor hears of it in the
        second's batch of touched connections (100,000 clients heartbeat 3,300 times a second)."""
        last = self.heartbeats.get(conn.id)
        if last is not None and last.body == request.body and last.flag == request.flag \
                and (last.language, last.version) == (request.language, request.version):
            self._touched.append(conn.id)
            return request.make_response(ResponseCode.SUCCESS)
        self.heartbeats[conn.id] = None                       # registered: its close is reported
        try:
            hb = parse_heartbeat(request.body_bytes())
            if hb.producers:
                self.producers[hb.client_id] = conn.id
                self._producer_conns[conn.id] = hb.client_id
            else:                                               # its producers are gone
                self._forget_producer(conn.id)
        except BodyError:
            pass                                                # the broker actor answers the error
        response = await self._forward(conn, request)
        if response is not None and response.code == ResponseCode.SUCCESS and conn.id in self.heartbeats:
            self.heartbeats[conn.id] = request
        return response

    def local_producer(self, client_id: str) -> int | None:
        """The connection here that client_id's producer heartbeats on, if it is still registered:
        a request-reply reply to it is pushed at once, without the broker actor's hop."""
        conn_id = self.producers.get(client_id)
        return conn_id if conn_id in self.heartbeats else None      # a closed connection leaves both

    def _forget_producer(self, conn_id: int) -> None:
        client = self._producer_conns.pop(conn_id, None)
        if client is not None and self.producers.get(client) == conn_id:
            del self.producers[client]

    async def _unregister_client(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        if conn.id in self.heartbeats:
            self.heartbeats[conn.id] = None             # its next heartbeat says which groups it still has
        return await self._forward(conn, request)

    def _replay_heartbeats(self) -> None:
        """A restarted broker actor knows no client: give it every live connection's last heartbeat,
        a slice a turn (100,000 of them would overflow the request ring). Each client's next heartbeat
        goes to it in full too, so one whose replay was dropped is back within an interval."""
        live = []
        for conn_id, request in list(self.heartbeats.items()):
            conn = self.server.connections.get(conn_id) if self.server else None
            if conn is None or conn.closed:
                del self.heartbeats[conn_id]
            elif request is not None:
                self.heartbeats[conn_id] = None
                live.append((ClientRef(self.name, conn_id, conn.remote_address), request))
        if live:
            self.spawn(self._replay(live), "heartbeat replay")

    async def _replay(self, live: list[tuple[ClientRef, RemotingCommand]]) -> None:
        sent = 0
        for ref, request in live:
            self.link.forward_nowait(ref, request)
            sent += len(request.body_bytes())
            if sent >= REPLAY_SLICE:
                sent = 0
                await asyncio.sleep(REPLAY_PAUSE)

    def _want_state(self) -> None:
        self.link.event("want_state")

    def _on_group(self, args: dict) -> None:
        self.groups.apply(args["name"], args["state"])

    def _on_groups(self, args: dict) -> None:
        self.groups.replace(args["table"])
        self.pulls.seen_groups.clear()
        self._groups_loaded.set()

    def _on_config(self, args: dict) -> None:
        self.sends.auto_create = args["auto_create_topic"]
        self.pulls.auto_create_groups = args["auto_create_groups"]
        if self.master_forward is not None:
            self.master_forward.master = args.get("master") or None

    def _on_acl(self, args: dict) -> None:
        if self.acl is not None:                # the broker actor changed the ACL file
            self.acl.reload()

    async def _flush_stats(self) -> None:
        """Statistics deltas to the broker actor on every second boundary of the wall clock."""
        while True:
            now = time.time()
            boundary = (int(now / FLUSH_INTERVAL) + 1) * FLUSH_INTERVAL
            await asyncio.sleep(boundary - now)
            self._send_stats(round(boundary * 1000))

    def _send_stats(self, stamp_ms: int) -> None:
        if self._touched:
            touched, self._touched = self._touched, []
            self.link.event("touch", conns=touched)
        deltas = self.stats.take()
        if deltas is not None:
            self.link.event("stats", stamp=stamp_ms, d=deltas)

    def push(self, conn_id: int, cmd: RemotingCommand) -> None:
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

    async def invoke(self, conn_id: int, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """A request from the broker actor to one of our clients, and the client's response."""
        conn = self.server.connections.get(conn_id) if self.server else None
        if conn is None or conn.closed:
            raise InvokeError("the client's connection is closed")
        try:
            return await conn.invoke(cmd, timeout)
        except RemotingTimeoutError as exc:
            raise InvokeError(str(exc), timeout=True) from None
        except RemotingError as exc:
            raise InvokeError(str(exc)) from None

    def _on_connection_event(self, event: ConnectionEvent, conn: Connection, reason: str | None) -> None:
        if event is ConnectionEvent.REFUSED:
            self.stats.refused += 1
            self._refused += 1
            if worth_logging(self._refused):
                log.warning("%s: refused a connection from %s: %s; %d refused so far (logged at 1, 10, 100, "
                            "1000, then every 10000; --remoting-connections sizes the node)",
                            self.name, conn.remote_address, reason, self._refused)
        elif event in (ConnectionEvent.CLOSED, ConnectionEvent.DISCONNECT):
            self._forget_producer(conn.id)
            if self.heartbeats.pop(conn.id, False) is not False:      # only a client that registered
                self.link.event("conn_closed", conn=conn.id, addr=conn.remote_address)

    async def on_control(self, msg: dict) -> None:
        if msg.get("op") != "peer_up":
            return
        if msg.get("name") == "hold":
            self.pulls.repark_all()
        elif msg.get("name") == "broker":
            self._replay_heartbeats()
            self._want_state()

    # ---- periodic -------------------------------------------------------------------------------------------
    def housekeep(self) -> None:
        now = time.monotonic()
        self.sends.watch_commit()
        self.sends.housekeep(now)
        self.pulls.housekeep(monotonic_ms())
        if self.acl is not None:
            self.acl.reload_if_changed(now)

    async def stop(self) -> None:
        """Stop accepting, answer what is in flight, then close every connection."""
        if self.server is None:
            return
        self.server.stop_listening()
        self.pulls.answer_all()
        await self.sends.drain(DRAIN_TIMEOUT)
        await self.link.settle(SETTLE_TIMEOUT)
        await self.server.stop()
        if self.master_forward is not None:
            await self.master_forward.close()
        self._send_stats(int(time.time() * 1000))          # the last counts, before the broker actor stops
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        self.reader.close()
        if self.stage is not None:
            self.stage.close()
        profiling.dump(self._profile, self.name)
