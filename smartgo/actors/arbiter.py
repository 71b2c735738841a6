"""The supervisor: one small loop (gunicorn's arbiter) over the actor processes of one node.

Each turn of the loop: wait (select) on the signal wake-up pipe, every actor's control pipe and
every process sentinel, at most TICK seconds; then handle signals, read control messages
(ready, log records), reap exited actors (restart one-for-one with exponential backoff), kill
actors whose heartbeat is older than their deadline, spawn actors whose backoff ran out and
whose dependencies are ready, and publish the supervisor's own heartbeat on the board.

Escalation (OTP supervisor semantics): more than max_restarts restarts of one actor inside
restart_window -> stop every actor, run the role's recovery hook, start the node again; more
than max_node_restarts node restarts inside node_restart_window -> exit status 1.

Stop (SIGTERM/SIGINT): no more restarts; actors get SIGTERM layer by layer in reverse start
order (net actors stop accepting and drain before commit, commit before flush...), each layer
waited for, all within shutdown_timeout; what is left then is killed, unless its progress counter
still moves (up to a second shutdown_timeout). A second signal kills everything at once.
"""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import logging
import multiprocessing
import os
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smartgo import accel
from smartgo.actors.actor import actor_main, recovery_main
from smartgo.actors.board import (NO_EXIT, NODE_FIELDS, SUPERVISOR, Board, BoardLayout, NodeState, SupState,
                                  monotonic_ns)
from smartgo.actors.control import ParentEnd, make_pipes
from smartgo.actors.helpers import Helpers, become_subreaper, exited, pidfd
from smartgo.actors.logs import emit_forwarded, remove_handlers, setup_node_logging
from smartgo.actors.role import Role, node_actors
from smartgo.actors.spec import PERMANENT, TEMPORARY, ActorSpec, SpecError, start_layers
from smartgo.actors.watchdog import Verdict, Watchdog, crowded
from smartgo.config import NodeConfig
from smartgo.cpus import usable_cpus

log = logging.getLogger(__name__)

TICK = 0.05           # the loop turns at least this often: heartbeat checks, the node heartbeat
STOPPED, RESTART, KILLED = "stopped", "restart", "killed"
LOST_STATUS = 255     # multiprocessing's exit code for a process whose fork server died before reporting it
_PEERCRED = struct.Struct("3i")      # struct ucred: pid, uid, gid


class StartupError(Exception):
    """The node cannot start at all (store dir locked, unwritable run dir, a port another node shares)."""


def _holder(name: str) -> str:
    """The pid of the process listening on the abstract UNIX socket name, or "?"."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(name)
            return str(_PEERCRED.unpack(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[0])
    except OSError:
        return "?"


@dataclass(eq=False)
class Child:
    """The supervisor's record of one actor (or of the one-shot recovery process: slot -1)."""
    spec: ActorSpec
    slot: int
    deadline: float
    state: int = SupState.PENDING
    proc: Any = None
    end: ParentEnd | None = None
    incarnation: int = 0
    restarts: int = 0
    recent: deque = field(default_factory=deque)   # monotonic times of recent restarts
    start_at: float = 0.0
    spawned_at: float = 0.0
    last_exit: int = NO_EXIT
    pid: int = 0
    kill_reason: str = ""
    pidfd: int = -1                 # readable once the process exits, whoever its parent is
    adopted: bool = False           # its fork server died: watched through pidfd, reaped by the supervisor

    @property
    def exit_fd(self) -> int:
        """What the loop selects on for this process's exit: the fork server's status pipe
        (multiprocessing's sentinel) while the fork server that reports it lives, else the pidfd."""
        return self.pidfd if self.adopted else self.proc.sentinel

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def alive(self) -> bool:
        return self.proc is not None


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "vanished"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class Arbiter:
    def __init__(self, config: NodeConfig, role: Role) -> None:
        self.base_config = config
        self.role = role
        self._configure()
        for path in [s.cls for s in self.specs] + ([role.recover] if role.recover else []):
            module = path.partition(":")[0]
            if importlib.util.find_spec(module) is None:     # find, don't import: that is the children's job
                raise SpecError(f"no module {module!r} (from {path!r})")
        self.ctx = multiprocessing.get_context(config.start_method)
        self.helpers = Helpers(self.ctx, config.start_method == "forkserver")
        self.board: Board | None = None
        self.children: list[Child] = []
        self.oneshot: Child | None = None
        self.node_restarts = 0
        self._signals: list[int] = []
        self._sig_r = self._sig_w = -1
        self._stopping = False      # a stop signal arrived
        self._hard = False          # a second one arrived
        self._draining = False      # stopping actors (for a stop or a node restart)
        self._failure = ""          # why the node must restart
        self._asked = False         # an actor asked for that restart (a role change): not a failure
        self._lock_fd = -1
        self._port_claims: list[socket.socket] = []
        self._fields: dict[str, Any] = {}
        self.watchdog = Watchdog(config.heartbeat_busy_limit)
        self._ready = False         # every actor ready, and said so (the "node ready" line)
        self._ready_once = False    # said at least once since the supervisor started
        self._unready_since = time.monotonic()

    # ---- entry point ------------------------------------------------------------------------------
    def run(self) -> int:
        """Run the node until stopped; the exit status of the supervisor."""
        handlers = setup_node_logging(self.config)
        try:
            self._lock_store()
            self._lock_ports()
            raise_open_files_limit()
            become_subreaper()
            self._install_signals()
            if self.config.start_method == "forkserver":
                mods = {"smartgo.actors.actor", "smartgo.actors.helpers"}
                mods |= {s.cls.partition(":")[0] for s in self.specs}
                self.ctx.set_forkserver_preload(sorted(mods))
            log.info("node starting: role %s, store %s, %d actors, C accelerators %s", self.config.role,
                     self.config.store_path, len(self.specs), _accelerators())
            return self._run_nodes()
        except StartupError as e:
            log.error("cannot start: %s", e)
            return 1
        except BaseException:
            log.critical("supervisor failed; killing every actor", exc_info=True)
            self._kill_all()
            raise
        finally:
            self._restore_signals()
            if self.board is not None:
                self.board.close()
            self.helpers.close()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
            for claim in self._port_claims:
                claim.close()
            remove_handlers(handlers)

    def _run_nodes(self) -> int:
        recent: deque[float] = deque()
        while True:
            outcome = self._run_node()
            if outcome == STOPPED:
                log.info("node stopped")
                self._set("node.state", NodeState.STOPPED)
                return 0
            if outcome == KILLED:
                log.warning("node killed")
                self._set("node.state", NodeState.STOPPED)
                return 1
            if self._asked:
                self.node_restarts += 1
                log.warning("restarting the node: %s", self._failure)
                continue
            now = time.monotonic()
            recent.append(now)
            while recent and now - recent[0] > self.config.node_restart_window:
                recent.popleft()
            if len(recent) > self.config.max_node_restarts:
                log.critical("giving up: %s, and the node has already been restarted %d times in %gs "
                             "(max_node_restarts = %d); exiting with status 1", self._failure, len(recent) - 1,
                             self.config.node_restart_window, self.config.max_node_restarts)
                self._set("node.state", NodeState.FAILED)
                return 1
            self.node_restarts += 1
            log.warning("restarting the node (%d of at most %d in %gs): %s", len(recent),
                        self.config.max_node_restarts, self.config.node_restart_window, self._failure)

    # ---- one life of the node ------------------------------------------------------------------------
    def _configure(self) -> None:
        """The actors of the next node life: the role's configure hook may change the role itself."""
        self.config = self.role.configure(self.base_config)
        self.specs = node_actors(self.config, self.role)
        self.layers = start_layers(self.specs)

    def _run_node(self) -> str:
        self._failure = ""
        self._asked = False
        self._draining = False
        self._note_readiness(False)
        if self.node_restarts:
            self._configure()
        board = self._create_board()
        cpus = usable_cpus()
        stretch = crowded(1.0, len(self.specs), cpus)
        self.children = [Child(spec, i, stretch * (spec.heartbeat_deadline or self.config.heartbeat_deadline))
                         for i, spec in enumerate(self.specs)]
        if stretch > 1.0:
            log.info("%d actors on %d CPUs: heartbeat deadlines stretched x%.1f", len(self.specs), cpus, stretch)
        for c in self.children:
            board.name_slot(c.slot, c.name)
            self._publish(c)
        if self.role.recover and not self._recover():
            if self._stopping or self._hard:
                return KILLED if self._hard else STOPPED
            self._failure = self._failure or "recovery failed"
            return RESTART
        self._set("node.state", NodeState.STARTING)
        while True:
            self._turn()
            if self._hard:
                self._kill_all()
                return KILLED
            if self._stopping:
                log.info("stopping the node")
                return self._shutdown() or STOPPED
            if self._failure:
                self._set("node.state", NodeState.RESTARTING)
                return self._shutdown() or (STOPPED if self._stopping else RESTART)

    def _turn(self) -> None:
        """One turn of the loop (see the module doc)."""
        now = time.monotonic()
        watched = [c for c in self._watched() if c.alive]
        fds = [self._sig_r]
        for c in watched:
            fds.append(c.exit_fd)
            if c.end is not None:
                fds.append(c.end.fd)
        fds += self.helpers.fds()
        timeout = TICK
        if not self._draining and self.oneshot is None:
            for c in self._startable():
                timeout = min(timeout, max(0.0, c.start_at - now))
        ready = set(select.select(fds, [], [], timeout)[0])
        self._read_signals()
        for c in watched:
            if c.end is not None and c.end.fd in ready:
                self._read_control(c)
        for c in watched:
            if c.exit_fd in ready:
                self._reaped(c)
        if self.helpers.lost(ready):
            self._publish_helpers()
            if not self._draining and not self._stopping:      # else the next spawn starts them
                self._ensure_helpers()
        if not self._draining and not self._stopping:
            self._check_heartbeats()
            if self.oneshot is None:            # no actor starts while the recovery hook runs
                self._start_due()
        self._set("node.heartbeat_ns", monotonic_ns())
        if not self._draining and not self.oneshot:
            all_ready = all(c.state in (SupState.READY, SupState.STOPPED) for c in self.children)
            self._set("node.state", NodeState.RUNNING if all_ready else NodeState.STARTING)
            self._note_readiness(all_ready)

    def _note_readiness(self, all_ready: bool) -> None:
        """Log the line an operator or a script waits on when every actor is ready: "node ready"
        once per start, "node ready again" after each degradation (an actor or node restart)."""
        if all_ready == self._ready:
            return
        self._ready = all_ready
        now = time.monotonic()
        if not all_ready:
            self._unready_since = now
            return
        ports = " ".join(f"{what}={port}" for what, port in self.role.ports(self.config))
        line = f"role={self.config.role} store={self.config.store_path} {ports}".rstrip()
        if self._ready_once:
            log.info("node ready again: %s (%.3fs after it degraded)", line, now - self._unready_since)
        else:
            log.info("node ready: %s (%.3fs after start)", line, now - self._unready_since)
        self._ready_once = True

    def _watched(self) -> list[Child]:
        return self.children + ([self.oneshot] if self.oneshot else [])

    # ---- spawning -----------------------------------------------------------------------------------
    def _startable(self) -> list[Child]:
        """Actors waiting to (re)start whose dependencies are all ready (their backoff may still run)."""
        ready = {c.name for c in self.children if c.state == SupState.READY}
        return [c for c in self.children if c.state in (SupState.PENDING, SupState.BACKOFF)
                and all(d in ready for d in c.spec.after)]

    def _start_due(self) -> None:
        now = time.monotonic()
        for c in self._startable():
            if now >= c.start_at:
                self._spawn(c, actor_main, (c.spec.to_dict(), self.config.to_dict(), c.slot, c.incarnation + 1))

    def _spawn(self, c: Child, target: Any, args: tuple) -> None:
        self._ensure_helpers()
        end, (down, up) = make_pipes(self.ctx)
        proc = self.ctx.Process(  # type: ignore[attr-defined]  # every start method's context has Process
            target=target, args=(*args, down, up), name=f"smartgo-{c.name}")
        c.incarnation += 1
        try:
            proc.start()
        except OSError as e:
            end.close()
            log.error("cannot start actor %s: %s", c.name, e)
            self._crashed(c, f"could not be started ({e})")
            return
        finally:
            down.close()   # the child has its own copies; ours would hide its EOF
            up.close()
        c.proc, c.end, c.pid = proc, end, proc.pid
        # a fork server's actor outlives it: then its pidfd tells its exit (spawn: the supervisor is the parent)
        c.pidfd, c.adopted = pidfd(c.pid) if self.helpers.forkserver else -1, False
        c.state = SupState.SPAWNED
        c.spawned_at = time.monotonic()
        c.kill_reason = ""
        log.info("started %s (pid %d, incarnation %d)", c.name, c.pid, c.incarnation)
        self._publish(c)

    def _ensure_helpers(self) -> None:
        """Start the fork server and the resource tracker if they are not running (helpers.py)."""
        self.helpers.ensure()
        self._publish_helpers()

    def _publish_helpers(self) -> None:
        for name, pid in self.helpers.pids().items():
            self._set(name, pid)

    # ---- control messages -----------------------------------------------------------------------------
    def _read_control(self, c: Child) -> None:
        msgs = c.end.receive()  # type: ignore[union-attr]  # called for children with an open end only
        if msgs is None:
            c.end.close()  # type: ignore[union-attr]  # as above
            c.end = None
            return
        for m in msgs:
            op = m.get("op")
            if op == "log":
                emit_forwarded(m, c.name, c.pid)
            elif op == "restart" and not self._failure:
                self._failure, self._asked = f"{c.name} asked: {m.get('reason')}", True
            elif op == "ready" and c.state == SupState.SPAWNED:
                c.state = SupState.READY
                log.info("%s ready (pid %d, %.3fs after spawn)", c.name, c.pid, time.monotonic() - c.spawned_at)
                self._publish(c)
                self._broadcast({"op": "peer_up", "name": c.name, "pid": c.pid, "incarnation": c.incarnation}, c)

    def _broadcast(self, msg: dict, source: Child) -> None:
        for other in self.children:
            if other is not source and other.end is not None and other.state == SupState.READY:
                if not other.end.send(msg):
                    log.warning("%s (pid %d) is not reading its control pipe", other.name, other.pid)

    # ---- exits and restarts --------------------------------------------------------------------------
    def _reaped(self, c: Child) -> None:
        if not c.adopted and c.pidfd >= 0 and not exited(c.pidfd):
            c.adopted = True                         # its fork server died, not the actor
            log.info("actor %s (pid %d) lost its fork server and runs on; watching it directly", c.name, c.pid)
            return
        if c.end is not None:                        # last words: log records still in the pipe
            while msgs := c.end.receive():
                for m in msgs:
                    if m.get("op") == "log":
                        emit_forwarded(m, c.name, c.pid)
            c.end.close()
            c.end = None
        code = self._exit_code(c)
        if c.proc.exitcode is not None:
            c.proc.close()
        c.proc = None
        if c.pidfd >= 0:
            os.close(c.pidfd)
            c.pidfd = -1
        else:
            self._ensure_gone(c)                     # no pidfd told that it exited
        c.last_exit = code if code is not None else NO_EXIT
        if c is self.oneshot:
            return
        if c.state == SupState.STOPPING or self._draining or self._stopping:
            c.state = SupState.STOPPED
            log.info("%s (pid %d) %s", c.name, c.pid, _describe_exit(code))
            self._publish(c)
            return
        self._crashed(c, c.kill_reason or _describe_exit(code))
        self._broadcast({"op": "peer_down", "name": c.name, "pid": c.pid, "exit": c.last_exit}, c)

    @staticmethod
    def _exit_code(c: Child) -> int | None:
        """The exit code; an actor whose fork server died is the supervisor's child (a child
        subreaper) and reaped here, its status lost (None) if that failed."""
        c.proc.join(0.1)
        code = c.proc.exitcode
        if c.adopted or code == LOST_STATUS:
            try:
                pid, status = os.waitpid(c.pid, os.WNOHANG)
            except ChildProcessError:
                return None if c.adopted else code
            if pid:
                return os.waitstatus_to_exitcode(status)
        return code

    @staticmethod
    def _ensure_gone(c: Child) -> None:
        """Make sure an actor reported dead is dead: if its fork server died, its status was lost
        (reported as 255) while the process may run on; a restart must not run beside it."""
        try:
            os.kill(c.pid, 0)
        except ProcessLookupError:
            return
        log.warning("actor %s (pid %d) reported gone but still runs (fork server lost?): killing it", c.name, c.pid)
        try:
            os.kill(c.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        try:
            os.waitpid(c.pid, 0)                     # the supervisor's child now (a child subreaper)
            return
        except ChildProcessError:
            pass
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                os.kill(c.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.01)

    def _crashed(self, c: Child, reason: str) -> None:
        policy = c.spec.restart
        if policy == TEMPORARY or (policy != PERMANENT and c.last_exit == 0):
            log.warning("actor %s (pid %d) %s; not restarted (restart = %s)", c.name, c.pid, reason, policy)
            c.state = SupState.STOPPED
            self._publish(c)
            return
        now = time.monotonic()
        c.recent.append(now)
        while c.recent and now - c.recent[0] > self.config.restart_window:
            c.recent.popleft()
        c.restarts += 1
        if len(c.recent) > self.config.max_restarts:
            log.error("actor %s (pid %d) %s: restart intensity exceeded (%d restarts in %gs, max_restarts = %d)",
                      c.name, c.pid, reason, len(c.recent), self.config.restart_window, self.config.max_restarts)
            self._failure = f"actor {c.name} exceeded its restart intensity ({reason})"
            c.state = SupState.FAILED
        else:
            delay = min(self.config.restart_backoff * 2 ** (len(c.recent) - 1), self.config.restart_backoff_max)
            log.error("actor %s (pid %d) %s; restarting in %.2fs (restart %d)", c.name, c.pid, reason, delay,
                      c.restarts)
            c.state = SupState.BACKOFF
            c.start_at = now + delay
        self._publish(c)

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        now_ns = monotonic_ns()
        for c in self.children:
            if not c.alive or c.kill_reason:
                continue
            if c.state == SupState.SPAWNED:
                # a start that counts progress (an MQTT actor reading 100,000 session records) goes on
                start_view = self.board.read_slot(c.slot)  # type: ignore[union-attr]  # created before any child
                working = start_view.current and self.watchdog.quiet(c.slot, start_view, now_ns) < c.deadline
                if now - c.spawned_at > self.config.start_timeout and not working:
                    self._kill(c, f"not ready {self.config.start_timeout:g}s after spawn (start_timeout), "
                                  f"no progress for {c.deadline:g}s")
            elif c.state == SupState.READY:
                view = self.board.read_slot(c.slot)  # type: ignore[union-attr]  # created before any child
                if not view.current:
                    continue
                verdict, why = self.watchdog.check(c.slot, view, c.deadline, now_ns)
                if verdict in (Verdict.HUNG, Verdict.OVERDUE):
                    self._kill(c, why)
                elif why:
                    level = logging.WARNING if verdict is Verdict.BUSY else logging.INFO
                    log.log(level, "actor %s (pid %d) %s", c.name, c.pid, why)

    def _kill(self, c: Child, reason: str) -> None:
        c.kill_reason = reason
        log.error("actor %s (pid %d) %s; killing it", c.name, c.pid, reason)
        try:
            os.kill(c.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # ---- stopping ----------------------------------------------------------------------------------
    def _shutdown(self) -> str | None:
        """Stop every actor in reverse start order within shutdown_timeout (more while they count progress);
        KILLED on a second signal."""
        self._draining = True
        if self._stopping:
            self._set("node.state", NodeState.STOPPING)
        deadline = time.monotonic() + self.config.shutdown_timeout
        overrun = deadline + self.config.shutdown_timeout
        told = False
        at_stop: dict[int, int] = {}        # slot -> its progress counter when told to stop
        for c in self.children:
            if not c.alive and c.state != SupState.FAILED:
                c.state = SupState.STOPPED
                self._publish(c)
        by_name = {c.name: c for c in self.children}
        for layer in reversed(self.layers):
            group = [by_name[s.name] for s in layer if by_name[s.name].alive]
            for c in group:
                c.state = SupState.STOPPING
                self._publish(c)
                at_stop[c.slot] = self.board.read_slot(c.slot).progress  # type: ignore[union-attr]  # made first
                log.info("stopping %s (pid %d)", c.name, c.pid)
                try:
                    os.kill(c.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                if c.end is not None:       # an actor just spawned may not handle SIGTERM yet: the pipe keeps this
                    c.end.send({"op": "stop"})
            while any(c.alive for c in group) and not self._hard:
                moving = self._stop_progressing(group, at_stop)
                now = time.monotonic()
                if now >= deadline and (now >= overrun or not moving):
                    break
                if now >= deadline and not told:
                    told = True
                    log.warning("shutdown_timeout (%gs) passed while %s still count progress: waiting for them as "
                                "long as it moves, up to %.1fs more", self.config.shutdown_timeout, ", ".join(moving),
                                overrun - now)
                self._turn()
            if self._hard:
                break
        if self._hard:
            log.warning("second signal: killing every actor now")
            self._kill_all()
            return KILLED
        left = [c for c in self.children if c.alive]
        if left:
            log.error("still running after shutdown_timeout (%gs): %s; killing them", self.config.shutdown_timeout,
                      ", ".join(f"{c.name} (pid {c.pid})" for c in left))
            self._kill_all()
        return None

    def _stop_progressing(self, group: list[Child], at_stop: Mapping[int, int]) -> list[str]:
        """The actors of a stopping layer whose progress counter moved since they were told to stop, last
        within their heartbeat deadline (the flush actor counts each queue its stop flushes): slow, not
        stuck, so past shutdown_timeout they get up to a second shutdown_timeout to finish a clean stop
        rather than SIGKILL and the abnormal recovery of the next start."""
        now_ns = monotonic_ns()
        moving = []
        for c in group:
            if c.alive:
                view = self.board.read_slot(c.slot)  # type: ignore[union-attr]  # created before any child
                quiet = self.watchdog.quiet(c.slot, view, now_ns)
                if view.current and view.progress != at_stop.get(c.slot) and quiet < c.deadline:
                    moving.append(c.name)
        return moving

    def _kill_all(self) -> None:
        self._draining = True
        for c in self._watched():
            if c.alive:
                try:
                    os.kill(c.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5.0
        while any(c.alive for c in self._watched()) and time.monotonic() < deadline:
            self._turn()

    # ---- recovery ----------------------------------------------------------------------------------
    def _recover(self) -> bool:
        """Run the role's recovery hook in a child process; True when it exited 0."""
        self._set("node.state", NodeState.RECOVERING)
        spec = ActorSpec("recovery", self.role.recover)  # type: ignore[arg-type]  # run only when set
        c = self.oneshot = Child(spec, -1, 0.0)
        log.info("running recovery %s", self.role.recover)
        self._spawn(c, recovery_main, (self.role.recover, self.config.to_dict()))
        deadline = time.monotonic() + self.config.recovery_timeout
        try:
            while c.alive:
                self._turn()
                if (self._stopping or self._hard or time.monotonic() > deadline) and not c.kill_reason:
                    why = "stop requested" if self._stopping or self._hard else \
                        f"recovery_timeout ({self.config.recovery_timeout:g}s)"
                    self._kill(c, f"interrupted: {why}")
                    self._failure = f"recovery {why}"
            if c.last_exit != 0:
                log.error("recovery %s %s", self.role.recover, c.kill_reason or _describe_exit(c.last_exit))
                self._failure = self._failure or f"recovery {_describe_exit(c.last_exit)}"
                return False
            log.info("recovery done")
            return True
        finally:
            self.oneshot = None

    # ---- board, lock, signals ---------------------------------------------------------------------------
    def _create_board(self) -> Board:
        run = self.config.run_path
        run.mkdir(parents=True, exist_ok=True)
        for sub in ("rings", "bells"):
            shutil.rmtree(run / sub, ignore_errors=True)
        layout = BoardLayout(fields=(*NODE_FIELDS, *self.role.board_fields(self.config)),
                             max_actors=max(self.config.board_max_actors, len(self.specs)),
                             queue_capacity=self._queue_capacity(),
                             meta={"role": self.config.role, "store_dir": str(self.config.store_path)})
        if self.board is not None:
            self.board.close()
        self.board = Board.create(self.config.board_path, layout)
        self._fields = {f.name: self.board.scalar(f.name, writer=SUPERVISOR) for f in NODE_FIELDS}
        self._set("node.pid", os.getpid())
        self._set("node.started_ns", time.time_ns())
        self._set("node.restarts", self.node_restarts)
        self._set("node.heartbeat_ns", monotonic_ns())
        self._publish_helpers()
        return self.board

    def _queue_capacity(self) -> int:
        """board_queue_capacity, or room for twice the store's queues within the 75% load limit
        when that is more: a node whose topics outgrew the table starts (and can grow) anyway."""
        demand = self.role.queue_demand(self.config)
        capacity = max(self.config.board_queue_capacity, demand * 8 // 3)
        if capacity > self.config.board_queue_capacity:
            log.info("the board's queue table is sized for %d entries (board_queue_capacity %d): the store has "
                     "%d queues", capacity, self.config.board_queue_capacity, demand)
        return capacity

    def _set(self, name: str, value: int) -> None:
        if name in self._fields:
            self._fields[name].set(value)

    def _publish(self, c: Child) -> None:
        if c.slot >= 0 and self.board is not None:
            self.board.write_supervised(
                c.slot, pid=c.pid if c.alive else 0, incarnation=c.incarnation, restarts=c.restarts,
                sup_state=c.state, deadline_ns=int(c.deadline * 1e9),
                spawned_ns=int(c.spawned_at * 1e9), last_exit=c.last_exit)

    def _lock_store(self) -> None:
        run = self.config.run_path
        try:
            run.mkdir(parents=True, exist_ok=True)
            fd = os.open(run / "supervisor.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise StartupError(f"cannot use run dir {run}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StartupError(f"another supervisor (pid {other}) is running on {self.config.store_path}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _lock_ports(self) -> None:
        """Claim each port the role's actors share through SO_REUSEPORT: the kernel would let a
        second node of this user bind it too and take half the connections. The claim is an
        abstract UNIX socket named after the user and port (no file; it goes with the process, and
        lives in the network namespace, as the port does), listening so that a contender can ask
        for the holder's pid (SO_PEERCRED)."""
        for port in self.role.shared_ports(self.config):
            name = f"\0smartgo-{os.getuid()}-port-{port}"
            claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                claim.bind(name)
                claim.listen(1)
            except OSError as e:
                claim.close()
                if e.errno != errno.EADDRINUSE:
                    raise StartupError(f"cannot claim port {port}: {e.strerror}") from None
                raise StartupError(f"port {port}: address already in use by another SmartGo node (supervisor pid "
                                   f"{_holder(name)}); its net actors share the port, so this node would take half "
                                   "of its connections") from None
            self._port_claims.append(claim)

    def _install_signals(self) -> None:
        self._sig_r, self._sig_w = os.pipe()
        for fd in (self._sig_r, self._sig_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        signal.set_wakeup_fd(self._sig_w)
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self._on_signal)

    def _restore_signals(self) -> None:
        if self._sig_r >= 0:
            signal.set_wakeup_fd(-1)
            for s in (signal.SIGTERM, signal.SIGINT):
                signal.signal(s, signal.SIG_DFL)
            os.close(self._sig_r)
            os.close(self._sig_w)
            self._sig_r = self._sig_w = -1

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)

    def _read_signals(self) -> None:
        try:
            while os.read(self._sig_r, 512):
                pass
        except BlockingIOError:
            pass
        while self._signals:
            name = signal.Signals(self._signals.pop(0)).name
            if self._stopping:
                log.warning("received %s again: stopping at once", name)
                self._hard = True
            else:
                log.info("received %s: stopping gracefully (send it again to stop at once)", name)
                self._stopping = True


OPEN_FILES_LOW = 4096  # below this, actors keep fewer ConsumeQueue files mapped than mapped_queue_files


def raise_open_files_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit, for every actor to inherit; returns the soft limit.

    Every mapped CommitLog, ConsumeQueue and index file holds a descriptor (CPython's mmap keeps
    a dup of the file's). Actors map at most so many ConsumeQueue files and fewer under a low limit
    (smartgo.broker.settings.mapped_queue_files); a higher limit lets more stay mapped."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
    if soft != resource.RLIM_INFINITY and soft < OPEN_FILES_LOW:
        log.warning("open files limit %d: each mapped CommitLog, ConsumeQueue and index file takes one, so "
                    "actors keep fewer ConsumeQueue files mapped and map them again more often (raise the hard "
                    "limit: ulimit -Hn, systemd LimitNOFILE=)", soft)
    else:
        log.info("open files limit %d", soft)
    return soft


def main(roles: Mapping[str, Role], argv: list[str] | None = None) -> int:
    """`python supervisor.py ...`: parse flags and config, run the node of one of `roles`."""
    import argparse

    from smartgo.config import ConfigError, add_arguments, from_namespace

    parser = argparse.ArgumentParser(
        prog="supervisor.py", description="Run one SmartGo node: the role's actors under a supervisor.",
        epilog="Exit status: 0 after a clean stop; 1 when the node gave up (an actor kept failing across "
               "node restarts), could not start, or was stopped by a second signal; 2 for bad settings.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = from_namespace(args)
        role = roles.get(config.role)
        if role is None:
            raise ConfigError(f"unknown role {config.role!r} (roles: {', '.join(roles)})")
        arbiter = Arbiter(config.resolved(role.default_port), role)
    except (ConfigError, SpecError) as e:
        print(f"supervisor.py: error: {e}", file=sys.stderr)
        return 2
    return arbiter.run()


def _accelerators() -> str:
    """Which C accelerators the actors run (they inherit this process's SMARTGO_PURE_PYTHON)."""
    used = accel.in_use()
    return ", ".join(name for name, on in used.items() if on) or "none (pure Python)"
