"""The stats folder (<store>/stats/): hourly JSON-lines files, bounded in size (docs/STATS.md).

Each record is appended as one line with one write(2) on an O_APPEND descriptor, so a reader
never sees half a line except after a crash mid-write (readers count a torn last line as bad).
The file is chosen by smartgo.stats_schema.file_name(ts), the same function readers use. When
the folder grows over stats_max_bytes, the oldest files are deleted (never the one being
written).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from smartgo.stats_schema import FILE_GLOB, file_hour_ms, file_name

log = logging.getLogger(__name__)

TAIL_BYTES = 64 * 1024


class StatsFiles:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.directory.mkdir(parents=True, exist_ok=True)

    def files(self) -> list[Path]:
        """The stats files, oldest hour first."""
        named = [(file_hour_ms(p.name), p) for p in self.directory.glob(FILE_GLOB)]
        return [p for hour, p in sorted((h, p) for h, p in named if h is not None)]

    def last_ts(self) -> int:
        """ts of the newest complete record written (0 if none): a restarted writer goes on after it."""
        for path in reversed(self.files()):
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - TAIL_BYTES))
                lines = f.read().split(b"\n")
            for line in reversed(lines[1:] if size > TAIL_BYTES else lines):
                try:
                    return int(json.loads(line)["ts"])
                except (ValueError, KeyError, TypeError):
                    continue
        return 0

    def append(self, record: dict) -> Path:
        path = self.directory / file_name(record["ts"])
        new = not path.exists()
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        if new:
            self.prune(keep=path)
        return path

    def prune(self, keep: Path) -> int:
        """Delete the oldest files while the folder is over max_bytes; returns how many."""
        files = self.files()
        sizes = {p: p.stat().st_size for p in files}
        total = sum(sizes.values())
        deleted = 0
        for path in files:
            if total <= self.max_bytes or path == keep:
                break
            path.unlink(missing_ok=True)
            total -= sizes[path]
            deleted += 1
            log.info("stats folder over %d bytes: deleted %s", self.max_bytes, path.name)
        return deleted
