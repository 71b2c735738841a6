"""Blocking facades over the asyncio core: Producer, PushConsumer, PullConsumer, LitePullConsumer
and Admin.

Each runs its async twin on a private event loop in a daemon thread; a blocking call submits a
coroutine there and waits. Send callbacks run on that loop thread (keep them short); a
PushConsumer's plain-function listener runs on its consume threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from smartgo.client.admin import AsyncAdmin
from smartgo.client.errors import ClientStateError
from smartgo.client.lite_pull_consumer import AsyncLitePullConsumer
from smartgo.client.listener import BatchListener, Listener
from smartgo.client.message import Message, MessageQueue, SendResult
from smartgo.client.producer import AsyncProducer, SendCallback
from smartgo.client.pull_consumer import AsyncPullConsumer
from smartgo.client.push_consumer import AsyncPushConsumer
from smartgo.client.subscription import MessageSelector, build_subscription
from smartgo.net.loop import new_event_loop

log = logging.getLogger(__name__)


class LoopThread:
    """An event loop running in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        if threading.current_thread() is self.thread:
            coro.close()
            raise ClientStateError("a blocking client call was made on its own loop thread (from a callback?); "
                                   "use the Async* client there")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10.0)
        if not self.loop.is_running():
            self.loop.close()


def _blocking(name: str, core_class: type) -> Callable:
    """A method that runs core_class.name (a coroutine method) and waits for it."""
    method = getattr(core_class, name)

    def call(self: _Facade, *args: Any, **kwargs: Any) -> Any:
        return self._run(getattr(self._started_core(), name)(*args, **kwargs))
    functools.update_wrapper(call, method)
    return call


class _Facade:
    _core_class: ClassVar[type]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args = args
        self._kwargs = kwargs
        self._thread: LoopThread | None = None
        self._core: Any = None
        self._closed = False

    def _run(self, coro: Any) -> Any:
        return self._thread.run(coro)  # type: ignore[union-attr]  # set by start()

    def _started_core(self) -> Any:
        if self._core is None or self._closed:
            raise ClientStateError(f"{type(self).__name__} is {'closed' if self._closed else 'not started'}")
        return self._core

    async def _make(self) -> Any:
        return self._core_class(*self._args, **self._kwargs)

    def _create(self) -> Any:
        if self._closed:
            raise ClientStateError(f"{type(self).__name__} is closed; create a new one")
        if self._core is None:
            self._thread = LoopThread(f"smartgo-{type(self).__name__.lower()}")
            self._core = self._run(self._make())
        return self._core

    def start(self) -> Any:
        core = self._create()
        try:
            self._run(core.start())
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            try:
                self._run(self._core.close())
            finally:
                self._thread.stop()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client_id(self) -> str:
        return self._create().instance.client_id

    def _on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a plain core method on the loop thread (it changes or reads state the loop owns);
        it has happened when this returns."""
        return self._run(_snapshot(lambda: fn(*args)))


class Producer(_Facade):
    """Blocking producer: `with Producer("PG", "127.0.0.1:9876") as p: p.send(Message(...))`.
    Options are AsyncProducer's."""

    _core_class = AsyncProducer
    send = _blocking("send", AsyncProducer)
    send_batch = _blocking("send_batch", AsyncProducer)
    send_orderly = _blocking("send_orderly", AsyncProducer)
    send_to_queue = _blocking("send_to_queue", AsyncProducer)
    send_oneway = _blocking("send_oneway", AsyncProducer)
    request = _blocking("request", AsyncProducer)
    send_in_transaction = _blocking("send_in_transaction", AsyncProducer)
    fetch_publish_queues = _blocking("fetch_publish_queues", AsyncProducer)

    def send_async(self, msg: Message, callback: SendCallback | None = None,
                   timeout: float | None = None) -> concurrent.futures.Future[SendResult]:
        """Start a send and return at once: a Future for the SendResult; callback(result, error)
        runs on the producer's loop thread when it completes."""
        core = self._started_core()
        out: concurrent.futures.Future[SendResult] = concurrent.futures.Future()

        def begin() -> None:
            try:
                fut = core.send_async(msg, callback, timeout)
            except BaseException as exc:
                out.set_exception(exc)
                return
            fut.add_done_callback(lambda f: out.set_exception(f.exception()) if f.exception() is not None
                                  else out.set_result(f.result()))
        self._thread.loop.call_soon_threadsafe(begin)  # type: ignore[union-attr]  # set by start()
        return out


class PushConsumer(_Facade):
    """Blocking push consumer; options are AsyncPushConsumer's. A plain-function listener runs on
    `consume_threads` threads; it may block."""

    _core_class = AsyncPushConsumer

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        """AsyncPushConsumer.subscribe; a SQL92 expression that does not compile raises here."""
        build_subscription(topic, expression)
        self._on_loop(self._create().subscribe, topic, expression)

    def set_listener(self, listener: Listener | BatchListener) -> Listener | BatchListener:
        self._create().set_listener(listener)
        return listener

    rebalance = _blocking("rebalance", AsyncPushConsumer)

    def suspend(self) -> None:
        """AsyncPushConsumer.suspend."""
        self._on_loop(self._started_core().suspend)

    def resume(self) -> None:
        self._on_loop(self._started_core().resume)

    @property
    def assigned_queues(self) -> list:
        """The queues this consumer currently pulls from."""
        return self._on_loop(lambda core: sorted(core.process_queues), self._started_core())


async def _snapshot(fn: Callable[[], Any]) -> Any:
    return fn()


class PullConsumer(_Facade):
    """Blocking pull consumer; the application owns offsets."""

    _core_class = AsyncPullConsumer
    fetch_queues = _blocking("fetch_queues", AsyncPullConsumer)
    pull = _blocking("pull", AsyncPullConsumer)
    pull_blocking = _blocking("pull_blocking", AsyncPullConsumer)
    min_offset = _blocking("min_offset", AsyncPullConsumer)
    max_offset = _blocking("max_offset", AsyncPullConsumer)
    search_offset = _blocking("search_offset", AsyncPullConsumer)
    earliest_msg_store_time = _blocking("earliest_msg_store_time", AsyncPullConsumer)
    fetch_consume_offset = _blocking("fetch_consume_offset", AsyncPullConsumer)
    update_consume_offset = _blocking("update_consume_offset", AsyncPullConsumer)


class LitePullConsumer(_Facade):
    """Blocking lite pull consumer: subscribe (or assign), start, then poll() in a loop. Options
    are AsyncLitePullConsumer's."""

    _core_class = AsyncLitePullConsumer
    poll = _blocking("poll", AsyncLitePullConsumer)
    seek = _blocking("seek", AsyncLitePullConsumer)
    seek_to_begin = _blocking("seek_to_begin", AsyncLitePullConsumer)
    seek_to_end = _blocking("seek_to_end", AsyncLitePullConsumer)
    commit = _blocking("commit", AsyncLitePullConsumer)
    committed = _blocking("committed", AsyncLitePullConsumer)
    fetch_queues = _blocking("fetch_queues", AsyncLitePullConsumer)
    offset_for_timestamp = _blocking("offset_for_timestamp", AsyncLitePullConsumer)

    def subscribe(self, topic: str, expression: str | MessageSelector = "*",
                  listener: Callable[[str, set[MessageQueue], set[MessageQueue]], None] | None = None) -> None:
        """AsyncLitePullConsumer.subscribe; the listener runs on a worker thread."""
        build_subscription(topic, expression)     # a SQL92 expression that does not compile raises here
        core = self._create()
        self._on_loop(core.subscribe, topic, expression, None if listener is None else self._in_worker(listener, topic))

    def unsubscribe(self, topic: str) -> None:
        self._on_loop(self._create().unsubscribe, topic)

    def assign(self, queues: list[MessageQueue], expression: str | MessageSelector | None = None) -> None:
        self._run(self._create().assign(list(queues), expression))

    def set_sub_expression_for_assign(self, topic: str, expression: str | MessageSelector) -> None:
        build_subscription(topic, expression)
        self._on_loop(self._create().set_sub_expression_for_assign, topic, expression)

    def pause(self, queues: list[MessageQueue]) -> None:
        self._on_loop(self._started_core().pause, list(queues))

    def resume(self, queues: list[MessageQueue]) -> None:
        self._on_loop(self._started_core().resume, list(queues))

    def assignment(self) -> set[MessageQueue]:
        return self._on_loop(self._started_core().assignment)

    def on_queues_changed(self, topic: str, callback: Callable[[str, set[MessageQueue]], None]) -> None:
        """AsyncLitePullConsumer.on_queues_changed; the callback runs on a worker thread, so it
        may call this consumer (say, assign the new queues)."""
        core = self._started_core()
        self._run(core.on_queues_changed(topic, self._in_worker(callback, topic)))

    def _in_worker(self, callback: Callable[..., None], topic: str) -> Callable[..., None]:
        """A callback of the core's, run on a worker thread instead of the loop (so it may block, or
        call this consumer); what it raises is logged."""
        loop = self._thread.loop  # type: ignore[union-attr]  # set by start()

        def guarded(*args: Any) -> None:
            try:
                callback(*args)
            except Exception:
                log.exception("the queue listener of %s raised", topic)

        def in_worker(*args: Any) -> None:
            loop.run_in_executor(None, guarded, *args)
        return in_worker


class Admin(_Facade):
    """Blocking admin client: `with Admin("127.0.0.1:9876") as admin: admin.topic_list()`."""

    _core_class = AsyncAdmin


for _name in ("cluster_info", "broker_runtime_info", "broker_config", "create_topic", "delete_topic", "topic_list",
              "topic_route", "topic_status", "create_subscription_group", "consumer_progress", "consumer_connections",
              "topic_consumers", "reset_offset_by_time", "consumer_running_info", "consume_message_directly",
              "query_by_key", "query_by_unique_key", "view_message", "query_by_id", "query_by_offset",
              "broker_health", "dlq_messages", "dlq_resend", "client_offsets", "producer_connections", "broker_stats",
              "traffic", "broker_consume_stats", "consume_time_span", "query_consume_queue", "clone_group_offset",
              "system_topics", "update_acl_account", "delete_acl_account", "update_global_white_addrs",
              "acl_versions", "acl_config", "given_up_halves", "resume_half", "message_trace", "elect_master",
              "wipe_write_perm", "add_write_perm", "update_broker_config", "delete_subscription_group",
              "put_kv_config", "delete_kv_config", "kv_config", "delete_expired_commitlog",
              "clean_expired_consume_queue", "registry_configs", "update_registry_config", "mqtt"):
    setattr(Admin, _name, _blocking(_name, AsyncAdmin))
del _name
