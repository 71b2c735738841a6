"""Running a consumer's listener with bounded concurrency, off the event loop.

A plain function listener runs on `threads` worker threads (the consume pool): the loop hands
them messages through a queue and their verdicts come back in batches - one loop wake-up for
whatever finished meanwhile, not one per message. A coroutine listener runs on `threads` worker
tasks on the loop itself.

A listener returns ConsumeResult.SUCCESS or RECONSUME_LATER; None counts as SUCCESS and True/False
as SUCCESS/RECONSUME_LATER; an exception counts as RECONSUME_LATER (and is logged). A batch
listener (consume_batch_max_size) gets a list of messages and may also return a count: the first
that many are consumed and the rest fail (Java's ackIndex, plus one). Either way the verdict the
consumer gets is a count: how many messages, from the first, were consumed.

Each worker adds up the time its listener calls take in a counter only it writes;
`take_listener_ms()` on the loop returns what was added since its last call (the consumer's
consumeRT). That is all the statistics cost a worker: counting by topic and verdict happens on the
loop, where the verdicts arrive anyway.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from smartgo.client.message import ConsumeResult
from smartgo.store.record import MessageExt

log = logging.getLogger(__name__)

Listener = Callable[[MessageExt], Any]
BatchListener = Callable[[list[MessageExt]], Any]
Done = Callable[[Any, int], None]
_STOP = object()


def verdict(value: object) -> ConsumeResult:
    if value is None or value is True:
        return ConsumeResult.SUCCESS
    if value is False:
        return ConsumeResult.RECONSUME_LATER
    if isinstance(value, ConsumeResult):
        return value
    log.warning("listener returned %r; treating it as RECONSUME_LATER", value)
    return ConsumeResult.RECONSUME_LATER


def acked_one(value: object, msg: MessageExt) -> int:
    """1 if a listener consumed its message, else 0: the runner's verdicts are counts."""
    return 1 if verdict(value) is ConsumeResult.SUCCESS else 0


def acked_batch(value: object, msgs: Sequence[MessageExt]) -> int:
    """How many of a batch's messages, from its start, the batch listener consumed."""
    if isinstance(value, int) and not isinstance(value, bool):
        return min(max(value, 0), len(msgs))
    return len(msgs) if verdict(value) is ConsumeResult.SUCCESS else 0


def describe(work: MessageExt | Sequence[MessageExt]) -> str:
    """A message, or a batch by its first message, for a log line."""
    first, count = (work, 1) if isinstance(work, MessageExt) else (work[0], len(work))
    msg_id = first.properties.get("UNIQ_KEY") or first.msg_id
    if count > 1:
        return f"{count} messages of {first.topic} from {msg_id} on"
    return f"message {msg_id} of {first.topic}"


def is_coroutine_listener(listener: Listener | BatchListener) -> bool:
    # an object whose __call__ is a coroutine function counts too (callable() cannot tell)
    return (inspect.iscoroutinefunction(listener)
            or inspect.iscoroutinefunction(getattr(listener, "__call__", None)))  # noqa: B004


class ListenerRunner:
    """submit(item, work) runs the listener on work (a message, or a list of them for a batch
    listener); done(item, judge(answer, work)) is then called on the loop (judge: acked_one or
    acked_batch)."""

    def __init__(self, listener: Listener | BatchListener, threads: int, done: Done,
                 judge: Callable[[Any, Any], int], name: str = "smartgo-consume") -> None:
        if threads < 1:
            raise ValueError("consume threads must be >= 1")
        self.listener: Callable[[Any], Any] = listener  # given a message or a list, as it was registered
        self.judge = judge
        self.is_async = is_coroutine_listener(listener)
        self.size = threads
        self._done = done
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._tasks: list[asyncio.Task] = []
        self._inbox: queue.SimpleQueue | asyncio.Queue | None = None
        self._finished: collections.deque = collections.deque()
        self._wake_pending = False
        self.discarding = False
        # Cleared while the consumer is suspended: workers wait before their next call.
        self._go = threading.Event()
        self._go.set()
        self._go_async = asyncio.Event()
        self._go_async.set()
        # Per worker, written only by it: the item it is consuming (None when idle) and since when.
        self._current: list[Any] = [None] * threads
        self._since = [0.0] * threads
        self._listener_s = [0.0] * threads      # per worker, cumulative; only that worker writes it
        self._taken_s = 0.0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.is_async:
            self._inbox = asyncio.Queue()
            self._tasks = [self._loop.create_task(self._task_worker(i)) for i in range(self.size)]
        else:
            self._inbox = queue.SimpleQueue()
            for i in range(self.size):
                t = threading.Thread(target=self._thread_worker, args=(i,), name=f"{self._name}-{i + 1}", daemon=True)
                t.start()
                self._threads.append(t)

    def submit(self, item: Any, work: MessageExt | list[MessageExt]) -> None:
        self._inbox.put_nowait((item, work))  # type: ignore[union-attr]  # set by start()

    async def run(self, work: MessageExt | list[MessageExt]) -> int:
        """Consume and wait for the verdict (orderly consumption)."""
        fut = self._loop.create_future()  # type: ignore[union-attr]  # set by start()
        self.submit(fut, work)
        return await fut

    # -- workers ----------------------------------------------------------------------------------

    def _failed(self, work: MessageExt | list[MessageExt]) -> int:
        log.exception("listener failed on %s; it will be consumed again later", describe(work))
        return self.judge(ConsumeResult.RECONSUME_LATER, work)

    def _call(self, work: MessageExt | list[MessageExt]) -> int:
        try:
            return self.judge(self.listener(work), work)
        except Exception:
            return self._failed(work)

    @property
    def active(self) -> int:
        """Listener calls running now."""
        return sum(item is not None for item in self._current)

    def hold(self) -> None:
        """Start no listener call until release(); calls running go on."""
        self._go.clear()
        self._go_async.clear()

    def release(self) -> None:
        self._go.set()
        self._go_async.set()

    def overdue(self, timeout: float) -> list[Any]:
        """The items whose listener call has run longer than timeout seconds (consumeTimeout)."""
        now = time.perf_counter()
        return [item for item, since in zip(list(self._current), list(self._since))
                if item is not None and now - since > timeout]

    def _thread_worker(self, index: int) -> None:
        inbox = cast("queue.SimpleQueue[Any]", self._inbox)  # worker threads run on a SimpleQueue
        finished = self._finished
        current, since = self._current, self._since
        spent = self._listener_s
        go = self._go
        while True:
            work = inbox.get()
            if work is _STOP:
                return
            if not go.is_set():
                go.wait()
            if self.discarding:
                continue
            since[index] = start = time.perf_counter()
            current[index] = work[0]
            result = self._call(work[1])
            spent[index] += time.perf_counter() - start
            current[index] = None
            finished.append((work[0], result))
            if not self._wake_pending:
                self._wake_pending = True
                try:
                    self._loop.call_soon_threadsafe(self._deliver)  # type: ignore[union-attr]  # set by start()
                except RuntimeError:  # the loop is closed: the consumer is gone
                    return

    def take_listener_ms(self) -> float:
        """Milliseconds the listener ran, over all workers, since the last call."""
        total = sum(self._listener_s)
        ms, self._taken_s = (total - self._taken_s) * 1000, total
        return ms

    def _deliver(self) -> None:
        self._wake_pending = False
        finished = self._finished
        while finished:
            item, result = finished.popleft()
            self._complete(item, result)

    def _complete(self, item: Any, result: int) -> None:
        if isinstance(item, asyncio.Future):
            if not item.done():
                item.set_result(result)
            return
        try:
            self._done(item, result)
        except Exception:
            log.exception("handling a consume result failed")

    async def _task_worker(self, index: int) -> None:
        inbox = cast("asyncio.Queue[Any]", self._inbox)  # worker tasks run on an asyncio.Queue
        while True:
            item, work = await inbox.get()
            if not self._go_async.is_set():
                await self._go_async.wait()
            if self.discarding:
                continue
            self._since[index] = start = time.perf_counter()
            self._current[index] = item
            try:
                result = self.judge(await self.listener(work), work)
            except asyncio.CancelledError:
                raise
            except Exception:
                result = self._failed(work)
            finally:
                self._current[index] = None
                self._listener_s[index] += time.perf_counter() - start
            self._complete(item, result)

    async def stop(self, timeout: float) -> None:
        """Drop what has not started, wait up to timeout for running listeners, stop the workers."""
        self.discarding = True
        self.release()                                  # held workers wake and drop what they took
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.active and loop.time() < deadline:
            await asyncio.sleep(0.01)
        self._deliver()
        for task in self._tasks:
            task.cancel()
        for _ in self._threads:
            self._inbox.put_nowait(_STOP)  # type: ignore[union-attr]  # set by start()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        threads = [t for t in self._threads if t.is_alive()]
        if threads:

            def join_all() -> None:
                for t in threads:
                    t.join(max(0.0, deadline - loop.time()) + 0.5)

            await loop.run_in_executor(None, join_all)
