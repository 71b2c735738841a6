"""The MQTT actor: device connections of a broker node (`--mqtt-actors N` of them, sharing the
listening sockets through SO_REUSEPORT, as the net actors share theirs).

It is a RocketMQ-protocol client of its own cluster: device publishes are stored through its
node's net actors (SEND_BATCH_MESSAGE per queue, the publishes of one event-loop turn together),
and deliveries come from long-polling pulls of the bridged topics on every broker group, so a
device gets what was published on any node, through the store (docs/ARCHITECTURE.md, MQTT).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from smartgo.actors.actor import Actor, ActorContext
from smartgo.client.config import ClientConfig
from smartgo.client.errors import ClientError
from smartgo.client.lite_pull_consumer import AsyncLitePullConsumer
from smartgo.client.message import ConsumeFromWhere, Message, MessageModel, MessageQueue, SendStatus
from smartgo.client.admin import AsyncAdmin
from smartgo.client.producer import AsyncProducer
from smartgo.client.pull import pull, pull_sys_flag
from smartgo.client.rebalance import queue_offset
from smartgo.net.codes import RequestCode
from smartgo.net.errors import RemotingError
from smartgo.client.subscription import build_subscription
from smartgo.config import NodeConfig
from smartgo.mqtt import codec as c
from smartgo.mqtt.admin import AdminServer, socket_path
from smartgo.mqtt.auth import Authenticator
from smartgo.mqtt.bridge import (EMPTY_BODY, MQTT_CLIENT, MQTT_EMPTY, TopicMap, delivery_from_message, mqtt_topic_of,
                                 publish_properties)
from smartgo.mqtt.directory import SessionDirectory
from smartgo.mqtt.engine import Connection, Engine, Limits
from smartgo.mqtt.session import Outgoing, Session, SessionUnavailable
from smartgo.mqtt.sessions import (CLAIM, ENDED, EPOCH, HANDOFF, HOLDER, LIVE, SESSIONS_QUEUES, SESSIONS_TOPIC,
                                   Pending, Restored, SessionJournal, session_queue,
                                   Source, decode, encode, parse_source, source_of, still_alive)
from smartgo.mqtt.listeners import WebSocketConnection, listening_socket, mqtt_names
from smartgo.net.limits import connections_per_actor, open_files_limit
from smartgo.mqtt.peers import PeerServer, ask, peer_path
from smartgo.net.tls import server_context
from smartgo.store.record import MessageExt

log = logging.getLogger(__name__)

#: Where retained messages are kept, one queue per broker: read from its start when an actor starts.
RETAINED_TOPIC = "MQTT_RETAINED"
#: The property holding a QoS 2 publish's packet id (see Engine.replayed_qos2).
MQTT_PID = "mqttPid"
BATCH_MESSAGES = 256
#: Seconds between the feed's looks for new queues (a broker group joining the cluster).
FEED_REBALANCE = 2.0
#: Seconds each step of a stop may take.
STOP_STEP = 2.0
#: Seconds in which nothing comes before a start stops reading the retained messages, the session
#: records or the feed's replay to their end and goes on with what it has (a line in the log).
READ_LIMIT = 40.0
#: Bytes of session records a SEND_BATCH carries at most (a quarter of a CommitLog file when smaller).
RECORDS_BATCH_BYTES = 256 << 10
#: What a message adds to its body in a batch (properties, key, framing), counting batch sizes.
MESSAGE_OVERHEAD = 200
#: Seconds a node taking a session over waits for its holder on another node to hand it over.
HANDOFF_WAIT = 3.0
BATCH_BYTES = 1 << 20
Done = Callable[[int], None]
T = TypeVar("T")


def client_config(cfg: NodeConfig, name: str) -> ClientConfig:
    """The actor's own client of its cluster: this node's registries, its ACL account, loopback."""
    registry = cfg.registry or f"127.0.0.1:{cfg.embedded_registry_port}"
    return ClientConfig.make(registry, instance_name=f"{cfg.broker_name}-{name}", client_ip="127.0.0.1",
                             access_key=cfg.acl_access_key, secret_key=cfg.acl_secret_key,
                             use_tls=cfg.tls_mode == "enforcing", poll_registry_interval=FEED_REBALANCE)


class Publisher:
    """The engine's StoreSide: device publishes stored as SmartGo messages on this node's broker,
    coalesced per queue into SEND_BATCH_MESSAGE requests."""

    def __init__(self, producer: AsyncProducer, topic_map: TopicMap, broker_name: str,
                 spawn: Callable[[Any], Any], journal: SessionJournal,
                 find_session: Callable[[str, bool, Callable[[Session | SessionUnavailable | None], None]], None]
                 ) -> None:
        self.producer = producer
        self.session_changed = journal.session_changed
        self.session_ended = journal.session_ended
        self.when_persisted = journal.when_persisted
        self.claim = journal.claim
        self.forgotten = journal.forgotten
        self.find_session = find_session
        self.map = topic_map
        self.broker_name = broker_name
        self.spawn = spawn
        self.pending: dict[tuple[str, int], list[tuple[Message, Done]]] = {}
        self.scheduled = False
        self.queues: dict[str, list[MessageQueue]] = {}
        self.stored: dict[Source, int] = {}         # the last offset this actor stored, per queue
        self.fed: dict[Source, int] = {}            # the feed's position (the actor's, shared)

    def unfed(self) -> dict[Source, int]:
        """What this actor stored that its feed has not offered yet."""
        fed = self.fed
        return {src: offset for src, offset in self.stored.items() if offset > fed.get(src, -1)}

    def store(self, publish: c.Publish, client_id: str, done: Done) -> None:
        topic = self.map.smartgo_topic(publish.topic)
        if topic is None:
            log.warning("mqtt %s: no mqtt_topic_map rule takes topic %s; not stored", client_id, publish.topic)
            done(c.TOPIC_NAME_INVALID)
            return
        try:
            props = publish_properties(publish.topic, publish.qos, publish.retain, client_id, publish.properties,
                                       int(time.time() * 1000))
        except ValueError as exc:             # a property the store's record cannot carry
            log.warning("mqtt %s: publish to %s not stored: %s", client_id, publish.topic, exc)
            done(c.IMPLEMENTATION_SPECIFIC)
            return
        if publish.qos == 2 and publish.packet_id is not None:
            props[MQTT_PID] = str(publish.packet_id)        # the replay after a crash knows it was stored
        tags = props.pop("TAGS", None)
        keys = props.pop("KEYS", None)
        body = bytes(publish.payload)
        if not body:
            body = EMPTY_BODY
            props[MQTT_EMPTY] = "1"
        if publish.retain:
            both = _Both(done)
            self._add(RETAINED_TOPIC, 0, Message(RETAINED_TOPIC, body, tags, keys, dict(props)), both.one)
            done = both.one
        key = self.map.queue_for(publish.topic, 1 << 32)     # the topic's crc32; its queue is key % queues
        self._add(topic, key, Message(topic, body, tags, keys, props), done)

    def _add(self, topic: str, key: int, msg: Message, done: Done) -> None:
        batch = self.pending.get((topic, key))
        if batch is None:
            self.pending[(topic, key)] = [(msg, done)]
        else:
            batch.append((msg, done))
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.scheduled = False
        pending, self.pending = self.pending, {}
        for (topic, key), items in pending.items():
            for batch in batched(items, lambda item: len(item[0].body), BATCH_BYTES):
                self.spawn(self._send(topic, key, batch))

    async def _queue(self, topic: str, key: int) -> MessageQueue:
        queues = self.queues.get(topic)
        if not queues:
            info = await self.producer.publish_info(topic)
            mine = [q for q in info.queues if q.broker_name == self.broker_name]
            queues = self.queues[topic] = sorted(mine or list(info.queues), key=lambda q: (q.broker_name, q.queue_id))
        return queues[key % len(queues)]

    async def _send(self, topic: str, key: int, items: list[tuple[Message, Done]]) -> None:
        reason = c.SUCCESS
        try:
            mq = await self._queue(topic, key)
            result = await self.producer.send_batch([m for m, _ in items], queue=mq)
            if result.status is not SendStatus.SEND_OK:
                log.warning("mqtt: %d publishes to %s stored with %s", len(items), topic, result.status.name)
                reason = c.UNSPECIFIED_ERROR
            src = source_of(mq.broker_name, mq.topic, mq.queue_id)
            self.stored[src] = max(self.stored.get(src, -1), result.queue_offset + len(items) - 1)
        except ClientError as exc:
            self.queues.pop(topic, None)
            log.warning("mqtt: %d publishes to %s not stored: %s", len(items), topic, exc)
            reason = c.QUOTA_EXCEEDED if "disk" in str(exc).lower() else c.UNSPECIFIED_ERROR
        for _, done in items:
            done(reason)


class _Both:
    """Two stores for one publish (its topic and the retained topic): done once both answered."""

    __slots__ = ("done", "left", "reason")

    def __init__(self, done: Done) -> None:
        self.done = done
        self.left = 2
        self.reason = c.SUCCESS

    def one(self, reason: int) -> None:
        self.left -= 1
        if reason != c.SUCCESS:
            self.reason = reason
        if self.left == 0:
            self.done(self.reason)


class MqttActor(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        cfg = self.config
        self.topic_map = TopicMap.parse(cfg.mqtt_topic_map)
        self.limits = Limits(max_packet_size=cfg.mqtt_max_packet_size, receive_maximum=cfg.mqtt_receive_maximum,
                             max_queued_messages=cfg.mqtt_max_queued_messages,
                             max_queued_bytes=cfg.mqtt_max_queued_bytes, connect_timeout=cfg.mqtt_connect_timeout,
                             max_keep_alive=cfg.mqtt_max_keep_alive,
                             max_connections=connections_per_actor(open_files_limit(current=True)))
        self.auth = Authenticator(cfg.mqtt_users_file, cfg.mqtt_allow_anonymous)
        self.servers: list[asyncio.AbstractServer] = []
        self.positions: dict[Source, int] = {}        # the feed: offered to every session up to here
        self.index = int(self.name.rsplit("-", 1)[1])
        self.every(1.0, self._tick)
        # records older than a quarter of the CommitLog's retention are written again (sessions, retained)
        self.refresh_after = cfg.file_reserved_hours * 3600 / 4
        self.every(min(60.0, self.refresh_after / 4), self._refresh)
        self.retained_at: dict[str, int] = {}       # retained topic -> store time (ms) of its record

    async def start(self) -> None:
        cfg = self.config
        options = client_config(cfg, self.name)
        group = f"MQTT_{cfg.broker_name}_{self.name}".replace("-", "_")
        self.cluster = await AsyncAdmin(options.registry, config=options).start()
        if cfg.role == "master":           # a slave has its master's topics
            await self._create_topics(self.cluster)
        self.producer = await AsyncProducer(f"MQTT_{cfg.broker_name}", options.registry, config=options).start()
        self.node_id = f"{cfg.broker_name}/{cfg.broker_id}"      # a promoted slave becomes <name>/0: it
        self.holder = f"{self.node_id}/{self.name}"              # restores its old master's sessions
        self.group = group
        self.journal = SessionJournal(self.holder, self._write_records, lambda: dict(self.positions),
                                      self._commit_feed, cfg.mqtt_checkpoint_interval)
        self.publisher = Publisher(self.producer, self.topic_map, cfg.broker_name, self._spawn_send, self.journal,
                                   self._find_session)
        self.publisher.fed = self.positions
        self.engine = Engine(self.limits, self.publisher, self.auth, progress=self.progress_cell())
        self.siblings = mqtt_names(cfg)                              # by index, this actor's too
        self.directory = SessionDirectory(self.ctx.run_path, len(self.siblings), self.index)
        self.engine.held, self.engine.let_go = self.directory.hold, self.directory.release
        fresh = self.ctx.run_path / f"{self.name}-scan"
        shutil.rmtree(fresh, ignore_errors=True)
        # retained messages and this node's session records: read from the start at every start
        reader = AsyncLitePullConsumer(f"{group}_SCAN", options.registry, config=options, auto_commit=False,
                                       pull_batch_size=64, offset_store_dir=fresh)
        own = [MessageQueue(RETAINED_TOPIC, cfg.broker_name, 0),
               *(MessageQueue(SESSIONS_TOPIC, cfg.broker_name, q) for q in range(SESSIONS_QUEUES))]
        await reader.assign(own)
        await reader.start()
        records: dict[str, MessageExt] = {}
        try:
            for mq in own:
                await reader.seek_to_begin(mq)
            await read_to_end(reader, own, lambda m: self._scanned(m, records), self.name,
                              progress=self.progress_cell())
        finally:
            await reader.close()
        await self._restore(records, group)
        # a queue never read before (this is a new feed, or a broker joined) from where it was at this start
        self.feed = AsyncLitePullConsumer(group, options.registry, model=MessageModel.BROADCASTING, config=options,
                                          consume_from=ConsumeFromWhere.CONSUME_FROM_TIMESTAMP,
                                          consume_timestamp_ms=int(time.time() * 1000),
                                          pull_batch_size=64, offset_store_dir=cfg.store_path / "mqtt",
                                          auto_commit=False, rebalance_interval=FEED_REBALANCE)
        followed = [*self.topic_map.topics, RETAINED_TOPIC, SESSIONS_TOPIC]
        for topic in followed[:-1]:
            self.feed.subscribe(topic, "*")
        # a record per CONNECT: each is read by one actor of the node, the one its queue falls to, which
        # tells the sibling holding the client (a storm of N devices: N decodes a node, not N x actors)
        self.feed.subscribe(SESSIONS_TOPIC, "*", lambda topic, queues, held: self.feed.pause(
            [mq for mq in held if not self._reads(mq)]))
        await self.feed.start()
        queues = [mq for topic in followed for mq in await self.feed.fetch_queues(topic) if self._reads(mq)]
        for mq in queues:
            if mq.topic in self.topic_map.topics:     # every bridged queue has a position (a record's `through`)
                at = await self.feed.committed(mq)
                self.positions[source_of(mq.broker_name, mq.topic, mq.queue_id)] = \
                    (at if at >= 0 else await self.feed.max_offset(mq)) - 1
        await read_to_end(self.feed, queues, self._fed, self.name, replay=True,    # what the last commit missed
                          progress=self.progress_cell())
        self.engine.replay_done()
        self.spawn(self._run_feed(), "feed")
        self.spawn(self.journal.run(), "checkpoints")
        self.admin = AdminServer(self.engine, socket_path(self.ctx.run_path, self.name))
        await self.admin.start()
        self.peer_server = PeerServer(peer_path(self.ctx.run_path, self.name), self._peer)
        await self.peer_server.start()
        await self._listen()

    async def _listen(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        engine = self.engine
        host = cfg.listen_host
        if cfg.mqtt_port:
            sock = listening_socket(host, cfg.mqtt_port, "mqtt")
            self.servers.append(await loop.create_server(lambda: Connection(engine, "tcp"), sock=sock))
        if cfg.mqtt_ws_port:
            sock = listening_socket(host, cfg.mqtt_ws_port, "mqtt-ws")
            self.servers.append(await loop.create_server(lambda: WebSocketConnection(engine, "ws"), sock=sock))
        if cfg.mqtt_tls_port:
            tls = server_context(cfg.server_tls)
            sock = listening_socket(host, cfg.mqtt_tls_port, "mqtt-tls")
            self.servers.append(await loop.create_server(lambda: Connection(engine, "tls"), sock=sock, ssl=tls))

    def _spawn_send(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        task.add_done_callback(_reraise_unexpected)

    async def _create_topics(self, admin: AsyncAdmin) -> None:
        """The bridged topics, the retained and the sessions topic on this node's broker."""
        cfg = self.config
        addr = f"127.0.0.1:{cfg.listen_port}"
        wanted = [*((t, cfg.mqtt_topic_queues) for t in self.topic_map.topics), (RETAINED_TOPIC, 1),
                  (SESSIONS_TOPIC, SESSIONS_QUEUES)]
        for topic, queues in wanted:
            for attempt in range(50):
                try:
                    await admin.create_topic(topic, queues, broker_addr=addr)
                    break
                except (ClientError, RemotingError) as exc:        # a timeout too: a busy broker is no reason to die
                    if attempt == 49:
                        raise
                    log.info("%s: creating topic %s: %s; again", self.name, topic, exc)
                    await asyncio.sleep(0.2)

    # ---- restore ---------------------------------------------------------------------------------
    def _scanned(self, msg: MessageExt, records: dict[str, MessageExt]) -> None:
        if msg.topic == RETAINED_TOPIC:
            self._retained(msg)
        elif msg.keys:
            records[msg.keys[0]] = msg          # one client's records are in one queue, in order: the last wins

    async def _restore(self, records: dict[str, MessageExt], group: str) -> None:
        """The live sessions of this node's records that belong to this actor, with what they had
        queued and in flight read back from where it is stored."""
        count = len(self.siblings)
        restored = 0
        for client_id, msg in records.items():
            holder = msg.properties.get(HOLDER, "")
            mine = holder.startswith(f"{self.node_id}/") and actor_index(holder) % count == self.index
            if msg.tags != LIVE or not mine:
                continue
            try:
                r = decode(msg.body)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("%s: session record of %s does not decode (%s); the session is lost", self.name,
                          client_id, exc)
                continue
            if not r.session.expiry or not still_alive(r):
                continue
            await self._read_back(r, group)
            self.engine.restore(r.session, r.through)
            self.journal.persisted.add(client_id)
            self.journal.written[client_id] = r.written_ms / 1000
            restored += 1
        if restored:
            log.info("%s: %d persistent sessions restored", self.name, restored)

    async def _read_back(self, r: Restored, group: str) -> None:
        """The session's queued and in-flight messages, read back by position (32 a pull)."""
        session = r.session
        by_src: dict[Source, list[Pending]] = {}
        for p in r.pending:
            by_src.setdefault(p.src, []).append(p)
        got: dict[tuple[Source, int], MessageExt] = {}
        for src, items in by_src.items():
            broker, topic, queue = parse_source(src)
            wanted = sorted({p.offset for p in items})
            i = 0
            while i < len(wanted):
                try:
                    found = await pull(self.producer.instance, group, MessageQueue(topic, broker, queue),
                                       build_subscription(topic, "*"), wanted[i], 32, pull_sys_flag(False, False, True))
                except ClientError as exc:
                    log.warning("%s: messages of session %s at %s not read back: %s", self.name, session.client_id,
                                src, exc)
                    break
                for m in found.messages:
                    got[(src, m.queue_offset)] = m
                last = max((m.queue_offset for m in found.messages), default=wanted[i])
                while i < len(wanted) and wanted[i] <= last:
                    i += 1
        for p in r.pending:
            msg = got.get((p.src, p.offset))
            if msg is None:
                session.dropped += 1
                log.warning("%s: message %s@%d of session %s is gone from the store", self.name, p.src, p.offset,
                            session.client_id)
                continue
            d = delivery_from_message(msg.topic, msg.properties, msg.body)
            out = Outgoing(d, p.qos, p.retain, p.identifiers, p.released, p.src, p.offset)
            if p.pid:
                session.fly(p.pid, out)
                session.next_id = p.pid % 0xFFFF + 1
            else:
                session.keep(out)

    # ---- a session held elsewhere ----------------------------------------------------------------
    def _find_session(self, client_id: str, clean: bool,
                      then: Callable[[Session | SessionUnavailable | None], None]) -> None:
        async def find() -> None:
            found: Session | SessionUnavailable | None = None
            try:
                found = await self._find(client_id, clean)
            except SessionUnavailable as exc:
                found = exc
            except Exception as exc:       # noqa: BLE001 - any failure: a clean session starts empty, a kept one waits
                outcome = "it starts empty" if clean else "CONNECT refused, server unavailable"
                log.warning("%s: looking up the session of %s failed (%s: %s); %s", self.name, client_id,
                            type(exc).__name__, exc, outcome)
                found = None if clean else SessionUnavailable(f"{type(exc).__name__}: {exc}")
            then(found)
        if clean and not self.directory.holders(client_id):
            then(None)                  # no sibling to take it from, no record to read: nothing to wait for
            return
        self.spawn(find(), f"find {client_id}")

    async def _hand_over(self, session: Session, body: bytes) -> None:
        """The record of a session another node took: everything it had here."""
        await self._write_records([Message(SESSIONS_TOPIC, body, HANDOFF, session.client_id,
                                           {HOLDER: self.holder, EPOCH: str(session.epoch)})],
                                  session_queue(session.client_id))

    def _through(self, session: Session) -> dict[Source, int]:
        through = dict(self.positions)
        for src, offset in (session.through or {}).items():
            through[src] = max(offset, through.get(src, -1))
        return through

    def _peer(self, request: dict) -> dict:
        op = request.get("op")
        if op == "gone":
            self._let_go(str(request["client"]), int(request["epoch"]))
            return {}
        if op != "take":
            raise ValueError(f"unknown op {op!r}")
        session = self.engine.release(str(request["client"]))
        if session is None:
            return {"found": False}
        return {"found": True, "record": encode(session, self._through(session), self.holder)}

    async def _find(self, client_id: str, clean: bool) -> Session | None:
        """The session from the peer actor holding it, else (not clean) from its newest record on
        any broker of the cluster (a master, or a slave when its master is gone); read back and
        caught up with this actor's feed."""
        peers = [peer_path(self.ctx.run_path, self.siblings[i]) for i in self.directory.holders(client_id)]
        answers = await asyncio.gather(*(ask(path, {"op": "take", "client": client_id}) for path in peers))
        record = next((a["record"] for a in answers if a and a.get("found")), None)
        if clean:
            return None
        if record is None and None in answers:
            raise SessionUnavailable("a sibling that may hold it does not answer")
        if record is not None:
            return await self._adopt(decode(record))
        newest = await self._newest_state(client_id)
        if newest is None or newest.tags == ENDED:
            return None
        holder = newest.properties.get(HOLDER, "")
        if newest.tags == LIVE:
            if holder.startswith(f"{self.node_id}/"):
                return await self._from_sibling(client_id, holder, newest)
            newest = await self._handed_over(client_id, holder) or newest
        return await self._adopt(decode(newest.body))

    async def _from_sibling(self, client_id: str, holder: str, newest: MessageExt) -> Session | None:
        """Held on this node by `holder` (by its last record): a sibling not in the directory yet (it is
        restoring after a restart) is asked; if it no longer has the session, the record is what there is."""
        index = actor_index(holder)
        if holder != self.holder and index < len(self.siblings):
            answer = await ask(peer_path(self.ctx.run_path, self.siblings[index]), {"op": "take", "client": client_id})
            if answer is None:
                raise SessionUnavailable(f"{holder} does not answer")
            if answer.get("found"):
                return await self._adopt(decode(answer["record"]))
        return await self._adopt(decode(newest.body))

    async def _newest_state(self, client_id: str, since_ms: int = 0) -> MessageExt | None:
        """The client's newest record with a state (live, ended, handed over) on any broker."""
        found = await self.cluster.query_by_key(SESSIONS_TOPIC, client_id, 64, replicas=True)
        return next((m for m in found if m.tags in (LIVE, ENDED, HANDOFF) and m.store_timestamp >= since_ms), None)

    async def _handed_over(self, client_id: str, holder: str) -> MessageExt | None:
        """A claim in the store makes the holder on another node let the session go and write what
        it had (its last checkpoint may be older than the device's last moves); None when that
        node does not answer within HANDOFF_WAIT (it is down: its last record is what there is)."""
        epoch = int(time.time() * 1000)
        await self._write_records([Message(SESSIONS_TOPIC, b"-", CLAIM, client_id,
                                           {HOLDER: self.holder, EPOCH: str(epoch)})], session_queue(client_id))
        deadline = time.monotonic() + HANDOFF_WAIT
        while time.monotonic() < deadline:
            newest = await self._newest_state(client_id, epoch - 1000)
            if newest is not None and newest.tags == HANDOFF and newest.properties.get(HOLDER) == holder:
                return newest
            await asyncio.sleep(0.05)
        log.warning("%s: %s did not hand the session of %s over within %gs; taking its last record", self.name,
                    holder, client_id, HANDOFF_WAIT)
        return None

    async def _adopt(self, r: Restored) -> Session | None:
        if not r.session.expiry or not still_alive(r):
            return None
        await self._read_back(r, self.group)
        before = len(r.session.queue)
        await self._catch_up(r)
        log.info("%s: session of %s taken over from %s (%d subscriptions; %d queued and %d in flight there, "
                 "%d stored since; record of %d)", self.name, r.session.client_id, r.node or "?",
                 len(r.session.subscriptions), before, len(r.session.inflight), len(r.session.queue) - before,
                 r.written_ms)
        return r.session

    async def _catch_up(self, r: Restored) -> None:
        """What was stored between the record's feed position and this actor's, for the session's
        own subscriptions; its last step and the adoption happen in one turn, so nothing slips between."""
        through = dict(r.through)
        session = r.session
        instance = self.producer.instance
        for src in self.positions.keys() - through.keys():
            # a queue its holder had not found yet (a broker joining): from the session's creation on
            broker, topic, queue = parse_source(src)
            through[src] = await queue_offset(instance, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                                              MessageQueue(topic, broker, queue), session.created_ms) - 1
        while True:
            gaps = [(src, through[src], end) for src, end in self.positions.items()
                    if src in through and through[src] < end]
            if not gaps:
                break
            for src, start, end in gaps:
                broker, topic, queue = parse_source(src)
                mq = MessageQueue(topic, broker, queue)
                offset = start + 1
                while offset <= end:
                    found = await pull(instance, self.group, mq, build_subscription(topic, "*"), offset, 32,
                                       pull_sys_flag(False, False, True))
                    if not found.messages:
                        if found.next_begin_offset <= offset:
                            break                  # gone from the store, or not there yet: nothing to add
                        offset = found.next_begin_offset
                        continue
                    for msg in found.messages:
                        if msg.queue_offset > end:
                            break
                        self.engine.catch_up(session, delivery_from_message(msg.topic, msg.properties, msg.body),
                                             src, msg.queue_offset)
                        offset = msg.queue_offset + 1
                through[src] = end
        session.through = through

    # ---- the feed --------------------------------------------------------------------------------
    def _retained(self, msg: MessageExt) -> None:
        d = delivery_from_message(msg.topic, msg.properties, msg.body)
        self.engine.retain(d.topic, d if d.payload else None)
        if d.payload and self.index == 0 and msg.broker_name == self.config.broker_name:
            self.retained_at[d.topic] = msg.store_timestamp      # this node's to keep (mqtt-0 does it)
        else:
            self.retained_at.pop(d.topic, None)                  # deleted, or newer on another node

    async def _refresh(self) -> None:
        """Sessions and retained messages whose records are getting old are stored again, so that
        the CommitLog's retention (file_reserved_hours) never takes the last copy."""
        engine = getattr(self, "engine", None)
        if engine is None or self.config.role != "master":
            return
        before = time.time() - self.refresh_after
        again = self.journal.stale(engine.sessions.values(), before)
        old = [topic for topic, ms in self.retained_at.items() if ms / 1000 < before]
        msgs = []
        for topic in old:
            d = engine.retained.get(topic)
            if d is not None and (not d.expires_ms or d.expires_ms > time.time() * 1000):
                props = publish_properties(topic, d.qos, True, d.client_id, d.properties, int(time.time() * 1000))
                msgs.append(Message(RETAINED_TOPIC, d.payload, props.pop("TAGS", None), props.pop("KEYS", None),
                                    props))
            self.retained_at[topic] = int(time.time() * 1000)     # not again at once; the feed dates it
        for batch in batched(msgs, lambda msg: len(msg.body), BATCH_BYTES):
            await self.producer.send_batch(batch, queue=MessageQueue(RETAINED_TOPIC, self.config.broker_name, 0))
        if again or msgs:
            log.info("%s: %d session records and %d retained messages stored again (older than %gh)", self.name,
                     again, len(msgs), self.refresh_after / 3600)

    def _fed(self, msg: MessageExt) -> None:
        if msg.topic == RETAINED_TOPIC:
            self._retained(msg)
            return
        if msg.topic == SESSIONS_TOPIC:
            if msg.tags in (LIVE, CLAIM) and msg.keys and self._reads(msg):
                props = msg.properties
                self._claimed(msg.keys[0], props.get(HOLDER, self.holder), int(props.get(EPOCH, "0") or 0))
            return
        src = source_of(msg.broker_name, msg.topic, msg.queue_id)
        props = msg.properties
        pid = props.get(MQTT_PID)
        if pid is not None and pid.isdigit():
            self.engine.replayed_qos2(props.get(MQTT_CLIENT, ""), int(pid), src, msg.queue_offset)
        try:
            self.engine.route(mqtt_topic_of(msg.topic, props),
                              lambda: delivery_from_message(msg.topic, props, msg.body), src, msg.queue_offset)
        except (ValueError, KeyError) as exc:
            log.warning("%s: message %s of %s is not deliverable: %s", self.name, msg.msg_id, msg.topic, exc)
        self.positions[src] = msg.queue_offset

    def _reads(self, mq: MessageQueue | MessageExt) -> bool:
        """Whether this actor reads a queue's messages: every queue but MQTT_SESSIONS', whose queues
        are shared out among the node's actors."""
        return mq.topic != SESSIONS_TOPIC or mq.queue_id % len(self.siblings) == self.index

    def _claimed(self, client_id: str, holder: str, epoch: int) -> None:
        """A record of the client's new holder: whichever actor of this node held it before lets it go
        (this one, or a sibling the session directory names)."""
        if holder != self.holder:
            self._let_go(client_id, epoch)
        for i in self.directory.holders(client_id):
            name = self.siblings[i]
            if holder != f"{self.node_id}/{name}":
                self._spawn_send(ask(peer_path(self.ctx.run_path, name),
                                     {"op": "gone", "client": client_id, "epoch": epoch}))

    def _let_go(self, client_id: str, epoch: int) -> None:
        gone = self.engine.taken_elsewhere(client_id, epoch)
        if gone is not None:        # its record now: the feed goes on without it from here
            self._spawn_send(self._hand_over(gone, encode(gone, self._through(gone), self.holder)))

    async def _run_feed(self) -> None:
        feed, fed = self.feed, self._fed
        while True:
            for msg in await feed.poll(1.0):
                fed(msg)

    async def _write_records(self, msgs: list[Message], queue: int) -> None:
        """Store session records in batches of at most RECORDS_BATCH_BYTES: a checkpoint of 16,000
        sessions in one batch was refused as larger than a message may be, every round, for good."""
        mq = MessageQueue(SESSIONS_TOPIC, self.config.broker_name, queue)
        for batch in batched(msgs, lambda msg: len(msg.body), min(RECORDS_BATCH_BYTES,
                                                                  self.config.commitlog_file_size // 4)):
            result = await self.producer.send_batch(batch, queue=mq)
            if result.status is not SendStatus.SEND_OK:
                raise ClientError(f"session records stored with {result.status.name}")

    async def _commit_feed(self, position: dict[Source, int]) -> None:
        offsets = {}
        for src, offset in position.items():
            broker, topic, queue = parse_source(src)
            offsets[MessageQueue(topic, broker, queue)] = offset + 1
        await self.feed.commit(offsets)

    def _tick(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.tick()

    async def stop(self) -> None:
        """Close the listeners, tell the devices, write the last checkpoint and say goodbye to the
        brokers; each step bounded, as a broker of the cluster may be gone already."""
        for server in self.servers:
            server.close()
        for channel in ("admin", "peer_server"):
            closing = getattr(self, channel, None)
            if closing is not None:
                await closing.close()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutting_down()
            await _bounded(self.journal.checkpoint(final=True), "the last checkpoint")
        for part in ("feed", "producer", "cluster"):
            client = getattr(self, part, None)
            if client is not None:
                await _bounded(client.close(), f"closing the {part} client")
        directory = getattr(self, "directory", None)
        if directory is not None:
            directory.close()


async def _bounded(step: Awaitable[object], what: str) -> None:
    try:
        await asyncio.wait_for(step, STOP_STEP)
    except asyncio.TimeoutError:
        log.warning("mqtt: %s took over %gs; going on", what, STOP_STEP)


def batched(items: list[T], body_size: Callable[[T], int], most_bytes: int) -> Iterator[list[T]]:
    """items in consecutive SEND_BATCH-sized slices: at most BATCH_MESSAGES each, closed by the item
    that brings its bodies and MESSAGE_OVERHEAD each to most_bytes."""
    start = 0
    while start < len(items):
        end, size = start, 0
        while end < len(items) and end - start < BATCH_MESSAGES and size < most_bytes:
            size += body_size(items[end]) + MESSAGE_OVERHEAD
            end += 1
        yield items[start:end]
        start = end


def actor_index(holder: str) -> int:
    """mqtt-<i> of a holder "<broker>/<id>/mqtt-<i>" (0 when it names none)."""
    tail = holder.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


async def read_to_end(consumer: AsyncLitePullConsumer, queues: list[MessageQueue],
                      handle: Callable[[MessageExt], None], who: str, replay: bool = False,
                      limit: float = READ_LIMIT, progress: Any = None) -> None:
    """Poll until every queue is read up to the max offset it had when this began; give up only
    after `limit` seconds in which nothing came (100,000 session records take longer than that
    on a crowded node, and are not to be left half read). Each batch read counts on `progress`."""
    left = {}
    for mq in queues:
        target = await consumer.max_offset(mq)
        start = await consumer.committed(mq) if replay else 0
        if replay and start < 0:
            continue                     # a new feed starts at the end: nothing to replay
        if target > start:
            left[mq] = target - 1
    deadline = time.monotonic() + limit
    while left:
        if time.monotonic() > deadline:
            log.warning("%s: gave up reading %s to the end: nothing came for %gs", who, sorted(map(str, left)), limit)
            return
        batch = await consumer.poll(0.5)
        if batch:
            deadline = time.monotonic() + limit
            if progress is not None:
                progress[0] += 1
        for msg in batch:
            handle(msg)
            mq = MessageQueue(msg.topic, msg.broker_name, msg.queue_id)
            if mq in left and msg.queue_offset >= left[mq]:
                del left[mq]


def _reraise_unexpected(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("mqtt: a store task failed", exc_info=task.exception())
