"""Store-directory guards: the ``lock`` file (one broker per store) and the ``abort`` marker."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from smartgo.store.errors import StoreLockedError

log = logging.getLogger(__name__)


class StoreLock:
    """An exclusive, non-blocking flock on ``<store>/lock`` (or another file of the directory:
    `smartgo scrub` also takes the supervisor's ``run/supervisor.lock``) holding the owner's pid.

    flock belongs to the open file, so the supervisor takes it once and the actors it
    spawns work under it; a second broker on the same directory gets StoreLockedError."""

    def __init__(self, store_dir: Path | str, name: str = "lock"):
        self.store_dir = Path(store_dir)
        self.path = self.store_dir / name
        self._fd: int | None = None

    def acquire(self) -> StoreLock:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = int(os.pread(fd, 32, 0).split()[0])
            except (ValueError, IndexError, OSError):
                holder = None
            os.close(fd)
            raise StoreLockedError(str(self.store_dir), holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def abort_file_exists(store_dir: Path | str) -> bool:
    """True when the last run did not shut down cleanly."""
    return (Path(store_dir) / "abort").exists()


def mark_running(store_dir: Path | str) -> None:
    """Create the abort marker (after recovery, before any actor writes)."""
    path = Path(store_dir) / "abort"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the marker must outlive a power cut
    finally:
        os.close(fd)


def mark_clean_shutdown(store_dir: Path | str) -> None:
    (Path(store_dir) / "abort").unlink(missing_ok=True)
