"""Crash-safe JSON files of the broker actor: topics.json, consumerOffset.json,
subscriptionGroup.json and brokerConfig.json under <store>/config/.

save(): the new content goes to a temp file, which is fsynced; the current file is hard-linked
to <name>.bak (through a temp link renamed over the old .bak, so .bak too is always whole);
the temp file is renamed over the file; the directory is fsynced. A kill -9 at any point
leaves the file holding the old or the new content - never a mix, never missing once written -
and .bak the previous or the one before.

load(): the file, else <name>.bak when the file is missing or does not parse (a log line says
so), else None. RecordFile keeps one dataclass as a JSON object that way (role.json, reseed.json).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
PARSE_ERRORS = (ValueError, KeyError, TypeError, AttributeError)


class PersistedFile:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.bak = self.path.with_name(self.path.name + ".bak")

    def save(self, data: bytes) -> None:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if path.exists():
                os.chmod(tmp, os.stat(path).st_mode & 0o7777)    # a 0600 file (secrets) stays 0600
                self._keep_previous()
            os.replace(tmp, path)
        except BaseException:                   # a full disk: no half-written temp file left behind
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)

    def _keep_previous(self) -> None:
        link = self.path.with_name(f".{self.bak.name}.{os.getpid()}.tmp")
        try:
            link.unlink(missing_ok=True)
            os.link(self.path, link)
        except OSError:                        # no hard links here: a copy does as well
            shutil.copyfile(self.path, link)
        os.replace(link, self.bak)

    def load(self, parse: Callable[[bytes], T], what: str) -> T | None:
        """The parsed file, or its .bak when it is missing or corrupt, or None (no file yet)."""
        for path in (self.path, self.bak):
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue
            try:
                value = parse(raw)
            except PARSE_ERRORS as exc:
                log.error("%s %s is corrupt (%s: %s)%s", what, path, type(exc).__name__, exc,
                          "; trying its backup" if path == self.path else "")
                continue
            if path == self.bak:
                log.warning("%s: loaded the backup %s", what, path)
            return value
        return None

    def delete(self) -> None:
        """The file and its backup, for good."""
        self.path.unlink(missing_ok=True)
        self.bak.unlink(missing_ok=True)
        _fsync_dir(self.path.parent)


class RecordFile(Generic[T]):
    """One dataclass (its fields) as a JSON object in a PersistedFile; check raises ValueError for
    a value that parses but makes no sense (the backup is tried then, as for a corrupt file)."""

    def __init__(self, path: Path, cls: Callable[..., T], what: str,
                 check: Callable[[T], Any] = lambda value: None) -> None:
        self.file = PersistedFile(path)
        self.cls = cls
        self.what = what
        self.check = check

    def _parse(self, raw: bytes) -> T:
        value = self.cls(**json.loads(raw))
        self.check(value)
        return value

    def load(self) -> T | None:
        return self.file.load(self._parse, self.what)

    def save(self, value: T) -> None:
        fields = dataclasses.asdict(value)  # type: ignore[call-overload]  # T is a dataclass
        self.file.save(json.dumps(fields).encode())

    def delete(self) -> None:
        self.file.delete()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
