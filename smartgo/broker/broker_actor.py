"""The broker actor: the control plane (minimal until the control-plane issue grows it).

It owns the topic table (default topics, the static `topics` setting, auto-creation through
TBW102) and hands it to the net actors as a snapshot file plus a board version
(smartgo.broker.topics); it registers with every registry at start, on each topic change and
every register_interval, and unregisters at a clean stop; and it serves the request channel
(smartgo.broker.channel): calls such as create_topic, and whole remoting requests that net
actors forward because their code is in FORWARDED_CODES.

Adding a control request code: give BrokerActor a processor for it in `_processors()` and add
the code to FORWARDED_CODES; net actors then forward it with responses routed back to the
client's connection, and `self.channel.push(client, cmd)` reaches that client later.
"""

from __future__ import annotations

import asyncio
import time

from smartgo.actors.actor import Actor, ActorContext
from smartgo.actors.ring import CONSUMER, PRODUCER
from smartgo.broker.channel import ChannelServer, ClientRef
from smartgo.broker.registration import BrokerIdentity, Registrar
from smartgo.broker.rings import SMALL_RING_CAPACITY
from smartgo.broker.settings import broker_addr, ha_addr, registry_addrs
from smartgo.broker.topics import (DEFAULT_TOPIC, TopicConfig, TopicSnapshot, auto_created, default_topics,
                                   parse_static_topics, read_snapshot, write_snapshot)
from smartgo.net import fastjson
from smartgo.net.codes import PermName, RequestCode, ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.store.errors import MessageIllegalError
from smartgo.store.record import topic_field

#: Remoting request codes the net actors hand to the broker actor whole.
FORWARDED_CODES = frozenset({RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.UPDATE_AND_CREATE_TOPIC})


class BrokerActor(Actor):
    def __init__(self, ctx: ActorContext, *, nets: list[str]) -> None:
        super().__init__(ctx)
        self.nets = nets
        self._register_task: asyncio.Task | None = None
        self._register_again = False
        self.every(ctx.config.register_interval, self.register_soon, "register")

    async def start(self) -> None:
        self.version = self.board.scalar("broker.topics_version", writer=self.name)
        self.snapshot = self._load_topics()
        self.version.set(self.snapshot.version)
        self.channel = ChannelServer(
            {net: self.ring(f"ctl.{net}", CONSUMER, SMALL_RING_CAPACITY) for net in self.nets},
            {net: self.ring(f"ctlr.{net}", PRODUCER, SMALL_RING_CAPACITY) for net in self.nets})
        self.channel.calls["create_topic"] = self.create_topic
        self.channel.processors.update(self._processors())
        self.spawn(self.channel.run(self.bell), "channel")
        self.registrar = Registrar(BrokerIdentity(self.config.cluster_name, self.config.broker_name,
                                                  broker_addr(self.config), ha_addr(self.config)),
                                   registry_addrs(self.config))
        self.log.info("broker %s at %s: %d topics (version %d), registries %s", self.config.broker_name,
                      broker_addr(self.config), len(self.snapshot.topics), self.snapshot.version,
                      ";".join(self.registrar.registries))

    def _processors(self) -> dict:
        return {RequestCode.GET_ALL_TOPIC_CONFIG: self.get_all_topic_config,
                RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_and_create_topic}

    # ---- topics ---------------------------------------------------------------------------------------
    def _load_topics(self) -> TopicSnapshot:
        store = self.config.store_path
        try:
            saved = read_snapshot(store)
        except (ValueError, KeyError, TypeError) as exc:
            self.log.error("topic table %s does not parse (%s); starting from the defaults", store, exc)
            saved = None
        base = saved or TopicSnapshot(0, 0, {})
        merged = dict(base.topics)
        static = {c.name for c in parse_static_topics(self.config.topics)}
        for cfg in default_topics(self.config):
            if cfg.name not in merged or cfg.name in static:     # the settings win for the topics they name
                merged[cfg.name] = cfg
        if saved is not None and merged == saved.topics:
            return saved
        snap = TopicSnapshot(base.version + 1, time.time_ns() // 1_000_000, merged)
        write_snapshot(store, snap)
        return snap

    def _publish(self, changed: list[TopicConfig]) -> None:
        self.snapshot = self.snapshot.with_topics(changed)
        write_snapshot(self.config.store_path, self.snapshot)
        self.version.set(self.snapshot.version)            # net actors reload on the next request
        self.register_soon()

    async def create_topic(self, net: str, args: dict) -> dict | None:
        """Auto-creation on first send (createTopicInSendMessageMethod): the topic's config, or
        None when the template topic is missing or not inheritable."""
        name = args["topic"]
        existing = self.snapshot.topics.get(name)
        if existing is not None:
            return existing.to_json()
        template = self.snapshot.topics.get(args["default_topic"])
        if template is None or not template.perm & PermName.INHERIT:
            return None
        cfg = auto_created(name, template, int(args["queues"]), int(args.get("sys_flag", 0)))
        self.log.info("auto-created topic %s (%d queues) for a producer of %s", name, cfg.write_queues, net)
        self._publish([cfg])
        return cfg.to_json()

    async def update_and_create_topic(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        """UPDATE_AND_CREATE_TOPIC (AdminBrokerProcessor.updateAndCreateTopic): create or replace."""
        topic = request.ext_str("topic")
        try:
            topic_field(topic)
        except MessageIllegalError:
            return request.make_response(ResponseCode.SYSTEM_ERROR, f"The specified topic[{topic[:200]}] contains "
                                         "illegal characters or is longer than 127, allowing only ^[%|a-zA-Z0-9_-]+$")
        if topic == request.ext_str("defaultTopic", DEFAULT_TOPIC) and topic == DEFAULT_TOPIC:
            return request.make_response(ResponseCode.SYSTEM_ERROR,
                                         f"The topic[{topic}] is conflict with system reserved words.")
        cfg = TopicConfig(topic, request.ext_int("readQueueNums"), request.ext_int("writeQueueNums"),
                          request.ext_int("perm"), request.ext_str("topicFilterType", "SINGLE_TAG"),
                          request.ext_int("topicSysFlag", 0), request.ext_bool("order", False))
        if not (0 < cfg.read_queues <= 1024 and 0 < cfg.write_queues <= 1024):
            return request.make_response(ResponseCode.SYSTEM_ERROR, "readQueueNums and writeQueueNums must be in "
                                         f"1..1024, got {cfg.read_queues} and {cfg.write_queues}")
        if self.snapshot.topics.get(topic) != cfg:
            self.log.info("topic %s set by %s: %s", topic, client.addr, cfg)
            self._publish([cfg])
        return request.make_response(ResponseCode.SUCCESS)

    async def get_all_topic_config(self, client: ClientRef, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS, body=fastjson.dumps(self.snapshot.wrapper_json()))

    # ---- registration -------------------------------------------------------------------------------------
    def register_soon(self) -> None:
        """Register now (coalesced: one more round after the running one if something changed)."""
        if self._register_task is not None and not self._register_task.done():
            self._register_again = True
            return
        self._register_task = asyncio.get_running_loop().create_task(self._register())

    async def _register(self) -> None:
        while True:
            self._register_again = False
            await self.registrar.register(self.snapshot)
            if not self._register_again:
                return

    async def stop(self) -> None:
        if self._register_task is not None:
            await asyncio.gather(self._register_task, return_exceptions=True)
        await self.registrar.unregister()
        await self.registrar.close()
        await self.channel.close()
