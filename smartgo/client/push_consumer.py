"""AsyncPushConsumer: subscribe, give it a listener, and it pulls, balances and commits for you.

Per queue it owns, it runs a long-polling pull loop (suspend 15 s) that feeds a ProcessQueue and
the listener runner. Clustering: the group's queues are split among its consumers (rebalanced
every 20 s and at once when a broker sends NOTIFY_CONSUMER_IDS_CHANGED), offsets live on the
broker, failed messages go back with CONSUMER_SEND_MSG_BACK (and come again through the group's
%RETRY% topic, which is subscribed automatically). Broadcasting: every consumer takes every
queue and keeps offsets in a local file. Orderly consumption locks each queue at the broker
(renewed every 20 s) and hands its messages to the listener one at a time, in offset order.

With consume_batch_max_size (Java's consumeMessageBatchMaxSize) the listener gets lists of up to
that many messages of one queue, in offset order, and may answer with how many of them, from the
first, it consumed (Java's ackIndex, plus one); the rest fail and come again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from smartgo.client import api
from smartgo.client.allocate import AllocateStrategy, allocate_averagely
from smartgo.client.config import ClientConfig
from smartgo.client.errors import ClientStateError, NoRouteError
from smartgo.client.listener import BatchListener, Listener, ListenerRunner, acked_batch, acked_one, describe
from smartgo.client.message import ConsumeFromWhere, MessageModel, MessageQueue, Prop, PullStatus
from smartgo.client.process_queue import ProcessQueue
from smartgo.client.running_info import (CONSUME_PASSIVELY, PROP_CONSUME_ORDERLY, PROP_CONSUME_TYPE,
                                         PROP_CONSUMER_START_TIMESTAMP, PROP_THREADPOOL_CORE_SIZE, CMResult,
                                         ConsumerStats, RunningInfo)
from smartgo.client.pull import pull_sys_flag
from smartgo.client.rebalance import (PULL_DELAY_ON_ERROR, PULL_DELAY_ON_FLOW_CONTROL, BalancedConsumer,
                                     ConsumerOptions, check_range)
from smartgo.client.subscription import MessageSelector, build_subscription
from smartgo.client.trace import traced_listener
from smartgo.net.codes import RequestCode, retry_topic
from smartgo.net.loop import wait_within
from smartgo.store.record import MessageExt

log = logging.getLogger(__name__)

#: A failed send-back: the message is consumed again locally after this long.
RECONSUME_LATER_DELAY = 5.0
#: Java's bound on consumeMessageBatchMaxSize.
MAX_CONSUME_BATCH = 1024
#: A message whose listener call ran past consume_timeout goes back with this delay level (Java's).
EXPIRED_DELAY_LEVEL = 3


def _ms_since(start: float) -> int:
    return int((time.perf_counter() - start) * 1000)


class AsyncPushConsumer(BalancedConsumer):
    def __init__(self, group: str, registry: str | list[str], *, listener: Listener | BatchListener | None = None,
                 model: MessageModel | str = MessageModel.CLUSTERING,
                 consume_from: ConsumeFromWhere | str = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 consume_timestamp_ms: int | None = None, orderly: bool = False,
                 allocate: AllocateStrategy | str = allocate_averagely, consume_threads: int = 20,
                 pull_batch_size: int = 32, pull_threshold_for_queue: int = 1000,
                 pull_threshold_size_mb: int = 100, max_span: int = 2000, max_reconsume_times: int = -1,
                 retry_delay_level: int = 0, suspend_current_queue_time: float = 1.0,
                 rebalance_interval: float = 20.0, lock_interval: float = 20.0,
                 post_subscription_when_pull: bool = False, await_termination: float = 5.0,
                 offset_store_dir: str | Path = "~/.smartgo_offsets", config: ClientConfig | None = None,
                 enable_msg_trace: bool = False, trace_topic: str | None = None,
                 consume_batch_max_size: int | None = None, consume_timeout: float = 900.0,
                 pull_threshold_for_topic: int = -1, pull_threshold_size_for_topic_mb: int = -1,
                 pull_interval: float = 0.0, **config_options: object) -> None:
        if consume_batch_max_size is not None and not 1 <= consume_batch_max_size <= MAX_CONSUME_BATCH:
            raise ValueError(f"consume_batch_max_size must be between 1 and {MAX_CONSUME_BATCH}")
        if consume_timeout <= 0:
            raise ValueError("consume_timeout must be positive (seconds)")
        check_range("consume_threads", consume_threads, 1, 1000)
        check_range("pull_interval", pull_interval, 0, 65.535)
        if pull_threshold_for_topic != -1:
            check_range("pull_threshold_for_topic", pull_threshold_for_topic, 1, 6553500)
        if pull_threshold_size_for_topic_mb != -1:
            check_range("pull_threshold_size_for_topic_mb", pull_threshold_size_for_topic_mb, 1, 102400)
        super().__init__(ConsumerOptions.of(locals()))
        self.orderly = orderly
        self.consume_threads = consume_threads
        self.max_reconsume_times = max_reconsume_times
        self.retry_delay_level = retry_delay_level
        self.suspend_current_queue_time = suspend_current_queue_time
        self.lock_interval = lock_interval
        self.post_subscription_when_pull = post_subscription_when_pull
        self.await_termination = await_termination
        self.listener = listener
        #: None: the listener gets one message; a number: lists of up to that many.
        self.consume_batch_max_size = consume_batch_max_size
        self._judge: Callable[[Any, Any], int] = acked_one if consume_batch_max_size is None else acked_batch
        #: Seconds (Java's consumeTimeout is in minutes: 15).
        self.consume_timeout = consume_timeout
        self._expired: set[int] = set()      # ids of items given up on whose listener call has not returned
        #: Java's pullThresholdForTopic / pullThresholdSizeForTopic (-1: off): at each rebalance
        #: the per-queue thresholds become these over the number of queues held.
        self.pull_threshold_for_topic = pull_threshold_for_topic
        self.pull_threshold_size_for_topic_mb = pull_threshold_size_for_topic_mb
        #: Seconds to wait after a pull that found messages (Java's pullInterval, in ms there).
        self.pull_interval = pull_interval
        self._resumed = asyncio.Event()                 # cleared by suspend()
        self._resumed.set()
        self._runner: ListenerRunner | None = None
        self._background: set[asyncio.Task] = set()
        self.stats = ConsumerStats()
        self._now_ms = 0

    # -- configuration ----------------------------------------------------------------------------

    @property
    def effective_max_reconsume_times(self) -> int:
        """-1 means 16 for concurrent consumption and unlimited for orderly (Java's defaults)."""
        if self.max_reconsume_times >= 0:
            return self.max_reconsume_times
        return 16 if not self.orderly else -1

    def set_listener(self, listener: Listener | BatchListener) -> Listener | BatchListener:
        """Set the listener (usable as a decorator): it gets a message, or a list of them when
        consume_batch_max_size is set."""
        if self._running:
            raise ClientStateError("set the listener before start()")
        self.listener = listener
        return listener

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        """Consume topic's messages whose tag the expression names ("TagA || TagB", or "*"), or
        that a MessageSelector.by_sql expression selects (SubscriptionError if it does not compile)."""
        self.subscriptions[topic] = build_subscription(topic, expression)
        if self._running:
            self._spawn(self.instance.heartbeat_all())
            self.rebalance_soon()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        if self._running:
            self.rebalance_soon()

    def suspend(self) -> None:
        """DefaultMQPushConsumer.suspend: no more pulls, and no more listener calls (those running
        finish; what was pulled waits in the cache) until resume(). Java's only stops the pulls,
        so its cache, and a pull held at the broker, still reach the listener."""
        self._resumed.clear()
        if self._runner is not None:
            self._runner.hold()
        log.info("%s: consumption suspended", self.group)

    def resume(self) -> None:
        self._resumed.set()
        if self._runner is not None:
            self._runner.release()
        log.info("%s: consumption resumed", self.group)
        if self._running:
            self.rebalance_soon()

    # -- member of the client instance ----------------------------------------------------------

    def heartbeat_entry(self) -> tuple[str, dict | None]:
        return "consumer", api.consumer_data(self.group, CONSUME_PASSIVELY, self.model.value,
                                             self.consume_from.value,
                                             [s.to_json() for s in self.subscriptions.values()])

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> AsyncPushConsumer:
        if self.listener is None:
            raise ClientStateError("set a listener before start()")
        if not self.subscriptions:
            raise ClientStateError("subscribe to at least one topic before start()")
        if self.clustering and retry_topic(self.group) not in self.subscriptions:
            self.subscriptions[retry_topic(self.group)] = build_subscription(retry_topic(self.group), "*")
        await self._attach()
        listener = self.listener
        if self.tracer is not None:
            listener = traced_listener(listener, self.group, self.tracer, self._judge)
        self._runner = ListenerRunner(listener, self.consume_threads, self._consumed, self._judge,
                                      f"smartgo-{self.group}")
        if not self._resumed.is_set():                  # suspended before start
            self._runner.hold()
        self._now_ms = self._started_ms
        self._runner.start()
        self._running = True
        await self._join()
        self.instance.every(1.0, self._fold_stats, "consume stats")
        if not self.orderly:
            self.instance.every(min(60.0, self.consume_timeout / 2), self._expire_overdue, "consume timeout")
        if self.orderly and self.clustering:
            self.instance.every(self.lock_interval, self.lock_all, "lock queues")
        self._rebalancer.start()
        return self

    async def close(self) -> None:
        """Stop pulling, let running listeners finish (await_termination), commit offsets, leave
        the group (UNREGISTER_CLIENT) and close the connections."""
        if not self._running:
            await self.instance.close()
            return
        await self._stop_pulling()
        await self._runner.stop(self.await_termination)  # type: ignore[union-attr]  # set by start()
        orderly_tasks = [pq.orderly_task for pq in self.process_queues.values() if pq.orderly_task is not None]
        for task in orderly_tasks:
            task.cancel()
        await asyncio.gather(*orderly_tasks, *self._background, return_exceptions=True)
        try:
            await self._commit_held()
            if self.orderly and self.clustering:
                await self._unlock(list(self.process_queues))
            await self.instance.unregister(None, self.group)
        finally:
            await self._release()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- rebalancing ------------------------------------------------------------------------------

    async def rebalance(self) -> bool:
        done = True
        async with self._rebalancing:
            for topic in list(self.subscriptions):
                try:
                    await self._rebalance_topic(topic)
                except NoRouteError as exc:  # e.g. the retry topic before the broker creates it
                    log.info("%s: not rebalancing %s: %s", self.group, topic, exc)
                except Exception as exc:
                    log.warning("%s: rebalancing %s failed: %s", self.group, topic, exc)
                    done = False
            gone = [mq for mq in self.process_queues if mq.topic not in self.subscriptions]
            for mq in gone:
                await self._drop(mq)
        return done

    def _share_topic_thresholds(self) -> None:
        """RebalancePushImpl.messageQueueChanged: the topic-wide limits split over the queues held
        (all of them, whatever their topic, as Java counts), as each queue is taken or let go."""
        held = len(self.process_queues)
        if not held:
            return
        if self.pull_threshold_for_topic != -1:
            self.pull_threshold_for_queue = max(1, self.pull_threshold_for_topic // held)
        if self.pull_threshold_size_for_topic_mb != -1:
            self.pull_threshold_size = max(1, self.pull_threshold_size_for_topic_mb // held) * 1024 * 1024

    async def _rebalance_topic(self, topic: str) -> None:
        mine = await self.balance.mine(topic, await self._queues_of(topic))
        changed = False
        for mq in [mq for mq in self.process_queues if mq.topic == topic and mq not in mine]:
            await self._drop(mq)
            changed = True
        for mq in sorted(mine):
            if mq not in self.process_queues and self._running:
                changed |= await self._add(mq)
        if changed:
            log.info("%s: now consuming %s: %s", self.group, topic,
                     sorted(mq.queue_id for mq in self.process_queues if mq.topic == topic))

    async def _add(self, mq: MessageQueue) -> bool:
        locked = False
        if self.orderly and self.clustering:
            locked = mq in await self._lock([mq])
            if not locked:
                log.info("%s: %s is locked by another consumer; trying at the next rebalance", self.group, mq)
                return False
        self.offsets.remove(mq)
        try:
            offset = await self.balance.pull_from(mq)
        except Exception as exc:
            # Its broker is away (restarting?). Java leaves the queue to the next rebalance, up to
            # 20 s on; held, its pull loop asks again as it retries a failed pull (_pull_once).
            log.warning("%s: cannot tell where to start %s yet: %s", self.group, mq, exc)
            offset = -1
        pq = ProcessQueue(offset)
        if locked:
            pq.locked, pq.last_lock_time = True, time.monotonic()
        self.process_queues[mq] = pq
        self._share_topic_thresholds()
        pq.pull_task = asyncio.get_running_loop().create_task(self._pull_loop(mq, pq))
        return True

    async def _drop(self, mq: MessageQueue) -> None:
        pq = self._detach(mq)
        if pq is None:
            return
        self._share_topic_thresholds()
        try:
            if self.orderly and self.clustering:
                try:  # let the message being consumed finish before another consumer takes over
                    await wait_within(pq.consume_lock.acquire(), 1.0)
                    pq.consume_lock.release()
                except asyncio.TimeoutError:
                    pass
            await self.offsets.persist([mq], acked=True)
            if self.orderly and self.clustering:
                await self._unlock([mq])
        except Exception as exc:
            log.warning("%s: committing %s on release failed: %s", self.group, mq, exc)
        finally:
            self.offsets.remove(mq)

    async def reset_offset(self, topic: str, table: dict[MessageQueue, int]) -> None:
        """MQClientInstance.resetOffset: the topic's queues are dropped without committing (what
        is consumed of them meanwhile is not committed either), the table's offsets are committed,
        and the next rebalance takes the queues again from there. Every consumer of the group gets
        the whole table and commits all of it: the same values, whoever owns a queue."""
        async with self._rebalancing:
            for mq in [mq for mq in self.process_queues if mq.topic == topic]:
                pq = self._detach(mq)
                if pq is not None and pq.orderly_task is not None:
                    pq.orderly_task.cancel()
            for mq, offset in table.items():
                self.offsets.update(mq, offset)
            try:
                await self.offsets.persist(list(table), acked=True)
            finally:
                for mq in table:
                    self.offsets.remove(mq)
        self.rebalance_soon()

    # -- pulling ----------------------------------------------------------------------------------

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        sub = self.subscriptions.get(mq.topic)
        is_retry = mq.topic == retry_topic(self.group)
        while not pq.dropped and sub is not None:
            if not self._resumed.is_set():
                await self._resumed.wait()
                continue
            if self._queue_full(pq, span_counts=not self.orderly):
                await asyncio.sleep(PULL_DELAY_ON_FLOW_CONTROL)  # flow control: let consumption catch up
                continue
            if self.orderly and self.clustering and not pq.locked:
                await asyncio.sleep(PULL_DELAY_ON_ERROR)
                continue
            commit = self.offsets.memory_offset(mq) if self.clustering else -1
            flag = pull_sys_flag(commit > 0, True, self.post_subscription_when_pull)
            started = time.perf_counter()
            result = await self._pull_once(mq, pq, sub, flag, max(commit, 0))
            if result is None:
                continue
            status = result.status
            if status is PullStatus.FOUND:
                pq.next_offset = result.next_begin_offset
                msgs = result.messages
                self.stats.pulled(mq.topic, len(msgs), (time.perf_counter() - started) * 1000)
                if msgs:
                    if is_retry:
                        for msg in msgs:
                            real = msg.properties.get(Prop.RETRY_TOPIC)
                            if real:
                                msg.topic = real
                    pq.put(msgs)
                    self._dispatch(mq, pq, msgs)
                if self.pull_interval:
                    await asyncio.sleep(self.pull_interval)
            elif status is PullStatus.OFFSET_ILLEGAL:
                log.warning("%s: offset %d of %s is illegal; moving to %d", self.group, pq.next_offset, mq,
                            result.next_begin_offset)
                pq.next_offset = result.next_begin_offset
                self.offsets.update(mq, result.next_begin_offset)
                await self.offsets.persist([mq])
            else:
                pq.next_offset = result.next_begin_offset
                if not pq.count:  # correctTagsOffset: nothing in flight, so skipped offsets are done
                    self.offsets.update(mq, result.next_begin_offset, increase_only=True)

    def _dispatch(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if self.orderly:
            if pq.orderly_task is None or pq.orderly_task.done():
                pq.orderly_task = asyncio.get_running_loop().create_task(self._consume_orderly(mq, pq))
            return
        self._submit(mq, pq, msgs)

    def _submit(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Hand messages to the listener runner: one by one, or in batches of one queue."""
        submit = self._runner.submit  # type: ignore[union-attr]  # set by start()
        size = self.consume_batch_max_size
        if size is None:
            for msg in msgs:
                submit((mq, pq, (msg,)), msg)
            return
        for start in range(0, len(msgs), size):
            batch = msgs[start:start + size]
            submit((mq, pq, batch), batch)

    def _count(self, msgs: Sequence[MessageExt], acked: int) -> None:
        consumed = self.stats.consumed
        for i, msg in enumerate(msgs):
            consumed(msg.topic, i < acked)

    # -- concurrent consumption -------------------------------------------------------------------

    def _consumed(self, item: tuple[MessageQueue, ProcessQueue, Sequence[MessageExt]], acked: int) -> None:
        """The runner's verdict on a message or batch: the first `acked` messages were consumed."""
        mq, pq, msgs = item
        pq.last_consume_ms = self._now_ms
        self._count(msgs, acked)
        if self._expired and id(item) in self._expired:
            self._expired.discard(id(item))
            return  # given up on at consume_timeout: already sent back
        if pq.dropped:
            return  # the queue moved to another consumer, which consumes it again
        if acked == len(msgs) or not self.clustering:
            if acked < len(msgs):
                log.warning("%s: broadcasting: %s failed; dropped (no retries in broadcasting)",
                            self.group, describe(msgs[acked:]))
            self._commit(mq, pq, msgs)
            return
        if acked:
            self._commit(mq, pq, msgs[:acked])
        self._spawn(self._send_back_or_retry(mq, pq, list(msgs[acked:])))

    def _commit(self, mq: MessageQueue, pq: ProcessQueue, msgs: Sequence[MessageExt]) -> None:
        offset = pq.remove(msgs)
        if offset >= 0:
            self.offsets.update(mq, offset, increase_only=True)

    async def _send_back_or_retry(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt],
                                  delay_level: int | None = None) -> None:
        """Failed messages go back to the broker for the retry topic; those it did not take are
        consumed again here a little later."""
        level = self.retry_delay_level if delay_level is None else delay_level
        sent = await asyncio.gather(*(self.send_back(mq, msg, level) for msg in msgs))
        done = [msg for msg, ok in zip(msgs, sent) if ok]
        if done:
            self._commit(mq, pq, done)
        again = [msg for msg, ok in zip(msgs, sent) if not ok]
        if not again:
            return
        for msg in again:
            msg.reconsume_times += 1
        await asyncio.sleep(RECONSUME_LATER_DELAY)
        if not pq.dropped and self._running:
            self._submit(mq, pq, again)

    async def _expire_overdue(self) -> None:
        """Java's cleanExpiredMsg: messages whose listener call has run past consume_timeout are
        sent back (delay level 3) and no longer hold back the queue's commit and flow control.
        The call itself cannot be stopped; its verdict, when it comes, is ignored."""
        for item in self._runner.overdue(self.consume_timeout):  # type: ignore[union-attr]  # set by start()
            if isinstance(item, asyncio.Future) or id(item) in self._expired:
                continue
            mq, pq, msgs = item
            if pq.dropped:
                continue
            self._expired.add(id(item))
            log.warning("%s: the listener has run longer than consume_timeout (%g s) on %s; %s", self.group,
                        self.consume_timeout, describe(msgs), "sending it back" if self.clustering else "dropping it")
            if self.clustering:
                self._spawn(self._send_back_or_retry(mq, pq, list(msgs), EXPIRED_DELAY_LEVEL))
            else:
                self._commit(mq, pq, msgs)

    async def send_back(self, mq: MessageQueue, msg: MessageExt, delay_level: int = 0) -> bool:
        """CONSUMER_SEND_MSG_BACK to the message's broker: the broker stores it again for the
        group's retry topic (or its DLQ after too many attempts, or at once for a negative delay
        level). False if that failed."""
        try:
            addr = await self.instance.master_addr(mq.broker_name, mq.topic)
            origin = msg.properties.get(Prop.UNIQ_KEY) or msg.msg_id
            limit = self.effective_max_reconsume_times
            cmd = api.send_back_request(msg.commit_log_offset, self.group, delay_level, origin, msg.topic,
                                        limit if limit >= 0 else 16)
            api.check(await self.instance.invoke(addr, cmd, 5.0), addr, "send message back")
            return True
        except Exception as exc:
            log.warning("%s: sending %s back failed (%s); consuming it again locally in %g s", self.group,
                        msg.msg_id, exc, RECONSUME_LATER_DELAY)
            return False

    # -- orderly consumption ----------------------------------------------------------------------

    async def _consume_orderly(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        """One message, or one batch, at a time, in offset order. Failed messages are consumed
        again after suspend_current_queue_time, except those past the reconsume limit, which go
        to the DLQ (clustering)."""
        runner = self._runner
        batch = self.consume_batch_max_size
        async with pq.consume_lock:
            while not pq.dropped and self._running:
                if self.clustering and (not pq.locked or pq.lock_expired()):
                    if mq not in await self._lock([mq]):
                        await asyncio.sleep(self.suspend_current_queue_time)
                        continue
                msgs = pq.take(batch or 1)
                if not msgs:
                    return
                acked = await runner.run(msgs if batch else msgs[0])  # type: ignore[union-attr]  # set by start()
                pq.last_consume_ms = self._now_ms
                self._count(msgs, acked)
                if pq.dropped:
                    return
                failed = await self._dead_letter(mq, msgs[acked:])
                if failed:
                    for msg in failed:
                        msg.reconsume_times += 1
                    pq.make_again(failed)
                offset = pq.commit()  # what was consumed or dead-lettered, up to the first failed
                if offset >= 0:
                    self.offsets.update(mq, offset)
                if failed:
                    await asyncio.sleep(self.suspend_current_queue_time)

    async def _dead_letter(self, mq: MessageQueue, failed: list[MessageExt]) -> list[MessageExt]:
        """Failed orderly messages past the reconsume limit go to the DLQ (delay level -1); the
        ones still to be consumed again."""
        limit = self.effective_max_reconsume_times
        if limit < 0 or not self.clustering:
            return failed
        due = [msg for msg in failed if msg.reconsume_times >= limit]
        sent = await asyncio.gather(*(self.send_back(mq, msg, -1) for msg in due))
        gone = {id(msg) for msg, ok in zip(due, sent) if ok}
        return [msg for msg in failed if id(msg) not in gone]

    async def _lock(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ at each broker; marks the process queues that got their lock."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        locked: set[MessageQueue] = set()
        now = time.monotonic()
        for broker, group_mqs in by_broker.items():
            try:
                addr = await self.instance.master_addr(broker, group_mqs[0].topic)
                cmd = api.command(RequestCode.LOCK_BATCH_MQ, None, api.lock_body(self.client_id, self.group, group_mqs))
                ok = api.decode_locked(await self.instance.invoke(addr, cmd), addr)
            except Exception as exc:
                log.warning("%s: locking queues at %s failed: %s", self.group, broker, exc)
                ok = set()
            for mq in group_mqs:
                pq = self.process_queues.get(mq)
                if pq is not None:
                    pq.locked = mq in ok
                    if pq.locked:
                        pq.last_lock_time = now
            locked |= ok
        return locked

    async def lock_all(self) -> None:
        if self.process_queues:
            await self._lock(list(self.process_queues))

    async def _unlock(self, mqs: list[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, group_mqs in by_broker.items():
            try:
                addr = await self.instance.master_addr(broker, group_mqs[0].topic)
                body = api.lock_body(self.client_id, self.group, group_mqs)
                cmd = api.command(RequestCode.UNLOCK_BATCH_MQ, None, body)
                api.check(await self.instance.invoke(addr, cmd, 1.0), addr, "unlock queues")
            except Exception as exc:
                log.info("%s: unlocking queues at %s failed (the lease expires anyway): %s", self.group, broker, exc)

    # -- what operators ask of a consumer ------------------------------------------------------------

    def running_info(self) -> RunningInfo:
        """DefaultMQPushConsumerImpl.consumerRunningInfo: settings under Java's names, the
        subscriptions, every queue held (its commit offset and cache), and each topic's rates."""
        props = {"consumerGroup": self.group, "messageModel": self.model.value,
                 "consumeFromWhere": self.consume_from.value,
                 "consumeTimestamp": time.strftime("%Y%m%d%H%M%S", time.localtime(self.consume_timestamp_ms / 1000)),
                 "allocateMessageQueueStrategy": getattr(self.allocate, "__name__", type(self.allocate).__name__),
                 "consumeThreadMin": self.consume_threads, "consumeThreadMax": self.consume_threads,
                 "pullBatchSize": self.pull_batch_size, "pullThresholdForQueue": self.pull_threshold_for_queue,
                 "consumeMessageBatchMaxSize": self.consume_batch_max_size or 1,
                 "consumeTimeout": round(self.consume_timeout / 60),
                 "pullThresholdForTopic": self.pull_threshold_for_topic,
                 "pullThresholdSizeForTopic": self.pull_threshold_size_for_topic_mb,
                 "pullInterval": int(self.pull_interval * 1000),
                 "pullThresholdSizeForQueue": self.pull_threshold_size // (1024 * 1024),
                 "consumeConcurrentlyMaxSpan": self.max_span, "maxReconsumeTimes": self.max_reconsume_times,
                 "suspendCurrentQueueTimeMillis": int(self.suspend_current_queue_time * 1000),
                 "postSubscriptionWhenPull": str(self.post_subscription_when_pull).lower(),
                 PROP_CONSUME_TYPE: CONSUME_PASSIVELY, PROP_CONSUME_ORDERLY: str(self.orderly).lower(),
                 PROP_THREADPOOL_CORE_SIZE: self.consume_threads, PROP_CONSUMER_START_TIMESTAMP: self._started_ms}
        self._fold_counts()
        queues = {mq: pq.info(self.offsets.memory_offset(mq)) for mq, pq in list(self.process_queues.items())}
        return RunningInfo(props, [s.to_json() for s in self.subscriptions.values()], queues,
                           {topic: self.stats.status(topic) for topic in self.subscriptions})

    async def _fold_stats(self) -> None:
        self._fold_counts()

    def _fold_counts(self) -> None:
        """The consumption counted since the last fold into the rate windows (every second, and
        before a report). Also the clock queues stamp their last consumption with: a second's
        resolution is what an operator reads, and a clock read per message is not free."""
        self._now_ms = int(time.time() * 1000)
        if self._runner is not None:
            self.stats.fold(self._runner.take_listener_ms())

    async def consume_message_directly(self, msg: MessageExt) -> tuple[CMResult, str | None, int]:
        """ConsumeMessageDirectly: the listener runs on msg outside the queues' flow (nothing is
        committed, sent back or counted). (result, remark, spent ms)."""
        if msg.topic == retry_topic(self.group):
            msg.topic = msg.properties.get(Prop.RETRY_TOPIC) or msg.topic
        listener: Callable[[Any], Any] = self.listener  # type: ignore[assignment]  # None raises, reported below
        start = time.perf_counter()
        work = msg if self.consume_batch_max_size is None else [msg]
        try:
            if self._runner is not None and self._runner.is_async:
                value = await listener(work)
            else:
                value = await asyncio.get_running_loop().run_in_executor(None, listener, work)
        except Exception as exc:
            log.warning("%s: consuming %s directly raised %r", self.group, msg.msg_id, exc)
            return CMResult.CR_THROW_EXCEPTION, "".join(traceback.format_exception(exc)), _ms_since(start)
        ok = self._judge(value, work) == 1
        return CMResult.CR_SUCCESS if ok else CMResult.CR_LATER, None, _ms_since(start)
