"""Producers: AsyncProducer (the asyncio core) and Producer (its blocking facade, in blocking.py).

A send picks a queue round-robin over the topic's write queues, skips brokers the latency fault
tolerance is avoiding (fault.py), and on a failure retries on another broker (2 retries by
default) until the send's total timeout runs out; a timeout is never retried (the time is gone,
and the broker may have stored the message). Sync, async and callback sends share one callback-
driven state machine (_Send), so a send costs no coroutine or task of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from smartgo.client import api
from smartgo.client.config import ClientConfig
from smartgo.client.errors import (BrokerError, ClientError, ClientStateError, MessageError, NoRouteError,
                                   RequestTimeoutError, SendTimeoutError)
from smartgo.client.fault import LatencyFaultTolerance
from smartgo.client.instance import ClientInstance, MemberClient
from smartgo.client.message import (COMPRESS_OVER, MAX_MESSAGE_SIZE, REPLY_MESSAGE_FLAG, Message, MessageQueue,
                                    Prop, SendResult, SendStatus, compress_body)
from smartgo.client.route import QueueSelector, TopicPublishInfo, TopicRouteData, select_by_hash
from smartgo.client.trace import TraceDispatcher, end_transaction_record, pub_records
from smartgo.client.transaction import (LocalTransactionState, TransactionListener, TransactionSendResult,
                                        checked_message, decide, end_after_check, end_after_send)
from smartgo.client.uniq_id import uniq_ids
from smartgo.net.codes import ResponseCode as R
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection
from smartgo.net.errors import ConnectionClosedError, RemotingConnectError, RemotingError, RemotingTimeoutError
from smartgo.net.loop import wait_within
from smartgo.store.record import (COMPRESSED_FLAG, TRANSACTION_PREPARED_TYPE, MessageExt, encode_batch_body,
                                  encode_properties)

log = logging.getLogger(__name__)

#: Broker codes after which a send moves on to another broker (DefaultMQProducer's list, plus
#: SYSTEM_BUSY: SmartGo answers it while a broker actor restarts, and users ask for it, H.2 #4).
RETRY_CODES = frozenset({R.TOPIC_NOT_EXIST, R.SERVICE_NOT_AVAILABLE, R.SYSTEM_ERROR, R.NO_PERMISSION,
                         R.NO_BUYER_ID, R.NOT_IN_CURRENT_UNIT, R.SYSTEM_BUSY})
#: Answers of a broker that takes no sends now (a slave; a master handing its role over or made
#: read-only): the registries may route another, so routes are refreshed early.
STALE_ROUTE_CODES = frozenset({R.SERVICE_NOT_AVAILABLE, R.NO_PERMISSION})
SendCallback = Callable[[SendResult | None, BaseException | None], None]

@dataclass(slots=True)
class _Prepared:
    """A message encoded once for every attempt of one send."""

    topic: str
    body: bytes
    properties: str
    sys_flag: int
    flag: int
    msg_id: str
    batch: bool = False
    reply: bool = False             # MSG_TYPE "reply": sent as SEND_REPLY_MESSAGE_V2
    traced: tuple[Message, ...] = ()    # the message(s), when the producer traces them


class AsyncProducer(MemberClient):
    """An asyncio producer. Use `async with AsyncProducer(group, registry) as p: await p.send(m)`."""

    def __init__(self, group: str, registry: str | list[str], *, send_timeout: float = 3.0, retries: int = 2,
                 compress_over: int = COMPRESS_OVER, max_message_size: int = MAX_MESSAGE_SIZE,
                 fault_tolerance: bool = True, default_topic_queue_nums: int = api.DEFAULT_TOPIC_QUEUE_NUMS,
                 create_topic_key: str = api.DEFAULT_TOPIC, config: ClientConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 transaction_listener: TransactionListener | None = None, enable_msg_trace: bool = False,
                 trace_topic: str | None = None, **config_options: object) -> None:
        if not group:
            raise ValueError("a producer needs a group name")
        self.group = group
        self.config = config or ClientConfig.make(registry, **config_options)
        self.send_timeout = send_timeout
        self.retries = retries
        self.compress_over = compress_over
        self.max_message_size = max_message_size
        self.default_topic_queue_nums = default_topic_queue_nums
        self.create_topic_key = create_topic_key
        self.fault = LatencyFaultTolerance(clock, fault_tolerance)
        self.instance = ClientInstance(self.config)
        self._publish: dict[str, TopicPublishInfo] = {}
        self._lookups: dict[str, asyncio.Future[TopicPublishInfo]] = {}
        self._ids = uniq_ids()
        self._requests: dict[str, asyncio.Future[MessageExt]] = {}      # CORRELATION_ID -> its reply
        self._request_topics: set[str] = set()
        self.instance.reply_handler = self._on_reply
        self.transaction_listener = transaction_listener
        self.instance.check_handler = self._on_check
        #: Message trace (trace.py): a Pub record per message sent, an EndTransaction per decision.
        self.tracer = TraceDispatcher(self.config, trace_topic) if enable_msg_trace else None

    async def start(self) -> AsyncProducer:
        await super().start()
        if self.transaction_listener is not None:
            await self._register()
        else:
            self.instance.spawn(self._register())
        if self.tracer is not None:
            await self.tracer.start()
        return self

    async def _register(self) -> None:
        """Make the producer known to the brokers before it sends anything, as Java's is (its
        topic table starts with createTopicKey, whose route names the brokers; the first heartbeat
        follows): `producer-connections` lists an idle producer, and the check-back can ask a
        transactional producer restarted after a crash about the halves it left open, so that one
        waits for it. A registry without that topic (auto-creation off) leaves the producer unknown
        until it sends, as in Java."""
        try:
            await self.instance.update_route(self.create_topic_key)
        except Exception as exc:
            log.info("%s: no route of %s to learn the brokers from: %s", self.group, self.create_topic_key, exc)
        await self.instance.heartbeat_all()

    async def close(self) -> None:
        if self.tracer is not None:
            await self.tracer.close()
        await super().close()

    # -- membership -----------------------------------------------------------------------------

    def topics(self) -> set[str]:
        return set(self._publish) | {self.create_topic_key}

    def on_route(self, topic: str, route: TopicRouteData) -> None:
        info = TopicPublishInfo(topic, route)
        if info.ok:
            self._publish[topic] = info

    def heartbeat_entry(self) -> tuple[str, dict | None]:
        return "producer", None

    # -- routes -----------------------------------------------------------------------------------

    async def publish_info(self, topic: str) -> TopicPublishInfo:
        """The topic's write queues: its own route, else TBW102's (the broker then creates the
        topic on the first send, with min(4, TBW102's queue count) queues)."""
        info = self._publish.get(topic)
        if info is not None and info.ok:
            return info
        pending = self._lookups.get(topic)
        if pending is not None:
            return await asyncio.shield(pending)
        fut = asyncio.get_running_loop().create_future()
        self._lookups[topic] = fut
        try:
            info = await self._lookup(topic)
            fut.set_result(info)
            return info
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()
            raise
        finally:
            del self._lookups[topic]

    async def _lookup(self, topic: str) -> TopicPublishInfo:
        route = await self.instance.fetch_route(topic)
        if route is not None:
            self.instance.remember_route(topic, route)
        if route is not None:
            info = TopicPublishInfo(topic, route)
        else:
            default = await self.instance.fetch_route(self.create_topic_key)
            if default is None:
                raise NoRouteError(topic, f"it does not exist and there is no {self.create_topic_key} route to "
                                          "auto-create it (is a broker registered with the registry?)")
            self.instance.remember_route(self.create_topic_key, default)
            info = TopicPublishInfo(topic, default.as_default_route(self.default_topic_queue_nums), from_default=True)
        if not info.ok:
            raise NoRouteError(topic, "no writable queue on a broker with a master")
        self._publish[topic] = info
        return info

    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        return list((await self.publish_info(topic)).queues)

    # -- sends ------------------------------------------------------------------------------------

    def _prepare(self, msg: Message) -> _Prepared:
        msg.validate(self.max_message_size)
        props = msg.wire_properties()
        msg_id = props[Prop.UNIQ_KEY] = self._ids.next_id()
        body = bytes(msg.body)
        sys_flag = 0
        if len(body) >= self.compress_over:
            body = compress_body(body)
            sys_flag |= COMPRESSED_FLAG
        return _Prepared(msg.topic, body, encode_properties(props).decode("utf-8"), sys_flag, msg.flag, msg_id,
                         reply=props.get(Prop.MSG_TYPE) == REPLY_MESSAGE_FLAG,
                         traced=(msg,) if self.tracer is not None else ())

    def _prepare_batch(self, msgs: Sequence[Message]) -> _Prepared:
        if not msgs:
            raise MessageError("a batch needs at least one message")
        topic = msgs[0].topic
        items, ids = [], []
        for msg in msgs:
            if msg.topic != topic:
                raise MessageError(f"a batch goes to one topic: {msg.topic!r} differs from {topic!r}")
            if msg.delay_level or msg.deliver_time_ms or msg.delay_time_ms:
                raise MessageError("delayed and timer messages cannot be sent in a batch")
            msg.validate(self.max_message_size)
            props = msg.wire_properties()
            props[Prop.UNIQ_KEY] = uid = self._ids.next_id()
            ids.append(uid)
            items.append((bytes(msg.body), msg.flag, encode_properties(props)))
        body = encode_batch_body(items)
        if len(body) > self.max_message_size:
            raise MessageError(f"the batch is {len(body)} bytes, over the {self.max_message_size}-byte limit")
        wait = "true" if msgs[0].wait_store_ok else "false"
        return _Prepared(topic, body, f"{Prop.WAIT}\x01{wait}", 0, 0, ",".join(ids), batch=True,
                         traced=tuple(msgs) if self.tracer is not None else ())

    def _command(self, prep: _Prepared, mq: MessageQueue) -> RemotingCommand:
        fields = api.send_fields(self.group, prep.topic, mq.queue_id, prep.sys_flag, int(time.time() * 1000),
                                 prep.flag, prep.properties, batch=prep.batch, default_topic=self.create_topic_key,
                                 default_queue_nums=self.default_topic_queue_nums)
        return api.send_request(fields, prep.body, prep.batch, reply=prep.reply)

    def _check_running(self) -> None:
        if not self.instance.started or self.instance.closed:
            raise ClientStateError("producer is not started" if not self.instance.started else "producer is closed")

    def send_async(self, msg: Message, callback: SendCallback | None = None, timeout: float | None = None,
                   *, queue: MessageQueue | None = None) -> asyncio.Future[SendResult]:
        """Start a send; returns a future for its SendResult, and calls callback(result, error)
        when done. A bad message raises MessageError at once."""
        self._check_running()
        return _Send(self, self._prepare(msg), timeout, callback, queue).future

    async def send(self, msg: Message, timeout: float | None = None) -> SendResult:
        """Send and wait for the broker: SendResult, or an exception once retries are spent."""
        return await self.send_async(msg, None, timeout)

    async def send_to_queue(self, msg: Message, queue: MessageQueue, timeout: float | None = None) -> SendResult:
        """Send to one given queue (no retry elsewhere: the caller chose the queue)."""
        return await self.send_async(msg, None, timeout, queue=queue)

    async def send_orderly(self, msg: Message, sharding_key: object, selector: QueueSelector = select_by_hash,
                           timeout: float | None = None) -> SendResult:
        """Send through a queue selector: messages with one sharding key go to one queue, in the
        order they are sent (await each send before the next one of the same key)."""
        self._check_running()
        prep = self._prepare(msg)
        info = await self.publish_info(msg.topic)
        queue = selector(info.queues, sharding_key)
        return await _Send(self, prep, timeout, None, queue).future

    async def send_batch(self, msgs: Sequence[Message], timeout: float | None = None, *,
                         queue: MessageQueue | None = None) -> SendResult:
        """Send messages of one topic in one SEND_BATCH_MESSAGE request, stored together in one
        queue (the given one, with no retry elsewhere, as Java's send(msgs, mq): an ordered
        batch). msg_id and offset_msg_id are comma-joined; queue_offset is the first message's."""
        self._check_running()
        return await _Send(self, self._prepare_batch(msgs), timeout, None, queue).future

    async def send_oneway(self, msg: Message) -> None:
        """Write the request and return: no response, no retry, no delivery guarantee."""
        self._check_running()
        prep = self._prepare(msg)
        info = await self.publish_info(prep.topic)
        mq = info.select(None, self.fault)
        addr = await self.instance.master_addr(mq.broker_name, prep.topic)
        await self.instance.invoke_oneway(addr, self._command(prep, mq))

    # -- transactions (transaction.py) -----------------------------------------------------------

    async def send_in_transaction(self, msg: Message, arg: object = None,
                                  timeout: float | None = None) -> TransactionSendResult:
        """Send msg as a half message, run the transaction listener's execute(msg, arg), and
        commit or roll back the message by its answer (sendMessageInTransaction). A failed send
        raises, and execute does not run; DELAY is dropped, as the Java client drops it; a timer
        stays and times the committed message, as in 5.x."""
        self._check_running()
        if self.transaction_listener is None:
            raise ClientStateError("send_in_transaction needs the producer's transaction_listener")
        prep = self._prepare(dataclasses.replace(msg, delay_level=0))
        prep.properties += f"\x02{Prop.TRAN_MSG}\x01true\x02{Prop.PGROUP}\x01{self.group}"
        prep.sys_flag |= TRANSACTION_PREPARED_TYPE
        sent = await _Send(self, prep, timeout, None, None).future
        state = (await decide(self.transaction_listener.execute, msg, arg) if sent.status is SendStatus.SEND_OK
                 else LocalTransactionState.ROLLBACK_MESSAGE)
        try:
            addr = await self.instance.master_addr(sent.queue.broker_name, msg.topic)
            await self.instance.invoke_oneway(addr, end_after_send(self.group, sent, state))
        except (ClientError, RemotingError) as exc:      # the broker's check-back asks again later
            log.warning("%s: END_TRANSACTION %s of %s was not sent: %s", self.client_id, state.name, sent.msg_id, exc)
        else:
            if self.tracer is not None:
                self.tracer.append(end_transaction_record(
                    self.group, msg.topic, sent.msg_id, msg.tags, msg.keys_text, addr, state.name, False,
                    sent.region_id))
        fields = (getattr(sent, f.name) for f in dataclasses.fields(sent))  # a SendResult's: no local_state
        return TransactionSendResult(*fields, local_state=state)  # type: ignore[misc]  # see above

    async def _on_check(self, conn: Connection, cmd: RemotingCommand) -> None:
        """CHECK_TRANSACTION_STATE: ask the listener, answer with END_TRANSACTION on that connection."""
        try:
            msg = checked_message(cmd)
        except ValueError as exc:
            log.warning("%s: a transaction check from %s: %s", self.client_id, conn.remote_address, exc)
            return
        if self.transaction_listener is None or msg.properties.get(Prop.PGROUP) != self.group:
            log.warning("%s: a transaction check from %s for group %s, which this producer cannot answer",
                        self.client_id, conn.remote_address, msg.properties.get(Prop.PGROUP))
            return
        state = await decide(self.transaction_listener.check, msg)
        try:
            conn.invoke_oneway(end_after_check(self.group, cmd, state))
        except (KeyError, ValueError, RemotingError) as exc:     # a check header without its offsets, or gone
            log.warning("%s: the answer to a transaction check was not sent: %r", self.client_id, exc)
            return
        if self.tracer is not None:
            props = msg.properties
            self.tracer.append(end_transaction_record(
                self.group, props.get(Prop.REAL_TOPIC, msg.topic), msg.uniq_key or msg.msg_id, msg.tags,
                props.get(Prop.KEYS), conn.remote_address, state.name, True, props.get(Prop.MSG_REGION)))

    # -- request-reply ----------------------------------------------------------------------------

    async def request(self, msg: Message, timeout: float = 3.0) -> MessageExt:
        """Send msg and wait for its reply (request-reply, RocketMQ 4.6+): a consumer answers it
        with create_reply_message and a producer; the broker pushes the reply to this client.
        The message goes out with CORRELATION_ID, REPLY_TO_CLIENT and TTL; timeout (seconds)
        covers the send and the wait. A failed send raises its error; no reply in time raises
        RequestTimeoutError (a reply after that is dropped with a log line)."""
        self._check_running()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        correlation_id = str(uuid.uuid4())
        request = dataclasses.replace(msg, properties={
            **msg.properties, Prop.CORRELATION_ID: correlation_id, Prop.REPLY_TO_CLIENT: self.client_id,
            Prop.TTL: str(int(timeout * 1000))})
        if msg.topic not in self._request_topics:
            # prepareSendRequest: the brokers must know this client's connection before a reply comes
            await self.publish_info(msg.topic)
            await self.instance.heartbeat_all()
            self._request_topics.add(msg.topic)
        reply: asyncio.Future[MessageExt] = loop.create_future()
        self._requests[correlation_id] = reply
        try:
            sent = self.send_async(request, None, max(deadline - loop.time(), 0.001))

            def failed(f: asyncio.Future) -> None:
                if (exc := f.exception()) is not None and not reply.done():
                    reply.set_exception(exc)

            sent.add_done_callback(failed)
            await asyncio.wait((reply,), timeout=max(deadline - loop.time(), 0))
            if reply.done():
                return reply.result()
            state = "was sent" if sent.done() else "is still being sent"
            raise RequestTimeoutError(f"request {correlation_id} to topic {msg.topic} {state}, but no reply came "
                                      f"within {timeout:g} s")
        finally:
            del self._requests[correlation_id]

    async def _on_reply(self, cmd: RemotingCommand) -> RemotingCommand:
        """PUSH_REPLY_MESSAGE_TO_CLIENT: the reply goes to the request waiting for its CORRELATION_ID."""
        try:
            msg = api.decode_reply(cmd, int(time.time() * 1000))
        except (ValueError, zlib.error) as exc:
            log.warning("%s: a reply push does not decode: %s", self.client_id, exc)
            return cmd.make_response(R.SYSTEM_ERROR, "process reply message fail")
        correlation_id = msg.properties.get(Prop.CORRELATION_ID)
        waiting = self._requests.get(correlation_id)  # type: ignore[arg-type]  # None finds nothing
        if waiting is None or waiting.done():
            log.warning("%s: receive reply message, but not matched any request (late, after its timeout?), "
                        "CorrelationId: %s, reply from host: %s:%d; dropped", self.client_id, correlation_id,
                        *msg.born_host)
        else:
            waiting.set_result(msg)
        return cmd.make_response(R.SUCCESS)


class _Send:
    """One send with its retries, driven by response callbacks. Resolves `future` exactly once."""

    __slots__ = ("producer", "prep", "future", "callback", "fixed_queue", "deadline", "attempts", "last_broker",
                 "last_error", "loop", "mq", "started")

    def __init__(self, producer: AsyncProducer, prep: _Prepared, timeout: float | None,
                 callback: SendCallback | None, fixed_queue: MessageQueue | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.producer = producer
        self.prep = prep
        self.future: asyncio.Future[SendResult] = self.loop.create_future()
        self.callback = callback
        self.fixed_queue = fixed_queue
        self.deadline = self.loop.time() + (producer.send_timeout if timeout is None else timeout)
        self.attempts = 1 if fixed_queue is not None else 1 + producer.retries
        self.last_broker: str | None = None
        self.last_error: BaseException | None = None
        self.mq: MessageQueue | None = None
        self.started = 0.0
        info = producer._publish.get(prep.topic)
        if fixed_queue is None and (info is None or not info.ok):
            self.loop.create_task(self._resolve_route_then_attempt())
        else:
            self._attempt(info)

    async def _resolve_route_then_attempt(self) -> None:
        try:
            info = await self.producer.publish_info(self.prep.topic)
        except BaseException as exc:
            self._finish(None, exc)
            return
        self._attempt(info)

    def _attempt(self, info: TopicPublishInfo | None) -> None:
        producer = self.producer
        left = self.deadline - self.loop.time()
        if self.attempts <= 0 or left <= 0:
            self._give_up(left)
            return
        self.attempts -= 1
        fault = producer.fault
        mq = self.fixed_queue or info.select(self.last_broker, fault)  # type: ignore[union-attr]  # routed first
        self.mq = mq
        instance = producer.instance
        addr = instance.broker_addr(mq.broker_name, only_this=True)
        if addr is None:
            self.loop.create_task(self._connect_then_invoke(mq, None, left))
            return
        conn = instance.cached_connection(addr)
        if conn is None:
            self.loop.create_task(self._connect_then_invoke(mq, addr, left))
            return
        self._invoke(conn, addr, left)

    async def _connect_then_invoke(self, mq: MessageQueue, addr: str | None, left: float) -> None:
        instance = self.producer.instance
        try:
            if addr is None:
                addr = await instance.master_addr(mq.broker_name, self.prep.topic)
            conn = await wait_within(instance.connect(addr), left)
        except asyncio.TimeoutError:
            self._give_up(0)
            return
        except (RemotingError, ClientError) as exc:
            self._failed(mq.broker_name, exc)
            return
        except BaseException as exc:
            self._finish(None, exc)
            return
        self._invoke(conn, addr, self.deadline - self.loop.time())

    def _invoke(self, conn, addr: str, left: float) -> None:
        if left <= 0:
            self._give_up(left)
            return
        self.started = self.loop.time()
        try:
            request = self.producer._command(self.prep, self.mq)  # type: ignore[arg-type]  # mq: chosen by now
            conn.invoke_async(request, left, lambda resp, err: self._on_response(resp, err, addr))
        except (RemotingError, OSError) as exc:
            self._failed(self.mq.broker_name, exc)  # type: ignore[union-attr]  # mq: chosen by now

    def _on_response(self, resp: RemotingCommand | None, err: BaseException | None, addr: str) -> None:
        mq = self.mq
        broker = mq.broker_name  # type: ignore[union-attr]  # mq: chosen by now
        latency_ms = (self.loop.time() - self.started) * 1000.0
        fault = self.producer.fault
        if err is not None:
            fault.update(broker, latency_ms, isolation=True)
            if isinstance(err, RemotingTimeoutError):
                self._finish(None, SendTimeoutError(f"send to {broker} ({addr}) timed out: {err}; not retried "
                                                    "(the broker may have stored it)"))
            else:
                self._failed(broker, err)
            return
        try:
            result = api.decode_send(resp, mq, self.prep.msg_id, addr)  # type: ignore[arg-type]  # resp: no err
        except BrokerError as exc:
            fault.update(broker, latency_ms, isolation=True)
            if exc.code in STALE_ROUTE_CODES:
                self.producer.instance.refresh_soon()
            if exc.code in RETRY_CODES:
                self._failed(broker, exc)
            else:
                self._finish(None, exc)
            return
        fault.update(broker, latency_ms)
        prep = self.prep
        tracer = self.producer.tracer
        if prep.traced and tracer is not None and result.trace_on:
            tracer.extend(pub_records(self.producer.group, prep.traced, result, addr, int(latency_ms),
                                      bool(prep.sys_flag & TRANSACTION_PREPARED_TYPE)))
        self._finish(result, None)

    def _failed(self, broker: str, exc: BaseException) -> None:
        log.info("send of %s to %s failed (%s); %d attempt(s) left", self.prep.msg_id, broker, exc, self.attempts)
        self.last_broker = broker
        self.last_error = exc
        if isinstance(exc, (RemotingConnectError, ConnectionClosedError)):
            self.producer.fault.update(broker, 0, isolation=True)
        self._attempt(self.producer._publish.get(self.prep.topic))

    def _give_up(self, left: float) -> None:
        if self.last_error is not None and (self.attempts <= 0 or self.fixed_queue is not None):
            self._finish(None, self.last_error)
        else:
            total = self.producer.send_timeout
            self._finish(None, SendTimeoutError(f"send to topic {self.prep.topic} did not complete within its "
                                                f"timeout ({total:g} s)" + (f"; last error: {self.last_error}"
                                                                            if self.last_error else "")))

    def _finish(self, result: SendResult | None, exc: BaseException | None) -> None:
        fut = self.future
        if fut.done():
            return
        if exc is None:
            fut.set_result(result)  # type: ignore[arg-type]  # no exc: a result
        else:
            fut.set_exception(exc)
        if self.callback is not None:
            try:
                self.callback(result, exc)
            except Exception:
                log.exception("send callback %r failed", self.callback)
            if exc is not None:
                fut.exception()  # the callback saw it: no "exception never retrieved" warning

