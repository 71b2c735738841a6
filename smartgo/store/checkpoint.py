"""The checkpoint file: one 4 KiB page {physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp}
as RocketMQ 4.x lays it out, plus SmartGo's own flushed CommitLog offset at byte 64 and its end at
a clean stop at byte 72 (RocketMQ ignores the rest of the page; 5.x uses bytes 24-39).

Each field has one writer (the flush actor after a CommitLog or ConsumeQueue flush; the
index writer after an index flush); every process maps the same page. Abnormal recovery
starts from the newest CommitLog file whose first record is older than min_timestamp(), or
earlier, from the file holding physic_offset: a store timestamp is covered by no CRC, so a
torn record past the flush could otherwise pass for an old one and move the start past
unflushed data.
"""

from __future__ import annotations

import struct
from pathlib import Path

from smartgo.store.mapped_file import MappedFile, create_segment

CHECKPOINT_SIZE = 4096
_FIELDS = struct.Struct(">qqq")
_TS = struct.Struct(">q")


class Checkpoint:
    def __init__(self, path: Path | str):
        path = Path(path)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            create_segment(path, CHECKPOINT_SIZE)
        self._file = MappedFile(path, 0, CHECKPOINT_SIZE, writable=True)
        self._mm = self._file.mm

    def _get(self, pos: int) -> int:
        return _TS.unpack_from(self._mm, pos)[0]

    def _set(self, pos: int, value: int) -> None:
        _TS.pack_into(self._mm, pos, value)

    physic_timestamp = property(lambda self: self._get(0), lambda self, v: self._set(0, v))
    logics_timestamp = property(lambda self: self._get(8), lambda self, v: self._set(8, v))
    index_timestamp = property(lambda self: self._get(16), lambda self, v: self._set(16, v))
    physic_offset = property(lambda self: self._get(64), lambda self, v: self._set(64, v))
    # The CommitLog's end at a clean stop (everything written flushed, ConsumeQueues and index too),
    # set just before the abort marker goes; 0 once a recovery has used it. Normal recovery then
    # checks the store from there instead of the last three files (smartgo.store.recovery).
    clean_end = property(lambda self: self._get(72), lambda self, v: self._set(72, v))

    def min_timestamp(self, index_safe: bool = False) -> int:
        """StoreCheckpoint.getMinTimestamp (min(physic, logics) - 3 s, >= 0), or with
        messageIndexSafe getMinTimestampIndex (also bounded by the index timestamp)."""
        physic, logics, index = _FIELDS.unpack_from(self._mm, 0)
        low = max(0, min(physic, logics) - 3000)
        return min(low, index) if index_safe else low

    def flush(self) -> None:
        self._file.flush(0, CHECKPOINT_SIZE)

    def mark_clean(self, end: int) -> None:
        """A clean stop with everything up to `end` flushed (call before the abort marker goes)."""
        self.clean_end = end
        self.flush()

    def close(self) -> None:
        self._file.close()
