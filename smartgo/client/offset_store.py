"""Consumer offsets: the broker keeps a clustering group's (RemoteOffsetStore), a broadcasting
consumer keeps its own in a local file (LocalOffsetStore). Both hold the latest offsets in memory
and persist periodically (every 5 s) and at close.

read() returns -1 when nothing is stored (the group is new: consumeFromWhere decides) and raises
when the store cannot be asked (the caller retries at the next rebalance)."""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from smartgo.client import api
from smartgo.client.instance import ClientInstance
from smartgo.client.message import MessageQueue
from smartgo.net.codes import ResponseCode

log = logging.getLogger(__name__)


class OffsetStore(abc.ABC):
    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        if increase_only and self.table.get(mq, -1) >= offset:
            return
        self.table[mq] = offset

    def memory_offset(self, mq: MessageQueue) -> int:
        return self.table.get(mq, -1)

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)

    def offsets_of(self, topic: str) -> dict[MessageQueue, int]:
        """cloneOffsetTable: the offsets held in memory, of one topic or (topic "") of all."""
        return {mq: offset for mq, offset in self.table.items() if not topic or mq.topic == topic}

    @abc.abstractmethod
    async def read(self, mq: MessageQueue) -> int:
        """The stored offset (and remember it), or -1 when none is stored."""

    @abc.abstractmethod
    async def persist(self, mqs: Iterable[MessageQueue], acked: bool = False) -> None:
        """Store the in-memory offsets of mqs."""


class RemoteOffsetStore(OffsetStore):
    """RemoteBrokerOffsetStore: QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET at each queue's
    master (its slave while the master is away)."""

    def __init__(self, instance: ClientInstance, group: str) -> None:
        super().__init__()
        self.instance = instance
        self.group = group

    async def read(self, mq: MessageQueue) -> int:
        addr = await self.instance.admin_addr(mq.broker_name, mq.topic)
        resp = await self.instance.invoke(addr, api.query_consumer_offset_request(self.group, mq.topic, mq.queue_id))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        offset = api.ext_long(resp, "offset", addr, f"query offset of {mq}")
        self.table[mq] = offset
        return offset

    async def persist(self, mqs: Iterable[MessageQueue], acked: bool = False) -> None:
        """Oneway UPDATE_CONSUMER_OFFSET per queue (as Java's periodic persistence), failures
        logged; acked=True waits for each answer and raises the first failure (at close and for
        explicit updates, so nothing committed is lost silently)."""
        jobs = [self._update(mq, self.table[mq], acked) for mq in mqs if self.table.get(mq, -1) >= 0]
        if not jobs:
            return
        errors = [r for r in await asyncio.gather(*jobs, return_exceptions=True) if isinstance(r, BaseException)]
        if errors and acked:
            raise errors[0]

    async def _update(self, mq: MessageQueue, offset: int, acked: bool) -> None:
        cmd = api.update_consumer_offset_request(self.group, mq.topic, mq.queue_id, offset)
        try:
            addr = await self.instance.admin_addr(mq.broker_name, mq.topic)
            if acked:
                api.check(await self.instance.invoke(addr, cmd), addr, f"update offset of {mq}")
            else:
                await self.instance.invoke_oneway(addr, cmd)
        except Exception as exc:
            log.warning("%s: persisting offset %d of %s failed: %s", self.group, offset, mq, exc)
            raise


class LocalOffsetStore(OffsetStore):
    """Broadcasting offsets in <dir>/<instance>/<group>/offsets.json, written atomically (temp
    file, fsync, rename) with the previous copy kept as offsets.json.bak."""

    def __init__(self, directory: Path, instance_name: str, group: str) -> None:
        super().__init__()
        self.path = Path(directory).expanduser() / instance_name / group / "offsets.json"
        self._loaded = False

    def _load(self) -> None:
        self._loaded = True
        for path in (self.path, self.path.with_name("offsets.json.bak")):
            try:
                data = json.loads(path.read_text("utf-8"))
                for item in data["offsetTable"]:
                    self.table.setdefault(MessageQueue.from_json(item), int(item["offset"]))
                return
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError) as exc:
                log.error("local offsets %s do not parse (%s); trying the backup", path, exc)

    def remove(self, mq: MessageQueue) -> None:
        """Nothing: a broadcasting consumer's offsets are its own, kept when a rebalance lets a queue
        go and holds it again (Java's LocalFileOffsetStore.removeOffset does nothing either)."""

    async def read(self, mq: MessageQueue) -> int:
        if not self._loaded:
            self._load()
        return self.table.get(mq, -1)

    async def persist(self, mqs: Iterable[MessageQueue], acked: bool = False) -> None:
        if not self._loaded:
            self._load()
        entries = [{**mq.to_json(), "offset": off} for mq, off in sorted(self.table.items()) if off >= 0]
        data = json.dumps({"offsetTable": entries}, indent=1).encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name("offsets.json.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if self.path.exists():
            os.replace(self.path, self.path.with_name("offsets.json.bak"))
        os.replace(tmp, self.path)
