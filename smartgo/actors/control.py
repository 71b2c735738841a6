"""The control pipe between the supervisor and one actor: msgpack objects over two OS pipes.

Down (supervisor -> actor): peer notices. The supervisor writes non-blocking and messages stay
under PIPE_BUF, so each write is atomic: a hung actor that stops reading costs a dropped notice
(it is about to be killed for its stale heartbeat anyway), never a blocked supervisor.
Up (actor -> supervisor): "ready" and log records. The actor writes blocking under a lock
(log calls may come from any thread); the supervisor drains its pipes every loop turn.

msgpack objects delimit themselves, so the stream needs no framing: the reader feeds what it
read into an Unpacker and takes out whole messages. EOF on the down pipe tells an actor that its
supervisor is gone (it then stops itself); EOF on the up pipe is the actor's exit.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing.connection as mpc
import multiprocessing.context
import os
import select
import threading
from collections.abc import Callable

import msgpack

log = logging.getLogger(__name__)

PIPE_BUF = select.PIPE_BUF
_READ = 65536


def make_pipes(ctx: multiprocessing.context.BaseContext) -> tuple[ParentEnd, tuple[mpc.Connection, mpc.Connection]]:
    """The supervisor's end and the two Connections to hand to the child process."""
    down_r, down_w = ctx.Pipe(duplex=False)
    up_r, up_w = ctx.Pipe(duplex=False)
    return ParentEnd(up_r, down_w), (down_r, up_w)


class ParentEnd:
    """Supervisor side: poll-driven reads, non-blocking atomic writes."""

    def __init__(self, up: mpc.Connection, down: mpc.Connection) -> None:
        self._up, self._down = up, down
        self.fd = up.fileno()
        os.set_blocking(self.fd, False)
        os.set_blocking(down.fileno(), False)
        self._unpacker = msgpack.Unpacker()
        self.closed = False

    def receive(self) -> list[dict] | None:
        """Whole messages available now; None once the actor closed its end (it exited)."""
        try:
            data = os.read(self.fd, _READ)
        except BlockingIOError:
            return []
        if not data:
            return None
        self._unpacker.feed(data)
        try:
            return [m for m in self._unpacker if isinstance(m, dict)]
        except ValueError as e:        # msgpack's format errors: the stream is lost, like EOF
            log.error("garbled control stream (%s): closing it", e)
            return None

    def send(self, msg: dict) -> bool:
        """Best effort: False when the actor is not reading (pipe full) or gone."""
        raw = msgpack.packb(msg)
        if len(raw) > PIPE_BUF:
            raise ValueError(f"control message of {len(raw)} bytes exceeds PIPE_BUF ({PIPE_BUF})")
        try:
            os.write(self._down.fileno(), raw)
            return True
        except (BlockingIOError, BrokenPipeError):
            return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._up.close()
            self._down.close()


class ChildEnd:
    """Actor side: asyncio reads of the down pipe, locked blocking writes up."""

    def __init__(self, down: mpc.Connection, up: mpc.Connection) -> None:
        self._down, self._up = down, up
        self._lock = threading.Lock()
        self._unpacker = msgpack.Unpacker()
        self.gone = False

    def send(self, msg: dict) -> None:
        if self.gone:
            return
        raw = msgpack.packb(msg)
        fd = self._up.fileno()
        with self._lock:
            try:
                view = memoryview(raw)
                while view:
                    view = view[os.write(fd, view):]
            except (BrokenPipeError, OSError):
                self.gone = True

    def listen(self, loop: asyncio.AbstractEventLoop, on_message: Callable[[dict], None],
               on_eof: Callable[[], None]) -> None:
        fd = self._down.fileno()
        os.set_blocking(fd, False)

        def readable() -> None:
            try:
                data = os.read(fd, _READ)
            except BlockingIOError:
                return
            if not data:
                loop.remove_reader(fd)
                self.gone = True
                on_eof()
                return
            self._unpacker.feed(data)
            for m in self._unpacker:
                if isinstance(m, dict):
                    on_message(m)

        loop.add_reader(fd, readable)


class ForwardingHandler(logging.Handler):
    """Sends an actor's log records up the control pipe; the supervisor writes the node log."""

    def __init__(self, end: ChildEnd) -> None:
        super().__init__()
        self.end = end
        self.setFormatter(logging.Formatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fmt = self.formatter or logging.Formatter()  # set in __init__
            exc = fmt.formatException(record.exc_info) if record.exc_info else record.exc_text
            self.end.send({"op": "log", "name": record.name, "level": record.levelno,
                           "msg": record.getMessage(), "created": record.created, "exc": exc})
        except Exception:
            self.handleError(record)
