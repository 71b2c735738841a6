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
from collections.abc import Callable
from typing import Any

from smartgo.actors.actor import Actor, ActorContext
from smartgo.client.config import ClientConfig
from smartgo.client.errors import ClientError
from smartgo.client.lite_pull_consumer import AsyncLitePullConsumer
from smartgo.client.message import ConsumeFromWhere, Message, MessageModel, MessageQueue, SendStatus
from smartgo.client.admin import AsyncAdmin
from smartgo.client.producer import AsyncProducer
from smartgo.config import NodeConfig
from smartgo.mqtt import codec as c
from smartgo.mqtt.auth import Authenticator
from smartgo.mqtt.bridge import TopicMap, delivery_from_message, publish_properties
from smartgo.mqtt.engine import Connection, Engine, Limits
from smartgo.mqtt.session import Session
from smartgo.mqtt.listeners import WebSocketConnection, listening_socket
from smartgo.net.tls import server_context
from smartgo.store.record import MessageExt

log = logging.getLogger(__name__)

#: Where retained messages are kept, one queue per broker: read from its start when an actor starts.
RETAINED_TOPIC = "MQTT_RETAINED"
BATCH_MESSAGES = 256
BATCH_BYTES = 1 << 20
Done = Callable[[int], None]


def client_config(cfg: NodeConfig, name: str) -> ClientConfig:
    """The actor's own client of its cluster: this node's registries, its ACL account, loopback."""
    registry = cfg.registry or f"127.0.0.1:{cfg.embedded_registry_port}"
    return ClientConfig.make(registry, instance_name=f"{cfg.broker_name}-{name}", client_ip="127.0.0.1",
                             access_key=cfg.acl_access_key, secret_key=cfg.acl_secret_key,
                             use_tls=cfg.tls_mode == "enforcing")


class Publisher:
    """The engine's StoreSide: device publishes stored as SmartGo messages on this node's broker,
    coalesced per queue into SEND_BATCH_MESSAGE requests."""

    def __init__(self, producer: AsyncProducer, topic_map: TopicMap, broker_name: str,
                 spawn: Callable[[Any], Any]) -> None:
        self.producer = producer
        self.map = topic_map
        self.broker_name = broker_name
        self.spawn = spawn
        self.pending: dict[tuple[str, int], list[tuple[Message, Done]]] = {}
        self.scheduled = False
        self.queues: dict[str, list[MessageQueue]] = {}

    def store(self, publish: c.Publish, client_id: str, done: Done) -> None:
        topic = self.map.smartgo_topic(publish.topic)
        if topic is None:
            log.warning("mqtt %s: no mqtt_topic_map rule takes topic %s; not stored", client_id, publish.topic)
            done(c.TOPIC_NAME_INVALID)
            return
        props = publish_properties(publish.topic, publish.qos, publish.retain, client_id, publish.properties,
                                   int(time.time() * 1000))
        tags = props.pop("TAGS", None)
        keys = props.pop("KEYS", None)
        body = bytes(publish.payload)
        if publish.retain:
            both = _Both(done)
            self._add(RETAINED_TOPIC, 0, Message(RETAINED_TOPIC, body, tags, keys, dict(props)), both.one)
            done = both.one
        self._add(topic, self.map.queue_for(publish.topic, 1 << 30), Message(topic, body, tags, keys, props), done)

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
            start = 0
            while start < len(items):
                end, size = start, 0
                while end < len(items) and end - start < BATCH_MESSAGES and size < BATCH_BYTES:
                    size += len(items[end][0].body) + 200
                    end += 1
                self.spawn(self._send(topic, key, items[start:end]))
                start = end

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
        except ClientError as exc:
            self.queues.pop(topic, None)
            log.warning("mqtt: %d publishes to %s not stored: %s", len(items), topic, exc)
            reason = c.QUOTA_EXCEEDED if "disk" in str(exc).lower() else c.UNSPECIFIED_ERROR
        for _, done in items:
            done(reason)

    def session_changed(self, session: Session) -> None:
        pass

    def session_ended(self, client_id: str) -> None:
        pass


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
                             max_keep_alive=cfg.mqtt_max_keep_alive)
        self.auth = Authenticator(cfg.mqtt_users_file, cfg.mqtt_allow_anonymous)
        self.servers: list[asyncio.AbstractServer] = []
        self.every(1.0, self._tick)

    async def start(self) -> None:
        cfg = self.config
        options = client_config(cfg, self.name)
        self.producer = AsyncProducer(f"MQTT_{cfg.broker_name}", cfg.registry or options.registry,
                                      config=options)
        self.publisher = Publisher(self.producer, self.topic_map, cfg.broker_name, self._spawn_send)
        self.engine = Engine(self.limits, self.publisher, self.auth)
        await self._create_topics(options)
        await self.producer.start()
        self.feed = AsyncLitePullConsumer(f"MQTT_{cfg.broker_name}_{self.name}".replace("-", "_"),
                                          options.registry, model=MessageModel.BROADCASTING, config=options,
                                          pull_batch_size=64, offset_store_dir=cfg.store_path / "mqtt",
                                          auto_commit_interval=1.0)
        for topic in self.topic_map.topics:
            self.feed.subscribe(topic, "*")
        await self.feed.start()
        # retained messages: read from the start at every start (a fresh offset store, nothing committed)
        fresh = self.ctx.run_path / f"{self.name}-retained"
        shutil.rmtree(fresh, ignore_errors=True)
        self.retained_feed = AsyncLitePullConsumer(
            f"MQTT_RETAINED_{cfg.broker_name}_{self.name}".replace("-", "_"), options.registry,
            model=MessageModel.BROADCASTING, consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, config=options,
            auto_commit=False, pull_batch_size=64, offset_store_dir=fresh)
        self.retained_feed.subscribe(RETAINED_TOPIC, "*")
        await self.retained_feed.start()
        self.spawn(self._run_feed(self.feed, False), "feed")
        self.spawn(self._run_feed(self.retained_feed, True), "retained")
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

    async def _create_topics(self, options: ClientConfig) -> None:
        """The bridged topics and the retained topic on this node's broker, when they are missing."""
        cfg = self.config
        admin = await AsyncAdmin(options.registry, config=options).start()
        addr = f"127.0.0.1:{cfg.listen_port}"
        try:
            for topic in [*self.topic_map.topics, RETAINED_TOPIC]:
                queues = 1 if topic == RETAINED_TOPIC else cfg.mqtt_topic_queues
                for attempt in range(50):
                    try:
                        await admin.create_topic(topic, queues, broker_addr=addr)
                        break
                    except ClientError as exc:
                        if attempt == 49:
                            raise
                        log.info("%s: creating topic %s: %s; again", self.name, topic, exc)
                        await asyncio.sleep(0.2)
        finally:
            await admin.close()

    async def _run_feed(self, feed: AsyncLitePullConsumer, retained: bool) -> None:
        engine = self.engine
        while True:
            msgs: list[MessageExt] = await feed.poll(1.0)
            for msg in msgs:
                try:
                    d = delivery_from_message(msg.topic, msg.properties, msg.body)
                except (ValueError, KeyError) as exc:
                    log.warning("%s: message %s of %s is not deliverable: %s", self.name, msg.msg_id, msg.topic, exc)
                    continue
                if retained:
                    engine.retain(d.topic, d if d.payload else None)
                else:
                    engine.deliver(d)

    def _tick(self) -> None:
        self.engine.tick()

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutting_down()
        for part in ("feed", "retained_feed", "producer"):
            client = getattr(self, part, None)
            if client is not None:
                await client.close()


def _reraise_unexpected(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("mqtt: a store task failed", exc_info=task.exception())
