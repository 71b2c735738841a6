"""How many CPUs this process may really use, for defaults that scale with the machine.

The affinity mask alone overstates it in a container: one started with `--cpus=2` on a 32-core
host sees all 32 CPUs in its mask and is throttled to two by its cgroup's CPU quota. So the mask
is capped by the quota of the process's cgroup (v2's cpu.max, else v1's cfs quota and period), as
the JVM's container support does for Java's availableProcessors().
"""

from __future__ import annotations

import math
import os
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(proc_cgroup, root)
    return max(1, min(cpus, math.ceil(quota))) if quota else cpus


def cgroup_cpu_quota(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """CPUs' worth of time the process's cgroup (or the tightest of its ancestors) may use; None
    when unlimited or unknown."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and not controllers:            # cgroup v2: one tree, cpu.max per group
            base, v1 = root, False
        elif "cpu" in controllers.split(","):               # cgroup v1: the cpu controller's tree
            base, v1 = root / controllers, True
        else:
            continue
        group = base / path.lstrip("/")
        for d in (group, *group.parents):
            if d != base and base not in d.parents:
                break
            quota = _quota(d / "cpu.cfs_quota_us", d / "cpu.cfs_period_us") if v1 else _quota(d / "cpu.max", None)
            if quota is not None:
                quotas.append(quota)
    return min(quotas) if quotas else None


def _quota(quota_file: Path, period_file: Path | None) -> float | None:
    try:
        if period_file is None:                             # v2: "max 100000" or "200000 100000"
            quota, period = (quota_file.read_text().split() + ["100000"])[:2]
        else:
            quota, period = quota_file.read_text().strip(), period_file.read_text().strip()
        if quota in ("max", "-1") or int(period) <= 0:
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None
