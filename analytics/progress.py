"""One progress line on stderr while Spark works: the report's step, and the running stage's tasks.

On a terminal the line is rewritten in place (a poller thread reads Spark's status
tracker); into a file or pipe it is one line per finished step, so logs stay readable.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    def __init__(self, spark, total_steps: int, prefix: str = "report", stream: TextIO | None = None,
                 interval: float = 0.5):
        self.spark = spark
        self.total = total_steps
        self.prefix = prefix
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._step = 0
        self._label = ""
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._width = 0

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        with self._lock:
            self._step += 1
            self._label = label
            self._started = time.monotonic()
        poller = None
        if self.tty:
            self._stop.clear()
            poller = threading.Thread(target=self._poll, name="spark-progress", daemon=True)
            poller.start()
        try:
            yield
        finally:
            if poller is not None:
                self._stop.set()
                poller.join()
            self._emit(f"done in {time.monotonic() - self._started:.1f} s", final=True)

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self._emit(self._tasks())

    def _tasks(self) -> str:
        try:
            tracker = self.spark.sparkContext.statusTracker()
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
        except Exception:  # the session may be stopping; progress is best effort
            return "working"
        return f"tasks {done}/{total}" if total else "planning"

    def _emit(self, detail: str, final: bool = False) -> None:
        with self._lock:
            line = (f"[{self.prefix} {self._step}/{self.total}] {self._label}: {detail} "
                    f"({time.monotonic() - self._started:.1f} s)" if not final else
                    f"[{self.prefix} {self._step}/{self.total}] {self._label}: {detail}")
            if self.tty:
                pad = max(0, self._width - len(line))
                self.stream.write("\r" + line + " " * pad + ("\n" if final else ""))
                self._width = 0 if final else len(line)
            elif final:
                self.stream.write(line + "\n")
            self.stream.flush()
