"""<store>/config/delayOffset.json: the schedule service's progress per delay level.

    {"offsetTable":{"1":12,"2":0},"scanFrom":1048576}

offsetTable is RocketMQ's DelayOffsetSerializeWrapper (level -> next ConsumeQueue offset of
SCHEDULE_TOPIC_XXXX queue level - 1 to deliver; every entry before it was re-published and
acknowledged by the commit actor). scanFrom is ours (fastjson readers ignore it): a CommitLog
offset such that every copy re-published for an entry at or after those offsets lies at or after
it, so a restarted schedule actor finds the copies it made but had not counted yet by walking
the CommitLog from there (smartgo.broker.actors.schedule_actor). A RocketMQ file (bare integer keys,
no scanFrom) loads too.

Writes are atomic (smartgo.common.persist: temp file, fsync, the previous content kept as .bak,
rename, directory fsync). A reader, or a restart after a crash at any point, finds the new state
or the previous one (the .bak, when the file is corrupt); an older state is always a valid one:
its offsets and scanFrom were both true when it was written.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from smartgo.common.persist import PersistedFile
from smartgo.net import fastjson
from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand

DELAY_OFFSET_FILE = Path("config") / "delayOffset.json"


@dataclass(frozen=True, slots=True)
class DelayState:
    offsets: dict[int, int]             # delay level (1-based) -> next ConsumeQueue offset to deliver
    scan_from: int | None               # see the module doc; None in a RocketMQ file

    def offset_table(self) -> dict[str, dict[str, int]]:
        return {"offsetTable": {str(level): offset for level, offset in sorted(self.offsets.items())}}

    def encode(self) -> bytes:
        obj: dict = self.offset_table()
        if self.scan_from is not None:
            obj["scanFrom"] = self.scan_from
        return fastjson.dumps(obj)


def decode_state(raw: bytes) -> DelayState:
    """ValueError when it is not a delay offset table."""
    try:
        obj = fastjson.loads(raw)
        table = obj["offsetTable"]
        offsets = {int(level): int(offset) for level, offset in table.items()}
        scan_from = obj.get("scanFrom")
        state = DelayState(offsets, None if scan_from is None else int(scan_from))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a delay offset table ({type(exc).__name__}: {exc})") from None
    if any(level <= 0 or offset < 0 for level, offset in offsets.items()) or (state.scan_from or 0) < 0:
        raise ValueError("negative level or offset")
    return state


class DelayOffsetFile:
    """delayOffset.json through smartgo.common.persist (atomic writes, .bak fallback on load)."""

    def __init__(self, store_path: Path | str) -> None:
        self.file = PersistedFile(Path(store_path) / DELAY_OFFSET_FILE)
        self.path = self.file.path
        self._lock = threading.Lock()       # the actor's worker-thread writes and its final one at stop

    def load(self) -> DelayState | None:
        """The file, else its .bak (both logged when corrupt); None when neither is readable."""
        return self.file.load(decode_state, "delay offsets")

    def save(self, state: DelayState) -> None:
        with self._lock:
            self.file.save(state.encode())


async def get_all_delay_offset(store_path: Path, request: RemotingCommand) -> RemotingCommand:
    """GET_ALL_DELAY_OFFSET (45): the offset table as DelayOffsetSerializeWrapper JSON (what the
    schedule actor last persisted; an empty table before it ever ran, or when unreadable)."""
    state = DelayOffsetFile(store_path).load() or DelayState({}, None)
    body = fastjson.dumps(state.offset_table())
    return request.make_response(ResponseCode.SUCCESS, body=body)
