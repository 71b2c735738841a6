"""multiprocessing's helper processes of a node: the fork server and the resource tracker.

Both are children of the supervisor, as its actors are (of the fork server), and a kill -9 may
take either. multiprocessing starts a lost one again only lazily: the next actor start finds the
fork server dead, starts a new one and waits for it to import the preloaded modules; the resource
tracker is probed the same way. The supervisor instead watches both (a pidfd each, in its select)
and replaces a lost one at once, the fork server warmed up (one throwaway process forked through
it, so it has imported everything before an actor needs it).

CPython gives no public name for the two pids: `_forkserver._forkserver_pid` and
`_resource_tracker._pid` are read here and nowhere else.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing.forkserver
import os
import select
import signal
import time
import warnings
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make the orphans of this process's descendants its children (prctl), not init's: the
    actors of a lost fork server stay in the node's process tree and their exit status comes to
    the supervisor (init may leave them zombies for seconds)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("cannot become a child subreaper: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


def pidfd(pid: int) -> int:
    """A descriptor that turns readable when process pid exits (-1 when it is already gone)."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return -1


def exited(fd: int) -> bool:
    return fd < 0 or bool(select.select([fd], [], [], 0)[0])


def exit_status(pid: int) -> str:
    """How a child of this process ended, without reaping it (multiprocessing does that)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return "is gone"
    if info is None:
        return "is gone"
    if info.si_code == os.CLD_EXITED:
        return f"exited with status {info.si_status}"
    return f"was killed by {signal.Signals(info.si_status).name}"


def _warm() -> None:
    """The throwaway process forked through a new fork server."""


@dataclass
class Helper:
    name: str
    pid: int = 0
    fd: int = -1


class Helpers:
    """The node's helper processes, watched and replaced (start_method forkserver: both, spawn:
    the resource tracker only)."""

    def __init__(self, ctx: Any, forkserver: bool) -> None:
        self.ctx = ctx
        self.tracker = Helper("resource tracker")
        self.forkserver = Helper("fork server") if forkserver else None

    @property
    def watched(self) -> list[Helper]:
        return [self.tracker] + ([self.forkserver] if self.forkserver else [])

    def fds(self) -> list[int]:
        return [h.fd for h in self.watched if h.fd >= 0]

    def ensure(self) -> None:
        """Start whichever helper is not running (SIGTERM ignored, kept across its exec: a SIGTERM
        to the whole process group must not take the fork server, which reports the actors' exit
        statuses), and watch the ones that are new."""
        old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            with warnings.catch_warnings():          # "resource_tracker: process died unexpectedly": logged here
                warnings.simplefilter("ignore")
                if self.forkserver is not None:
                    multiprocessing.forkserver.ensure_running()      # the tracker too
                else:
                    resource_tracker.ensure_running()
        finally:
            signal.signal(signal.SIGTERM, old)
        tracker_pid = resource_tracker._resource_tracker._pid  # type: ignore[attr-defined]  # no public pid
        self._watch(self.tracker, tracker_pid)
        if self.forkserver is not None:
            pid = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]  # no public pid
            self._watch(self.forkserver, pid)

    def _watch(self, h: Helper, pid: int | None) -> None:
        if not pid or pid == h.pid:
            return
        replaced = h.pid != 0
        self._close(h)
        h.pid, h.fd = pid, pidfd(pid)
        if not replaced:            # the first: the first actor start waits for its preload anyway
            return
        if h is self.forkserver:
            t0 = time.monotonic()
            warm = self.ctx.Process(target=_warm, name="smartgo-forkserver-warm-up")
            try:
                warm.start()        # returns once the fork server has preloaded and forked it
                warm.join()
                warm.close()
            except (OSError, EOFError) as e:     # lost again: the next actor start tries once more
                log.error("new %s (pid %d) failed its warm-up: %r", h.name, pid, e)
                return
            log.warning("new %s (pid %d) ready in %.3fs", h.name, pid, time.monotonic() - t0)
        else:
            log.warning("new %s (pid %d)", h.name, pid)

    def lost(self, ready: set[int]) -> bool:
        """Log each helper whose pidfd turned readable (it exited) and stop watching it; True if any
        (ensure() then starts a new one)."""
        gone = [h for h in self.watched if h.fd in ready]
        for h in gone:
            log.error("%s (pid %d) %s; starting a new one", h.name, h.pid, exit_status(h.pid))
            self._close(h)
        return bool(gone)

    def pids(self) -> dict[str, int]:
        """Board values: the pid of each helper, 0 while it is being replaced, -1 when not used."""
        def pid(h: Helper | None) -> int:
            return -1 if h is None else h.pid if h.fd >= 0 else 0
        return {"node.forkserver_pid": pid(self.forkserver), "node.tracker_pid": pid(self.tracker)}

    @staticmethod
    def _close(h: Helper) -> None:
        if h.fd >= 0:
            os.close(h.fd)
        h.fd = -1

    def close(self) -> None:
        for h in self.watched:
            self._close(h)
