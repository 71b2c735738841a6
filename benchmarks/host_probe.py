"""How fast this VM's CPUs run right now, for benchmarks on a shared machine.

On the 2-vCPU VM the benchmarks were recorded on, the same pure-Python loop takes 5.6 to 11.3 ms
of CPU time from one second to the next with nothing else of ours running (process time equals
wall time: a slower vCPU, not stolen time), and every figure moves with it. A benchmark reports
`host_probe_ms` next to its figures (higher is a slower host) so that runs can be compared, or
normalised, by host speed.
"""

from __future__ import annotations

import statistics
import struct
import threading
import time
from collections.abc import Iterator

_PROBE = struct.Struct(">qiiq")


class HostProbe:
    """A thread times a fixed pure-Python workload (calls, dict lookups, struct packing and joins,
    as on the send path) in its own CPU time every `every` seconds while a scenario runs; `ms` is
    the median. ~2 % of one core, and it holds the GIL ~6 ms at a time: use it in a process that
    only waits (a benchmark's parent), or call now() between runs (before_each does)."""

    def __init__(self, every: float = 0.25) -> None:
        self.every = every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-probe", daemon=True)

    @staticmethod
    def once() -> float:
        d = {i: i for i in range(64)}
        pack, join = _PROBE.pack, b"".join
        t0 = time.thread_time()
        for i in range(20_000):
            join((pack(i, d.get(i & 63, 0), i & 7, i << 3), b"x"))
        return (time.thread_time() - t0) * 1000

    @classmethod
    def now(cls, repeats: int = 5) -> float:
        """The median of `repeats` samples taken at once (between runs, ~30 ms)."""
        return round(statistics.median(cls.once() for _ in range(repeats)), 3)

    def sample(self) -> None:
        """Take now() into the samples: between runs, so no thread holds the GIL in a process
        whose time is measured; `ms` is then the median of the samples."""
        self.samples.append(self.now())

    def before_each(self, runs: int) -> Iterator[int]:
        """range(runs), with a sample() before each run."""
        for i in range(runs):
            self.sample()
            yield i

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(self.once())

    @property
    def ms(self) -> float:
        return round(statistics.median(self.samples), 3) if self.samples else 0.0

    def __enter__(self) -> HostProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
