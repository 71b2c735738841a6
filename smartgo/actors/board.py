"""The board: one small shared mmap file (<run-dir>/board) every process of a node can read.

It holds what actors publish to each other without messages: positions (written, flushed,
slave-acked, ...), flags (disk full, read-only), per-queue max offsets and one slot per actor
(pid, heartbeat, state, restarts, mailbox depth).

Rules that make it lock-free:
- every field has exactly one writer (declared in the layout; `Board.scalar(name, writer=...)`
  refuses a handle to anyone else), so there are no write-write races;
- every field is one 8-byte aligned int64, stored and loaded through a memoryview cast to 'q'
  (`words[i] = v`): CPython copies the 8 bytes with one fixed-size memcpy, i.e. one aligned
  8-byte store or load on x86-64, so no reader sees a torn value. NOT struct.pack_into: it
  zero-fills the target before writing it, so a concurrent reader can see a transient 0;
- records of several fields (the supervisor's part of an actor slot) are written under a
  seqlock (odd counter while writing); readers retry until they see the same even counter;
- a queue-table entry is published by storing its hash last: x86-64 keeps stores in order, so a
  reader that sees the hash also sees the key bytes written before it. Entries never move. The
  entries' indices are also listed in insertion order after the table (count word last), so a
  reader walks the entries in use, not the whole table.

The layout (field names, offsets, writers, table sizes) is written into the file as a msgpack
directory, so readers need no code of their own: later issues add fields by declaring them in
their role (smartgo/node/roles.py) and `smartgo health` shows them without changes.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

MAGIC = b"SGBOARD1"
VERSION = 1
HEADER = struct.Struct("<8sqqqqq")  # magic, version, size, dir_off, dir_len, created_ns
HEADER_SIZE = 64
ALIGN = 64  # regions start on their own cache line

NAME_BYTES = 32       # actor names in slots
TOPIC_BYTES = 128     # RocketMQ topics are at most 127 bytes (signed length byte in the store)
SUPERVISOR = "supervisor"

# Actor slot layout, in 8-byte words of one 192-byte slot. Words 0..7: the supervisor's record
# under a seqlock (seq, pid, incarnation, restarts, sup_state, deadline_ns, spawned_ns,
# last_exit); 8..14: fields the actor itself writes, one store each (pid, heartbeat, state,
# mailbox depth, progress, loop lag, its maximum); bytes 160..191: the name.
SLOT_SIZE = 192
_SUP_WORDS = 8
_SELF_PID, _HEARTBEAT, _STATE, _DEPTH, _PROGRESS, _LAG, _LAG_MAX = range(8, 15)
_NAME = 160

# Queue-table entry, in words: hash (published last), queue id, topic length, values..., then
# the topic bytes.
_ENTRY_HEAD_WORDS = 3

NO_EXIT = -(1 << 62)  # last_exit before the first exit


class SupState:
    """What the supervisor knows about an actor (written by the supervisor only)."""
    EMPTY, PENDING, SPAWNED, READY, BACKOFF, STOPPING, STOPPED, FAILED = range(8)
    NAMES = ("empty", "pending", "spawned", "ready", "backoff", "stopping", "stopped", "failed")


class ActorState:
    """What the actor says about itself (written by the actor only)."""
    NONE, STARTING, RUNNING, STOPPING, STOPPED = range(5)
    NAMES = ("none", "starting", "running", "stopping", "stopped")


class NodeState:
    """Lifecycle of the whole node (board field node.state, written by the supervisor)."""
    STARTING, RECOVERING, RUNNING, RESTARTING, STOPPING, STOPPED, FAILED = range(1, 8)
    NAMES = ("none", "starting", "recovering", "running", "restarting", "stopping", "stopped", "failed")


class BoardError(Exception):
    """The board file is missing, foreign, or a field is used against its declaration."""


class BoardFull(BoardError):
    """The per-queue table is at its load limit (raise board_queue_capacity)."""


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One int64 scalar: its name, its only writer (an actor name or 'supervisor') and why."""
    name: str
    writer: str
    doc: str = ""


# Fields every node has; roles append their own (smartgo/node/roles.py).
NODE_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("node.pid", SUPERVISOR, "supervisor pid"),
    FieldSpec("node.state", SUPERVISOR, "NodeState"),
    FieldSpec("node.heartbeat_ns", SUPERVISOR, "CLOCK_MONOTONIC of the supervisor loop's last turn"),
    FieldSpec("node.started_ns", SUPERVISOR, "wall clock (ns) when this board was created"),
    FieldSpec("node.restarts", SUPERVISOR, "whole-node restarts since the supervisor started"),
    FieldSpec("node.forkserver_pid", SUPERVISOR, "multiprocessing's fork server; 0 while being replaced, -1: none"),
    FieldSpec("node.tracker_pid", SUPERVISOR, "multiprocessing's resource tracker; 0 while being replaced"),
)


@dataclass(frozen=True)
class BoardLayout:
    """Everything needed to create a board; readers get it back from the file's directory."""
    fields: Sequence[FieldSpec] = NODE_FIELDS
    max_actors: int = 64
    queue_capacity: int = 65536         # rounded up to a power of two
    queue_values: Sequence[str] = ("max_offset",)
    queue_writer: str = "dispatch"
    meta: dict = field(default_factory=dict)  # role, store dir...: shown by health

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise BoardError(f"board fields declared twice: {sorted(dup)}")


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) & ~(a - 1)


def monotonic_ns() -> int:
    """The clock of every heartbeat: CLOCK_MONOTONIC is one clock for all processes of a host."""
    return time.monotonic_ns()


class Board:
    """A mapped board. Create it with Board.create (the supervisor), open it with Board.open."""

    def __init__(self, path: Path, mm: mmap.mmap, directory: dict, writable: bool) -> None:
        self.path = path
        self._mm = mm
        self.buf = memoryview(mm)
        self.words = self.buf.cast("q")
        self.writable = writable
        self.directory = directory
        self.meta: dict = directory["meta"]
        self._fields: dict[str, tuple[int, str]] = {n: (off, w) for n, off, w in directory["fields"]}
        s = directory["slots"]
        self._slots_off, self.max_actors = s["offset"], s["count"]
        q = directory["queues"]
        self.queues = QueueTable(self, q["offset"], q["order"], q["capacity"], tuple(q["values"]), q["writer"])
        self._slot_index: dict[str, int] = {}

    # ---- creation and opening -------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, layout: BoardLayout) -> Board:
        """Write a fresh board next to `path` and rename it into place (readers never see a half one)."""
        path = Path(path)
        fields_off = HEADER_SIZE
        entries: list[list[Any]] = []  # [name, offset, writer]
        off = 0
        for f in layout.fields:
            entries.append([f.name, off, f.writer])
            off += 8
        scalars_len = off
        qcap = 1 << max(3, (layout.queue_capacity - 1).bit_length())
        entry_size = _align(8 * (_ENTRY_HEAD_WORDS + len(layout.queue_values)) + TOPIC_BYTES, 8)
        directory: dict[str, Any] = {"fields": entries, "meta": dict(layout.meta),
                     "slots": {"offset": 0, "count": layout.max_actors, "size": SLOT_SIZE},
                     "queues": {"offset": 0, "order": 0, "capacity": qcap, "entry_size": entry_size,
                                "values": list(layout.queue_values), "writer": layout.queue_writer}}
        # Offsets depend on the directory length, which depends on the offsets: size it twice.
        for _ in range(2):
            blob = msgpack.packb(directory)
            fields_off = _align(HEADER_SIZE + len(blob) + 256)
            slots_off = _align(fields_off + scalars_len)
            queues_off = _align(slots_off + SLOT_SIZE * layout.max_actors)
            directory["fields"] = [[n, fields_off + o, w] for (n, o, w) in entries]
            directory["slots"]["offset"] = slots_off
            order_off = _align(queues_off + qcap * entry_size)
            directory["queues"]["offset"] = queues_off
            directory["queues"]["order"] = order_off
        blob = msgpack.packb(directory)
        assert HEADER_SIZE + len(blob) <= fields_off
        size = _align(order_off + 8 * (1 + qcap), mmap.PAGESIZE)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as out:
            out.truncate(size)
            out.seek(HEADER_SIZE)
            out.write(blob)
            out.seek(0)
            out.write(HEADER.pack(MAGIC, VERSION, size, HEADER_SIZE, len(blob), time.time_ns()))
        os.replace(tmp, path)
        return cls.open(path, writable=True)

    @classmethod
    def open(cls, path: Path, writable: bool = True) -> Board:
        path = Path(path)
        try:
            with open(path, "r+b" if writable else "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < HEADER_SIZE:
                    raise BoardError(f"{path}: not a board (too small)")
                mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        except FileNotFoundError:
            raise BoardError(f"no board at {path} (has the node ever started with this store dir?)") from None
        magic, version, fsize, doff, dlen, _ = HEADER.unpack_from(mm, 0)
        if magic != MAGIC or version != VERSION or fsize != size:
            mm.close()
            raise BoardError(f"{path}: not a SmartGo board (magic {magic!r}, version {version})")
        directory = msgpack.unpackb(mm[doff:doff + dlen])
        return cls(path, mm, directory, writable)

    def close(self) -> None:
        self.words.release()
        self.buf.release()
        try:
            self._mm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes with the process

    @property
    def created_ns(self) -> int:
        return HEADER.unpack_from(self._mm, 0)[5]

    # ---- scalar fields ---------------------------------------------------------------------
    def field_names(self) -> list[str]:
        return list(self._fields)

    def scalar(self, name: str, writer: str | None = None) -> Scalar:
        """A handle on one field; pass writer=<your actor name> to be allowed to set it."""
        try:
            off, owner = self._fields[name]
        except KeyError:
            raise BoardError(f"board has no field {name!r}") from None
        if writer is not None and writer != owner:
            raise BoardError(f"field {name!r} is written by {owner!r}, not {writer!r}")
        return Scalar(self.words, off >> 3, writer is not None and self.writable)

    def get(self, name: str) -> int:
        return self.words[self._fields[name][0] >> 3]

    def scalars(self) -> dict[str, int]:
        return {n: self.words[off >> 3] for n, (off, _) in self._fields.items()}

    # ---- actor slots -------------------------------------------------------------------------
    def slot_offset(self, index: int) -> int:
        if not 0 <= index < self.max_actors:
            raise BoardError(f"actor slot {index} out of range (board has {self.max_actors})")
        return self._slots_off + index * SLOT_SIZE

    def name_slot(self, index: int, name: str) -> None:
        """Supervisor: give slot `index` to actor `name` (once per board)."""
        raw = name.encode()
        if not raw or len(raw) > NAME_BYTES:
            raise BoardError(f"actor name {name!r} must be 1..{NAME_BYTES} bytes")
        off = self.slot_offset(index)
        self.buf[off + _NAME:off + _NAME + NAME_BYTES] = raw.ljust(NAME_BYTES, b"\0")
        self._slot_index[name] = index

    def slot_of(self, name: str) -> int:
        idx = self._slot_index.get(name)
        if idx is None:
            for i, n in self._named_slots():
                self._slot_index[n] = i
            idx = self._slot_index.get(name)
            if idx is None:
                raise BoardError(f"no actor named {name!r} on the board")
        return idx

    def _named_slots(self) -> Iterator[tuple[int, str]]:
        for i in range(self.max_actors):
            off = self._slots_off + i * SLOT_SIZE + _NAME
            raw = bytes(self.buf[off:off + NAME_BYTES]).rstrip(b"\0")
            if raw:
                yield i, raw.decode()

    def actor_names(self) -> list[str]:
        return [n for _, n in self._named_slots()]

    def write_supervised(self, index: int, *, pid: int, incarnation: int, restarts: int, sup_state: int,
                         deadline_ns: int, spawned_ns: int, last_exit: int) -> None:
        """Supervisor: publish its record of an actor under the slot's seqlock."""
        w = self.words
        i = self.slot_offset(index) >> 3
        seq = w[i]
        w[i] = seq + 1                                          # odd: being written
        for k, v in enumerate((pid, incarnation, restarts, sup_state, deadline_ns, spawned_ns, last_exit), 1):
            w[i + k] = v
        w[i] = seq + 2                                          # even: consistent

    def self_writer(self, index: int) -> SlotWriter:
        return SlotWriter(self.words, self.slot_offset(index) >> 3)

    def read_slot(self, index: int) -> SlotView:
        off = self.slot_offset(index)
        w = self.words
        i = off >> 3
        give_up = 0.0
        while True:
            sup = w[i:i + _SUP_WORDS].tolist()                  # one 8-byte load per word
            if sup[0] & 1 == 0 and w[i] == sup[0]:
                break
            now = time.monotonic()
            if not give_up:
                give_up = now + 1.0
            elif now > give_up:                                 # the supervisor died mid-write
                raise BoardError(f"actor slot {index} stays mid-write (seqlock odd)")
        mine = w[i + _SELF_PID:i + _LAG_MAX + 1].tolist()
        raw = bytes(self.buf[off + _NAME:off + _NAME + NAME_BYTES]).rstrip(b"\0")
        return SlotView(raw.decode(), *sup[1:], *mine)

    def actor_running(self, name: str) -> bool:
        """Liveness of a peer, cheap enough for a hot path: the supervisor's latest process of
        `name` is ready and says it runs (a hung one is killed by the supervisor, not judged here)."""
        v = self.read_slot(self.slot_of(name))
        return v.sup_state == SupState.READY and v.current and v.state == ActorState.RUNNING

    def slots(self) -> list[SlotView]:
        return [self.read_slot(i) for i, _ in self._named_slots()]


class Scalar:
    """One int64 field. get() for everyone; set() only through a handle created for its writer."""
    __slots__ = ("_words", "_i", "_writable")

    def __init__(self, words: memoryview, index: int, writable: bool) -> None:
        self._words, self._i, self._writable = words, index, writable

    def get(self) -> int:
        return self._words[self._i]

    def set(self, value: int) -> None:
        if not self._writable:
            raise BoardError("read-only handle: ask Board.scalar(name, writer=...) for a writable one")
        self._words[self._i] = value


class SlotWriter:
    """The actor's own fields in its slot: one 8-byte store each, no seqlock needed."""
    __slots__ = ("_w", "_i")

    def __init__(self, words: memoryview, index: int) -> None:
        self._w, self._i = words, index

    def claim(self, pid: int) -> None:
        """First write of a new incarnation: readers trust the other fields once self_pid == pid."""
        w, i = self._w, self._i
        w[i + _STATE] = ActorState.STARTING
        w[i + _HEARTBEAT] = monotonic_ns()
        w[i + _DEPTH] = w[i + _PROGRESS] = w[i + _LAG] = w[i + _LAG_MAX] = 0
        w[i + _SELF_PID] = pid

    def heartbeat(self, depth: int, lag_ns: int) -> None:
        """lag_ns: how late this heartbeat's timer fired, i.e. how long the loop went without a turn."""
        w, i = self._w, self._i
        w[i + _DEPTH] = depth
        w[i + _LAG] = lag_ns
        if lag_ns > w[i + _LAG_MAX]:
            w[i + _LAG_MAX] = lag_ns
        w[i + _HEARTBEAT] = monotonic_ns()

    def progress_cell(self) -> memoryview:
        """The slot's progress counter as a one-item view: the hot path counts its work with
        `cell[0] += 1` (one store), inside a long synchronous stretch too, so the supervisor
        can tell an actor that serves without turning its loop from a hung one."""
        return self._w[self._i + _PROGRESS:self._i + _PROGRESS + 1]

    def state(self, state: int) -> None:
        self._w[self._i + _STATE] = state


@dataclass(frozen=True, slots=True)
class SlotView:
    """A consistent snapshot of one actor slot."""
    name: str
    pid: int
    incarnation: int
    restarts: int
    sup_state: int
    deadline_ns: int
    spawned_ns: int
    last_exit: int
    self_pid: int
    heartbeat_ns: int
    state: int
    mailbox_depth: int
    progress: int           # units of work done (the net actors: requests and woken pulls served)
    loop_lag_ns: int        # the last heartbeat's lateness: the loop's latest gap between turns
    loop_lag_max_ns: int    # the largest since this incarnation started

    @property
    def current(self) -> bool:
        """The actor-written fields belong to the incarnation the supervisor spawned last."""
        return self.pid != 0 and self.self_pid == self.pid


class QueueTable:
    """Per-queue values (max offset, ...) keyed by (topic, queue id); one writer (dispatch).

    Open addressing with linear probing over a power-of-two table. Readers in other processes
    look up without locks: probe from the key's crc32, stop at an empty entry (hash 0). Entries
    are never removed, so `index_of` results can be cached for the life of the board. The order
    list (a count word, then entry indices) makes `items` cost the entries in use, whatever the
    capacity.
    """

    def __init__(self, board: Board, offset: int, order: int, capacity: int, values: tuple[str, ...],
                 writer: str) -> None:
        self._buf = board.buf
        self._w = board.words
        self._writable = board.writable
        self._off = offset
        self._order = order >> 3
        self.capacity = capacity
        self.limit = capacity * 3 // 4          # load limit: linear probing slows past it
        self._mask = capacity - 1
        self.values = values
        self.writer = writer
        self._topic_off = 8 * (_ENTRY_HEAD_WORDS + len(values))
        self.entry_size = _align(self._topic_off + TOPIC_BYTES, 8)

    @staticmethod
    def _hash(topic: bytes, queue_id: int) -> int:
        return (zlib.crc32(topic, queue_id & 0xFFFFFFFF) << 1) | 1   # never 0 (0 = empty)

    def _word(self, index: int) -> int:
        return (self._off + index * self.entry_size) >> 3

    def _value_word(self, name: str) -> int:
        try:
            return _ENTRY_HEAD_WORDS + self.values.index(name)
        except ValueError:
            raise BoardError(f"queue table has no value {name!r} (has {self.values})") from None

    def index_of(self, topic: str, queue_id: int) -> int | None:
        """Entry index for (topic, queue id), or None when it was never published."""
        key = topic.encode()
        h = self._hash(key, queue_id)
        w, buf = self._w, self._buf
        i = h & self._mask
        for _ in range(self.capacity):
            e = self._word(i)
            eh = w[e]
            if eh == 0:
                return None
            if eh == h and w[e + 1] == queue_id and w[e + 2] == len(key):
                t = (e << 3) + self._topic_off
                if buf[t:t + len(key)] == key:
                    return i
            i = (i + 1) & self._mask
        return None

    def value_at(self, index: int, name: str = "max_offset") -> int:
        return self._w[self._word(index) + self._value_word(name)]

    def get(self, topic: str, queue_id: int, name: str = "max_offset") -> int | None:
        i = self.index_of(topic, queue_id)
        return None if i is None else self.value_at(i, name)

    def writer_handle(self, writer: str) -> QueueTableWriter:
        if writer != self.writer or not self._writable:
            raise BoardError(f"the queue table is written by {self.writer!r}, not {writer!r}")
        return QueueTableWriter(self)

    @property
    def count(self) -> int:
        """Entries published so far."""
        return self._w[self._order]

    def items(self) -> Iterator[tuple[str, int, dict[str, int]]]:
        """Every published entry, oldest first: (topic, queue id, {value name: value})."""
        w, buf, order = self._w, self._buf, self._order
        for n in range(w[order]):
            e = self._word(w[order + 1 + n])
            t = (e << 3) + self._topic_off
            topic = bytes(buf[t:t + w[e + 2]]).decode()
            vals = {name: w[e + _ENTRY_HEAD_WORDS + j] for j, name in enumerate(self.values)}
            yield topic, w[e + 1], vals


class QueueTableWriter:
    """The single writer's side of the queue table (the dispatch actor)."""

    def __init__(self, table: QueueTable) -> None:
        self.t = table
        self._cache: dict[tuple[str, int], int] = {}

    def index_for(self, topic: str, queue_id: int, initial: dict[str, int] | None = None) -> int:
        """The entry of (topic, queue id), inserting it on first use with `initial` values (else 0).

        A new entry's values are written before its hash publishes it: no reader sees a
        half-made entry or a value it never had.
        """
        k = (topic, queue_id)
        i = self._cache.get(k)
        if i is not None:
            return i
        t = self.t
        i = t.index_of(topic, queue_id)
        if i is None:
            key = topic.encode()
            if len(key) > TOPIC_BYTES - 1:
                raise BoardError(f"topic longer than {TOPIC_BYTES - 1} bytes: {topic[:40]!r}...")
            count = t.count
            if count >= t.limit:
                raise BoardFull(f"the board's queue table is full ({count} queues, its load limit; "
                                f"{t.capacity} entries): a node restart sizes it from the store, "
                                "board_queue_capacity starts it larger")
            h = t._hash(key, queue_id)
            i = h & t._mask
            while t._w[t._word(i)] != 0:
                i = (i + 1) & t._mask
            e = t._word(i)
            start = (e << 3) + t._topic_off
            t._buf[start:start + len(key)] = key
            t._w[e + 1] = queue_id
            t._w[e + 2] = len(key)
            for name, value in (initial or {}).items():
                t._w[e + t._value_word(name)] = value
            t._w[e] = h                                  # publish last
            t._w[t._order + 1 + count] = i
            t._w[t._order] = count + 1
        self._cache[k] = i
        return i

    def set_at(self, index: int, value: int, name: str = "max_offset") -> None:
        self.t._w[self.t._word(index) + self.t._value_word(name)] = value

    def set(self, topic: str, queue_id: int, value: int, name: str = "max_offset") -> None:
        i = self._cache.get((topic, queue_id))
        if i is None:
            i = self.index_for(topic, queue_id, {name: value})
        self.set_at(i, value, name)
