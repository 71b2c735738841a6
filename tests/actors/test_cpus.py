"""The CPUs a node may use (affinity capped by a cgroup quota) and the net actors it starts by default."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from smartgo import config as config_module
from smartgo.config import NodeConfig
from smartgo.cpus import cgroup_cpu_quota, usable_cpus


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("proc, files, quota", [
    # cgroup v2: the process's own group, else the tightest ancestor; "max" is unlimited
    ("0::/box/app\n", {"box/app/cpu.max": "150000 100000\n", "box/cpu.max": "max 100000\n"}, 1.5),
    ("0::/box/app\n", {"box/app/cpu.max": "max 100000\n", "box/cpu.max": "200000 100000\n"}, 2.0),
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),
    # cgroup v1 (hybrid, as on this machine): the cpu controller's quota and period; -1 is unlimited
    ("4:memory:/x\n1:cpu,cpuacct:/docker/abc\n0::/\n",
     {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"},
     3.0),
    ("1:cpu:/\n0::/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    # garbage and missing files are "unknown", not an error
    ("0::/box\n", {"box/cpu.max": "lots\n"}, None),
    ("not a cgroup line\n", {}, None),
])
def test_cgroup_quota(tmp_path: Path, proc: str, files: dict, quota: float | None):
    root = tree(tmp_path / "cgroup", files)
    (tmp_path / "proc").write_text(proc)
    assert cgroup_cpu_quota(tmp_path / "proc", root) == quota


def test_usable_cpus_is_the_affinity_capped_by_the_quota(tmp_path: Path):
    mask = len(os.sched_getaffinity(0))
    (tmp_path / "proc").write_text("0::/\n")
    root = tree(tmp_path / "cgroup", {"cpu.max": "50000 100000\n"})          # half a CPU: still one
    assert usable_cpus(tmp_path / "proc", root) == 1
    assert usable_cpus(tmp_path / "missing", root) == mask


@pytest.mark.parametrize("cpus, explicit, nets", [(1, 0, 1), (2, 0, 1), (3, 0, 1), (4, 0, 2), (16, 0, 8), (16, 3, 3)])
def test_net_actors_default_to_one_per_two_cpus(monkeypatch, tmp_path: Path, cpus: int, explicit: int, nets: int):
    monkeypatch.setattr(config_module, "usable_cpus", lambda: cpus)
    cfg = NodeConfig(role="master", store_dir=str(tmp_path), net_actors=explicit).resolved(10911)
    assert cfg.net_actors == nets
