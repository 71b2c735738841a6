"""Health of a node, assembled from its board (and psutil for CPU and memory).

node_health() returns plain data (JSON-ready): `smartgo health --store-dir` prints it, and the
broker's GET_BROKER_RUNTIME_INFO will put the same dict on the wire. A node is healthy when its
supervisor is alive and turning, the node is running, and every actor it expects is ready,
running as the process the supervisor spawned, and heartbeating within its deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import psutil

from smartgo.actors.board import ActorState, Board, NodeState, SlotView, SupState, monotonic_ns

SUPERVISOR_STALE_S = 5.0   # the supervisor's loop turns every 50 ms; this long without a turn: stuck


@dataclass
class CpuSampler:
    """CPU % per process between calls (psutil needs two samples); keep one per caller."""
    _procs: dict[int, psutil.Process] = field(default_factory=dict)

    def process(self, pid: int) -> psutil.Process | None:
        p = self._procs.get(pid)
        if p is None:
            try:
                p = self._procs[pid] = psutil.Process(pid)
                p.cpu_percent(None)            # first sample: the baseline
            except psutil.Error:
                return None
        return p

    def prime(self, pids: list[int], interval: float) -> None:
        """Take baselines for new pids and wait `interval` so the next reading means something."""
        new = [pid for pid in pids if pid not in self._procs]
        for pid in new:
            self.process(pid)
        if new and interval > 0:
            time.sleep(interval)

    def read(self, pid: int) -> tuple[float | None, int | None]:
        p = self.process(pid)
        if p is None:
            return None, None
        try:
            with p.oneshot():
                return p.cpu_percent(None), p.memory_info().rss
        except psutil.Error:
            self._procs.pop(pid, None)
            return None, None

    def cpu_seconds(self, pid: int) -> float | None:
        """User + system CPU time of the process so far (a counter, where read() gives a rate)."""
        p = self.process(pid)
        if p is None:
            return None
        try:
            times = p.cpu_times()
        except psutil.Error:
            self._procs.pop(pid, None)
            return None
        return times.user + times.system


def _name(names: tuple[str, ...], value: int) -> str:
    return names[value] if 0 <= value < len(names) else f"?{value}"


def actor_health(view: SlotView, now_ns: int, sampler: CpuSampler) -> dict:
    running = view.pid != 0 and psutil.pid_exists(view.pid)
    problem = ""
    if view.sup_state != SupState.READY:
        state = _name(SupState.NAMES, view.sup_state)
        if view.sup_state == SupState.SPAWNED and view.current:
            state = _name(ActorState.NAMES, view.state)
        problem = state
    elif not running:
        state, problem = "gone", "process gone"
    elif not view.current:
        state, problem = "spawned", "has not claimed its slot"
    else:
        state = _name(ActorState.NAMES, view.state)
        if view.state != ActorState.RUNNING:
            problem = state
    age = (now_ns - view.heartbeat_ns) / 1e9 if view.current and view.heartbeat_ns else None
    deadline = view.deadline_ns / 1e9
    if not problem and age is not None and age > deadline:
        problem = f"heartbeat {age:.1f}s old (deadline {deadline:g}s)"
    cpu, rss = sampler.read(view.pid) if running else (None, None)
    return {"name": view.name, "pid": view.pid or None, "state": state,
            "heartbeat_age_s": None if age is None else round(age, 3), "heartbeat_deadline_s": deadline,
            "restarts": view.restarts, "incarnation": view.incarnation,
            "cpu_percent": cpu, "rss_bytes": rss,
            "mailbox_depth": view.mailbox_depth if view.current else None,
            "progress": view.progress if view.current else None,
            "loop_lag_ms": round(view.loop_lag_ns / 1e6, 1) if view.current else None,
            "loop_lag_max_ms": round(view.loop_lag_max_ns / 1e6, 1) if view.current else None,
            "healthy": not problem, "problem": problem or None}


HELPERS = {"forkserver_pid": "fork server", "tracker_pid": "resource tracker"}


def _helper_problems(scalars: dict[str, int]) -> list[str]:
    """multiprocessing's helpers of the node (smartgo.actors.helpers): -1 not used, 0 being replaced."""
    problems = []
    for name, what in HELPERS.items():
        pid = scalars.get(f"node.{name}", -1)
        if pid == 0:
            problems.append(f"{what} being replaced")
        elif pid > 0 and not _running(pid):
            problems.append(f"{what} (pid {pid}) is not running")
    return problems


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def node_health(board: Board, sampler: CpuSampler | None = None, cpu_interval: float = 0.0) -> dict:
    """Everything `smartgo health` shows, as plain data.

    cpu_interval > 0 with a fresh sampler blocks that long once, so CPU % covers that interval;
    a long-lived caller keeps one sampler and passes 0 (CPU % since its previous call).
    """
    sampler = sampler or CpuSampler()
    sampler.prime([v.pid for v in board.slots() if v.pid] + [board.get("node.pid")], cpu_interval)
    views = board.slots()
    scalars = board.scalars()
    now_ns = monotonic_ns()
    actors = [actor_health(v, now_ns, sampler) for v in views]
    sup_pid = scalars["node.pid"]
    sup_alive = sup_pid > 0 and psutil.pid_exists(sup_pid)
    sup_age = (now_ns - scalars["node.heartbeat_ns"]) / 1e9
    node_state = _name(NodeState.NAMES, scalars["node.state"])
    problems = []
    if not sup_alive:
        problems.append(f"supervisor (pid {sup_pid}) is not running")
    elif sup_age > SUPERVISOR_STALE_S:
        problems.append(f"supervisor loop silent for {sup_age:.1f}s")
    if scalars["node.state"] != NodeState.RUNNING:
        problems.append(f"node is {node_state}")
    if sup_alive:
        problems += [f"{a['name']}: {a['problem']}" for a in actors if a["problem"]]
        problems += _helper_problems(scalars)
    cpu, rss = sampler.read(sup_pid) if sup_alive else (None, None)
    node = {"role": board.meta.get("role"), "store_dir": board.meta.get("store_dir"), "board": str(board.path),
            "pid": sup_pid, "state": node_state if sup_alive else "down", "restarts": scalars["node.restarts"],
            "heartbeat_age_s": round(sup_age, 3), "cpu_percent": cpu, "rss_bytes": rss,
            "started": scalars["node.started_ns"] / 1e9,
            **{name: scalars.get(f"node.{name}", -1) for name in HELPERS},
            "queues": board.queues.count, "queue_limit": board.queues.limit}
    fields = {k: v for k, v in scalars.items() if not k.startswith("node.")}
    return {"healthy": not problems, "verdict": "healthy" if not problems else "unhealthy: " + "; ".join(problems),
            "node": node, "actors": actors, "fields": fields}
