"""Consumer offsets (RocketMQ's ConsumerOffsetManager): (topic, group) -> queue id -> offset.

Owned by the broker actor. Commits arrive batched from the net actors (UPDATE_CONSUMER_OFFSET
and offsets carried by pulls, coalesced per loop iteration) and are applied in memory; the
table is persisted every offset_persist_interval (5 s) when it changed, and at stop, to
<store>/config/consumerOffset.json as ConsumerOffsetSerializeWrapper:
{"offsetTable":{"topic@group":{"0":12,"1":7}}}. Keys are written quoted (valid JSON, which
fastjson reads as well); fastjson's unquoted integer keys are accepted on input.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from smartgo.common.persist import PersistedFile
from smartgo.net import fastjson

FILE = Path("config") / "consumerOffset.json"
Key = tuple[str, str]          # (topic, group)


class ConsumerOffsets:
    def __init__(self, path: Path) -> None:
        self.file = PersistedFile(path)
        self.table: dict[Key, dict[int, int]] = {}
        self.dirty = False

    @classmethod
    def load(cls, store_path: Path) -> ConsumerOffsets:
        offsets = cls(store_path / FILE)
        offsets.table = offsets.file.load(decode, "consumer offsets") or {}
        return offsets

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        queues = self.table.get((topic, group))
        if queues is None:
            queues = self.table[(topic, group)] = {}
        queues[queue_id] = offset
        self.dirty = True

    def commit_many(self, items: Iterable[tuple[str, str, int, int]]) -> None:
        for group, topic, queue_id, offset in items:
            self.commit(group, topic, queue_id, offset)

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, -1 when there is none."""
        queues = self.table.get((topic, group))
        return -1 if queues is None else queues.get(queue_id, -1)

    def topics_of(self, group: str) -> list[str]:
        return sorted(t for t, g in self.table if g == group)

    def groups_of(self, topic: str) -> set[str]:
        """ConsumerOffsetManager.whichGroupByTopic."""
        return {g for t, g in self.table if t == topic}

    def clone(self, src: str, dest: str, topic: str) -> bool:
        """dest's offsets in topic become a copy of src's (ConsumerOffsetManager.cloneOffset);
        False when src has none there."""
        queues = self.table.get((topic, src))
        if queues is None:
            return False
        self.table[(topic, dest)] = dict(queues)
        self.dirty = True
        return True

    def remove(self, topic: str | None = None, group: str | None = None) -> int:
        """Forget the offsets of a topic (all groups) or of a group (all topics)."""
        gone = [k for k in self.table if k[0] == topic or k[1] == group]
        for k in gone:
            del self.table[k]
        self.dirty |= bool(gone)
        return len(gone)

    def encode(self) -> bytes:
        return fastjson.dumps({"offsetTable": {f"{t}@{g}": {str(q): o for q, o in sorted(queues.items())}
                                               for (t, g), queues in sorted(self.table.items())}})

    def persist(self) -> bool:
        """Write the table if it changed since the last write; True when written."""
        if not self.dirty:
            return False
        self.dirty = False
        try:
            self.file.save(self.encode())
        except BaseException:
            self.dirty = True
            raise
        return True


def decode(raw: bytes) -> dict[Key, dict[int, int]]:
    """ConsumerOffsetSerializeWrapper JSON (quoted or fastjson's bare integer queue keys)."""
    table = fastjson.loads(raw)["offsetTable"]
    if not isinstance(table, dict):
        raise TypeError("offsetTable is not an object")
    out: dict[Key, dict[int, int]] = {}
    for key, queues in table.items():
        topic, at, group = key.partition("@")
        if not at or not topic or not group:
            raise ValueError(f"offset key {key!r} is not topic@group")
        out[(topic, group)] = {int(q): int(o) for q, o in queues.items()}
    return out
