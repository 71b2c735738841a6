"""Single-producer single-consumer byte ring in a shared mapped file, woken through FIFOs.

Records are variable-size byte strings. The producer copies a batch of them in as one frame and
publishes the new tail once; the consumer takes everything published (zero-copy memoryviews), processes
it and publishes the new head once. A frame never straddles the end of the buffer: when it does
not fit in the free tail, the producer writes a skip marker there and the frame goes to the
start (a batch that does not fit at all is cut into frames at record boundaries; a record is
never split).

File layout (<run-dir>/rings/<name>.ring; all fields int64, 8-byte aligned, one writer each):

    0     magic "SGRING01", version, capacity, data offset      (written once at creation)
    128   producer line: tail, epoch, start, pid, waiting       (producer only)
    256   consumer line: head, epoch, pid, waiting              (consumer only)
    384   producer doorbell path (length + bytes)               (producer only)
    640   consumer doorbell path                                (consumer only)
    4096  data: frames, each one published batch, 8-byte aligned:
          [int64 size][int64 count][uint32 length x count][payloads][pad]; size -1 = skip to start

Why a file under <run-dir>/rings and not multiprocessing.shared_memory: the file has a name a
restarted actor finds again; shared_memory in Python 3.11 registers every attach with the
resource tracker, which unlinks the segment when any attaching process exits (gh-82300); the
node's run dir is wiped at each node start, so nothing leaks; and run_dir can point at a tmpfs
when the kernel's write-back of ring pages to disk is unwanted.

head and tail count bytes since creation (they never wrap); offset = position & (capacity-1).
The two lines are 128 bytes apart so the sides never share a cache line (nor its prefetch pair).

Wake-ups cost 12-83 us each, so they are rare by construction: a side that finds nothing to do
sets its `waiting` flag, re-checks, and only then sleeps on its doorbell; the other side rings
the doorbell after publishing only when it sees the flag, so at most one wake per batch and
none while the peer is busy. Between the flag store and the re-check both sides execute a full
memory barrier (`full_fence`), otherwise x86's store buffer could let each miss the other.

Doorbells are named FIFOs (opened O_RDWR, non-blocking): like an eventfd they are one
fd an asyncio loop can watch, but they have a path, so a restarted actor finds the doorbell of
a peer that never restarted. Each side writes its doorbell path into its line at attach time.

Peer restart: each side bumps its `epoch` when it attaches. A new consumer discards everything
published before it (head := tail) and rings the producer in case it waits for space. A new
producer records `start` = the tail it found; the consumer, on seeing the producer's epoch
change, skips to `start`, so records of a dead producer are never delivered. Only complete
records are ever published, so a side killed mid-write leaves nothing torn behind. Producers
learn of a consumer restart from `consumer_epoch` (to fail what they had in flight).

Resuming (`attach(..., resume=True)`), for rings whose records must survive a restart of one
side (the broker's commit actor re-reads what it had not released; its completions stay
deliverable): a resuming consumer keeps the published head, so everything read but not
released is read again (records of a producer that died meanwhile are still skipped on the
first read, unless read explicitly with `read(upto=...)`); a resuming producer leaves `start`
alone, so what its predecessor published is still delivered.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import mmap
import os
import select
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

MAGIC = b"SGRING01"
VERSION = 1
_H0 = struct.Struct("<8sqqq")
_PROD, _CONS, _PBELL, _CBELL = 128, 256, 384, 640          # byte offsets of the lines
# Word indices (8-byte units) of the fields. Every published field is read and written through a
# memoryview cast to 'q': one aligned 8-byte load/store each (struct.pack_into zero-fills its
# target before writing, which a concurrent reader could observe).
_TAIL, _PEPOCH, _PSTART, _PPID, _PWAIT = range(_PROD // 8, _PROD // 8 + 5)
_HEAD, _CEPOCH, _CPID, _CWAIT = range(_CONS // 8, _CONS // 8 + 4)
_BELL_MAX = 248
DATA_OFF = 4096
FRAME_HDR = 16     # two words: frame size (header + lengths + payloads; -1 = skip), record count
SKIP = -1
DEFAULT_CAPACITY = 1 << 20

PRODUCER = "producer"
CONSUMER = "consumer"
_DRAIN = 65536   # a FIFO's default capacity: one read usually empties it

_fence_lock = threading.Lock()


def full_fence() -> None:
    """A full memory barrier: an uncontended lock round trip is a LOCK-prefixed atomic in libc."""
    _fence_lock.acquire()
    _fence_lock.release()


class RingError(Exception):
    """The ring file is foreign, has another capacity, or a record cannot ever fit."""


class RingTimeout(TimeoutError):
    """A blocking write gave up; `written` records of the batch went in before it did."""

    def __init__(self, written: int) -> None:
        super().__init__(f"ring full: {written} records written before the timeout")
        self.written = written


class Doorbell:
    """A named FIFO one process sleeps on and any other process rings."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkfifo(self.path, 0o600)
        except FileExistsError:
            if not stat.S_ISFIFO(os.stat(self.path).st_mode):
                raise RingError(f"{self.path} exists and is not a FIFO") from None
        # O_RDWR keeps the FIFO open with no peer (Linux): writes never fail with ENXIO/EPIPE.
        self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._waiters: list[asyncio.Future] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def fileno(self) -> int:
        return self.fd

    def ring(self) -> None:
        ring_fd(self.fd)

    def clear(self) -> None:
        try:
            while len(os.read(self.fd, _DRAIN)) == _DRAIN:   # a short read emptied the FIFO
                pass
        except BlockingIOError:
            pass

    def _on_readable(self) -> None:
        self.clear()
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(True)

    async def wait(self, timeout: float | None = None) -> bool:
        """Sleep until rung (True) or timeout (False). Many coroutines may wait at once.

        The FIFO stays registered with the loop between waits (two epoll_ctl calls saved per
        sleep); a ring nobody waits for is drained and forgotten, which the waiting-flag protocol
        allows: a sleeper re-checks its condition after raising its flag, before it waits.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self.fd)
            self._loop = loop
            loop.add_reader(self.fd, self._on_readable)
        fut = loop.create_future()
        self._waiters.append(fut)
        timer = None if timeout is None else loop.call_later(max(timeout, 0), _expire, fut)
        try:
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            if fut in self._waiters:
                self._waiters.remove(fut)

    def wait_blocking(self, timeout: float | None) -> bool:
        # poll, not select: an actor that maps thousands of files (the open-files limit is raised
        # for them) can hold a doorbell above select's FD_SETSIZE of 1,024
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        ready = poller.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999)))
        self.clear()
        return bool(ready)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.fd)
        self._loop = None
        os.close(self.fd)


_LENS: dict[int, struct.Struct] = {}


def _lens_struct(k: int) -> struct.Struct:
    st = _LENS.get(k)
    if st is None:
        st = _LENS[k] = struct.Struct(f"<{k}I")
    return st


def _fit(lens: list[int], avail: int) -> int:
    """How many leading records fit one frame of at most `avail` bytes."""
    used = FRAME_HDR
    for k, n in enumerate(lens):
        used += 4 + n
        if (used + 7) & ~7 > avail:
            return k
    return len(lens)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)


def ring_fd(fd: int) -> None:
    try:
        os.write(fd, b"\1")
    except BlockingIOError:
        pass  # FIFO full: the sleeper has plenty of wake-ups pending already


class Ring:
    """One side (producer or consumer) of a ring. Create with Ring.attach."""

    def __init__(self, path: Path, mm: mmap.mmap, role: str, bell: Doorbell, capacity: int) -> None:
        self.path = path
        self.role = role
        self.bell = bell
        self.capacity = capacity
        self._mask = capacity - 1
        self._mm = mm
        self._buf = memoryview(mm)
        self._w = self._buf.cast("q")
        self._peer_bell_fd = -1
        self._peer_bell_epoch = -1
        self._peer_epoch_line = _CEPOCH if role == PRODUCER else _PEPOCH
        self._peer_wait = _CWAIT if role == PRODUCER else _PWAIT
        self._own_wait = _PWAIT if role == PRODUCER else _CWAIT
        self._peer_bell_at = _CBELL if role == PRODUCER else _PBELL
        w = self._w
        self._tail = w[_TAIL]                              # producer's own copy
        self._head = w[_HEAD]                              # consumer's published head
        self._pending = self._head                         # consumer: head after the last read()
        self._seen_pepoch = w[_PEPOCH]
        self.epoch = 0
        self._own_bell = False

    # ---- attach ----------------------------------------------------------------------------------
    @classmethod
    def attach(cls, path: Path, role: str, capacity: int = DEFAULT_CAPACITY,
               bell: Doorbell | None = None, resume: bool = False) -> Ring:
        """Open (creating if needed) the ring at `path` as its producer or consumer.

        Attaching starts a new epoch for this side (see the module doc). `bell` is the doorbell
        this side sleeps on; several rings of one actor may share one. Default: <path>.<role>.bell.
        resume: keep what the previous incarnation of this side left (see the module doc).
        """
        if role not in (PRODUCER, CONSUMER):
            raise ValueError(f"role must be {PRODUCER!r} or {CONSUMER!r}")
        if capacity < 4096 or capacity & (capacity - 1):
            raise ValueError("capacity must be a power of two >= 4096")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        own_bell = bell is None
        if bell is None:
            bell = Doorbell(path.with_name(f"{path.name}.{role}.bell"))
        bell_raw = os.fsencode(bell.path.resolve())
        if len(bell_raw) > _BELL_MAX:
            raise RingError(f"doorbell path longer than {_BELL_MAX} bytes: {bell.path}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)   # serialises creation and the two sides' attaches
            size = os.fstat(fd).st_size
            if size == 0:
                os.ftruncate(fd, DATA_OFF + capacity)
                mm = mmap.mmap(fd, DATA_OFF + capacity)
                _H0.pack_into(mm, 0, b"\0" * 8, VERSION, capacity, DATA_OFF)
                mm[0:8] = MAGIC
            else:
                mm = mmap.mmap(fd, size)
                magic, version, cap, doff = _H0.unpack_from(mm, 0)
                if magic != MAGIC or version != VERSION or doff != DATA_OFF:
                    mm.close()
                    raise RingError(f"{path}: not a SmartGo ring")
                if cap != capacity or size != DATA_OFF + cap:
                    mm.close()
                    raise RingError(f"{path}: capacity {cap}, asked for {capacity}")
            ring = cls(path, mm, role, bell, capacity)
            ring._own_bell = own_bell
            ring._claim(bell_raw, resume)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)   # explicit: mmap holds a dup of fd, which keeps the lock
            os.close(fd)
        return ring

    def _claim(self, bell_raw: bytes, resume: bool) -> None:
        b, w = self._buf, self._w
        if self.role == PRODUCER:
            w[_PWAIT] = 0
            if not resume:
                w[_PSTART] = self._tail                  # the consumer skips what came before us
            w[_PPID] = os.getpid()
            w[_PBELL // 8] = len(bell_raw)
            b[_PBELL + 8:_PBELL + 8 + len(bell_raw)] = bell_raw
            self.epoch = w[_PEPOCH] + 1
            w[_PEPOCH] = self.epoch                      # publishes start, pid, bell
        else:
            w[_CWAIT] = 0
            w[_CPID] = os.getpid()
            w[_CBELL // 8] = len(bell_raw)
            b[_CBELL + 8:_CBELL + 8 + len(bell_raw)] = bell_raw
            if resume:
                self._seen_pepoch = -1                   # first read() re-checks the producer's start
            else:
                self._seen_pepoch = w[_PEPOCH]
                self._head = self._pending = w[_TAIL]    # discard what came before us
                w[_HEAD] = self._head
            self.epoch = w[_CEPOCH] + 1
            w[_CEPOCH] = self.epoch
            full_fence()
            self._ring_peer(force=True)                  # a producer may be waiting for space

    # ---- shared helpers -------------------------------------------------------------------------
    @property
    def peer_epoch(self) -> int:
        """The other side's epoch: it changes when the peer (re)attaches."""
        return self._w[self._peer_epoch_line]

    @property
    def peer_pid(self) -> int:
        return self._w[_CPID if self.role == PRODUCER else _PPID]

    def backlog(self) -> int:
        """Bytes published and not yet released (the consumer's mailbox depth)."""
        return self._w[_TAIL] - self._w[_HEAD]

    def _ring_peer(self, force: bool = False) -> None:
        w = self._w
        if not force and not w[self._peer_wait]:
            return
        epoch = w[self._peer_epoch_line]
        if epoch != self._peer_bell_epoch:
            self._open_peer_bell(epoch)
        if self._peer_bell_fd >= 0:
            ring_fd(self._peer_bell_fd)

    def _open_peer_bell(self, epoch: int) -> None:
        if self._peer_bell_fd >= 0:
            os.close(self._peer_bell_fd)
            self._peer_bell_fd = -1
        self._peer_bell_epoch = epoch
        n = self._w[self._peer_bell_at // 8]
        if epoch == 0 or not 0 < n <= _BELL_MAX:
            return                                        # no peer attached yet
        raw = bytes(self._buf[self._peer_bell_at + 8:self._peer_bell_at + 8 + n])
        try:
            self._peer_bell_fd = os.open(raw, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise

    def _set_waiting(self, flag: int) -> None:
        self._w[self._own_wait] = flag

    # ---- producer ---------------------------------------------------------------------------------
    def try_write(self, records: Sequence[bytes | bytearray | memoryview], start: int = 0, wake: bool = True) -> int:
        """Copy records[start:] in as one frame (or as many as fit), publish, wake a sleeper.

        Returns the index of the first record not written (len(records) when all went in).
        wake=False: publish without ringing the consumer (its doorbell is about to ring for
        another reason anyway; it must not sleep without a timeout on this ring alone).
        """
        n_rec = len(records)
        if start >= n_rec:
            return start
        b, w = self._buf, self._w
        cap = self.capacity
        tail = self._tail
        head = w[_HEAD]
        i = start
        while i < n_rec:
            recs = records[i:] if i else records
            lens = list(map(len, recs))
            k = len(lens)
            body = sum(lens)
            need = (FRAME_HDR + 4 * k + body + 7) & ~7
            free = cap - (tail - head)
            off = tail & self._mask
            room = cap - off
            if need > room or need > free:                 # slow path: wrap and/or write a prefix
                if FRAME_HDR + 4 + lens[0] > cap:
                    raise RingError(f"record of {lens[0]} bytes can never fit a {cap}-byte ring")
                if need > room and free >= room and (need <= free - room or _fit(lens, room) == 0):
                    w[(DATA_OFF + off) >> 3] = SKIP          # skip the tail: frames are never split
                    tail += room
                    free -= room
                    off, room = 0, cap
                k = _fit(lens, min(room, free))
                if k == 0:
                    break
                if k < len(lens):
                    recs, lens = recs[:k], lens[:k]
                    body = sum(lens)
                    need = (FRAME_HDR + 4 * k + body + 7) & ~7
            pos = DATA_OFF + off
            w[pos >> 3] = FRAME_HDR + 4 * k + body
            w[(pos >> 3) + 1] = k
            _lens_struct(k).pack_into(b, pos + FRAME_HDR, *lens)
            p = pos + FRAME_HDR + 4 * k
            b[p:p + body] = recs[0] if k == 1 else b"".join(recs)
            tail += need
            i += k
        if tail != self._tail:
            self._tail = tail
            w[_TAIL] = tail                              # publish: one store per batch
            if wake:
                full_fence()
                self._ring_peer()
        return i

    def _writing(self, records: Sequence[bytes | bytearray | memoryview],
                 timeout: float | None) -> Iterator[float | None]:
        """The write loop shared by write() and awrite(): yields how long to sleep for space."""
        deadline = None if timeout is None else time.monotonic() + timeout
        i = self.try_write(records)
        while i < len(records):
            self._set_waiting(1)
            full_fence()
            try:
                i = self.try_write(records, i)
                if i < len(records):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise RingTimeout(i)
                    yield left
            finally:
                self._set_waiting(0)

    def write(self, records: Sequence[bytes | bytearray | memoryview], timeout: float | None = None) -> None:
        """Blocking write of the whole batch; waits for space (RingTimeout after `timeout`)."""
        for left in self._writing(records, timeout):
            self.bell.wait_blocking(left)

    async def awrite(self, records: Sequence[bytes | bytearray | memoryview], timeout: float | None = None) -> None:
        """The asyncio twin of write(): the loop keeps running while the ring is full."""
        for left in self._writing(records, timeout):
            await self.bell.wait(left)

    # ---- consumer -----------------------------------------------------------------------------------
    def readable(self) -> bool:
        return self._w[_TAIL] != self._pending

    @property
    def cursor(self) -> int:
        """The consumer's read position: everything before it was returned by read()."""
        return self._pending

    def read(self, upto: int | None = None) -> list[memoryview]:
        """Every record published since the last read, in order.

        The views point into the ring: use them, then call release(); after release the
        producer may overwrite them. upto (a cursor value seen earlier): read only up to there,
        records of a producer that died meanwhile included (a resumed consumer finishing what
        its predecessor had started).
        """
        b, w = self._buf, self._w
        tail = w[_TAIL]                                  # tail first, then the epoch (see module doc)
        pe = w[_PEPOCH]
        head = self._pending
        if upto is not None:
            tail = min(tail, upto)
        elif pe != self._seen_pepoch:
            self._seen_pepoch = pe
            start = w[_PSTART]
            if head < start:
                head = start                             # a dead producer's records: drop them
        mask, cap = self._mask, self.capacity
        out: list[memoryview] = []
        append = out.append
        while head < tail:
            off = head & mask
            pos = DATA_OFF + off
            size = w[pos >> 3]
            if size == SKIP:                              # (may sit in the last 8 bytes)
                head += cap - off
                continue
            k = w[(pos >> 3) + 1]
            if not FRAME_HDR + 4 * k <= size <= cap - off or k <= 0:
                raise RingError(f"{self.path}: corrupt frame (size {size}, count {k}) at position {head}")
            p = pos + FRAME_HDR + 4 * k
            for n in _lens_struct(k).unpack_from(b, pos + FRAME_HDR):
                append(b[p:p + n])
                p += n
            head += (size + 7) & ~7
        self._pending = head
        return out

    def release(self) -> None:
        """Give the space of everything read so far back to the producer (one store, maybe one wake)."""
        if self._pending != self._head:
            self._head = self._pending
            self._w[_HEAD] = self._head
            full_fence()
            self._ring_peer()

    async def wait_readable(self, timeout: float | None = None) -> bool:
        return await wait_any((self,), self.bell, timeout)

    def wait_readable_blocking(self, timeout: float | None = None) -> bool:
        for left in _sleeps((self,), timeout):
            self.bell.wait_blocking(left)
        return self.readable()

    # ---- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        if self._peer_bell_fd >= 0:
            os.close(self._peer_bell_fd)
            self._peer_bell_fd = -1
        if self._own_bell:
            self.bell.close()
        self._w.release()
        self._buf.release()
        try:
            self._mm.close()
        except BufferError:
            pass  # views from read() are still alive; the mapping goes when they do


def _sleeps(rings: Sequence[Ring], timeout: float | None,
            ready: Callable[[], bool] | None = None) -> Iterator[float | None]:
    """The consumer's side of the wake-up protocol: yields how long to sleep until a ring has data.

    Flag 'waiting' on every ring, fence, re-check, and only then sleep; the flags are cleared after
    each sleep. A stale ring of the doorbell (from a batch already drained) costs one more turn.
    `ready` is one more wake-up condition, for peers that ring the doorbell about something else
    (a published position): it is checked after the fence, like the rings.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while not any(r.readable() for r in rings) and not (ready is not None and ready()):
        for r in rings:
            r._set_waiting(1)
        full_fence()
        try:
            if any(r.readable() for r in rings) or (ready is not None and ready()):
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            yield left
        finally:
            for r in rings:
                r._set_waiting(0)


async def wait_any(rings: Sequence[Ring], bell: Doorbell, timeout: float | None = None,
                   ready: Callable[[], bool] | None = None) -> bool:
    """Sleep until any of `rings` (consumer sides sharing `bell`) has data, or `ready()` holds.
    False on timeout.

    Call it only after draining and releasing every ring: that is the 'drain before sleep' rule.
    """
    for left in _sleeps(rings, timeout, ready):
        await bell.wait(left)
    return any(r.readable() for r in rings) or (ready is not None and ready())
