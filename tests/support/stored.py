"""What a SmartGo topic holds, seen through the SmartGo SDK: a push consumer whose messages a test
waits on with deadlines, and a full read of a topic (every message stored so far), for the RocketMQ
side of the MQTT bridge (tests/mqtt)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from smartgo.client import AsyncAdmin, AsyncLitePullConsumer, ConsumeResult, MessageExt, MessageSelector, PushConsumer
from smartgo.mqtt.actor import read_to_end

WAIT = 30.0


class Consumed:
    """A SmartGo SDK push consumer of topic (a fresh group, from the first offset): the messages it
    took, to wait on. One consume thread: the messages of a queue are taken in their order, so a marker
    comes after every message stored before it in its queue."""

    def __init__(self, registry: str, topic: str, expression: str | MessageSelector = "*",
                 group: str | None = None) -> None:
        self._cond = threading.Condition()
        self.items: list[MessageExt] = []
        self.group = group or f"CG_{uuid.uuid4().hex[:12]}"
        self.consumer = PushConsumer(self.group, registry, consume_from="CONSUME_FROM_FIRST_OFFSET",
                                     consume_threads=1)
        self.consumer.subscribe(topic, expression)
        self.consumer.set_listener(self._take)
        self.consumer.start()

    def _take(self, msg: MessageExt) -> ConsumeResult:
        with self._cond:
            self.items.append(msg)
            self._cond.notify_all()
        return ConsumeResult.SUCCESS

    def wait_for(self, done: Callable[[list[MessageExt]], bool], timeout: float = WAIT,
                 what: str = "messages") -> list[MessageExt]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not done(self.items):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the SDK consumer {self.group}: no {what} in {timeout}s; got "
                                         f"{[(m.tags, m.body[:40]) for m in self.items]}")
                self._cond.wait(left)
            return list(self.items)

    def until_body(self, body: bytes, timeout: float = WAIT) -> list[MessageExt]:
        """Everything taken so far, once a message with this body came."""
        return self.wait_for(lambda ms: any(m.body == body for m in ms), timeout, f"message {body!r}")

    def close(self) -> None:
        self.consumer.close()


def read_topic(registry: str, topic: str, folder: Path, timeout: float = WAIT) -> list[MessageExt]:
    """Every message the topic holds now, on every queue, through the SDK's lite pull consumer."""
    async def read() -> list[MessageExt]:
        got: list[MessageExt] = []
        reader = AsyncLitePullConsumer(f"CG_READ_{uuid.uuid4().hex[:12]}", registry, auto_commit=False,
                                       pull_batch_size=64, offset_store_dir=folder)
        async with AsyncAdmin(registry) as admin:
            queues = (await admin.topic_route(topic)).subscribe_queues(topic)
        await reader.assign(queues)
        await reader.start()
        try:
            for mq in queues:
                await reader.seek_to_begin(mq)
            await read_to_end(reader, queues, got.append, "test", limit=timeout)
        finally:
            await reader.close()
        return got
    return asyncio.run(read())
