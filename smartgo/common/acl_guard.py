"""The ACL check in front of a node's processors (acl_enable): every request passes the
AclValidator of smartgo.common.acl_check before its processor runs, as 4.x's
PlainAccessValidator runs as an RPC hook before every processor. The broker's net actors and the
registry guard their processors with it.

The rules come from the ACL file (RocketMQ's plain_acl.yml). The file is read again when its
modification time or size changes (checked every second, as 4.x's FileWatchService does every
500 ms, and at once when the broker actor has changed it for an ACL admin request); a change that
does not load is logged and the rules in force stay. A refused request is answered SYSTEM_ERROR
with 4.x's AclException text (a oneway one gets no answer), with a log line; the connection goes
on serving.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection
from pathlib import Path

from smartgo.common.acl_check import AclConfigError, AclError, AclValidator, load_acl
from smartgo.net.codes import ResponseCode
from smartgo.net.command import RemotingCommand
from smartgo.net.connection import Connection, Processor

log = logging.getLogger(__name__)

CHECK_INTERVAL = 1.0       # s between looks at the ACL file


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """A new inode too: two atomic rewrites within one clock tick may keep mtime and size."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class AclGuard:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = _stamp(path)
        self.validator = AclValidator(load_acl(path))     # AclConfigError / OSError: the net actor cannot start
        self._checked = time.monotonic()

    def reload_if_changed(self, now: float) -> None:
        if now - self._checked < CHECK_INTERVAL:
            return
        self._checked = now
        if _stamp(self.path) != self._stamp:
            self.reload()

    def reload(self) -> None:
        """The file's rules from now on; a file that does not load leaves the rules in force."""
        self._stamp = _stamp(self.path)
        try:
            self.validator = AclValidator(load_acl(self.path))
        except (AclConfigError, OSError) as exc:
            log.error("ACL file %s changed but does not load; the rules in force stay: %s", self.path, exc)
            return
        log.info("ACL file %s reloaded", self.path)

    def guard(self, processors: dict[int, Processor], only: Collection[int] | None = None) -> dict[int, Processor]:
        """The same processors, each (or each of `only`) behind the ACL check."""
        return {code: self._guarded(p) if only is None or code in only else p for code, p in processors.items()}

    def _guarded(self, processor: Processor) -> Processor:
        async def guarded(conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
            try:
                self.validator.check(conn.remote_address, request.code, request.ext_fields,
                                     request.body_bytes() if request.body else None)
            except AclError as exc:
                log.warning("%s: request code %d refused by the ACL: %s", conn, request.code, exc)
                return None if request.is_oneway else request.make_response(ResponseCode.SYSTEM_ERROR, str(exc))
            return await processor(conn, request)
        eager = getattr(processor, "smartgo_eager", False)
        guarded.smartgo_eager = eager  # type: ignore[attr-defined]  # a marker attribute on a function
        return guarded
