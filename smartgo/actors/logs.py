"""The node log: one writer (the supervisor), two sinks (stderr and a rotated file).

Actors do not open the log file: rotating one file from several processes races (two
processes rename it at once, records land in the rotated-away file). Instead every actor's
records travel up its control pipe (control.ForwardingHandler) and the supervisor writes them,
tagged with the actor's name and pid, through the same handlers as its own records.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import sys
import time
from collections.abc import Callable

from smartgo.config import NodeConfig

FORMAT = "%(asctime)s %(levelname)-7s %(actor)s[%(actor_pid)s] %(name)s: %(message)s"


class _Tag(logging.Filter):
    """Records the supervisor logs itself carry its own name and pid."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "actor"):
            record.actor = "supervisor"
            record.actor_pid = os.getpid()
        return True


def setup_node_logging(config: NodeConfig) -> list[logging.Handler]:
    """Route the root logger to stderr and <store-dir>/logs/node.log (rotated, bounded)."""
    config.log_path.parent.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [
        logging.StreamHandler(sys.stderr),
        logging.handlers.RotatingFileHandler(config.log_path, maxBytes=config.log_max_bytes,
                                             backupCount=config.log_backups, encoding="utf-8"),
    ]
    root = logging.getLogger()
    for h in handlers:
        h.setFormatter(logging.Formatter(FORMAT))
        h.addFilter(_Tag())
        root.addHandler(h)
    root.setLevel(config.log_level)
    return handlers


def remove_handlers(handlers: list[logging.Handler]) -> None:
    root = logging.getLogger()
    for h in handlers:
        root.removeHandler(h)
        h.close()


def emit_forwarded(msg: dict, actor: str, pid: int) -> None:
    """Write a record an actor sent up its control pipe."""
    created = float(msg.get("created") or 0.0)
    record = logging.makeLogRecord({
        "name": str(msg.get("name", "?")), "levelno": int(msg.get("level", logging.INFO)),
        "levelname": logging.getLevelName(int(msg.get("level", logging.INFO))),
        "msg": str(msg.get("msg", "")), "created": created, "msecs": (created % 1) * 1000,
        "exc_text": msg.get("exc"), "actor": actor, "actor_pid": pid})
    logging.getLogger(record.name).handle(record)


QUIET_FOR = 60.0    # s: a failure a loop meets at every turn (a reconnect every second) is written once a minute


class Repeats:
    """For a line a loop would write at every turn (a reconnect every second): the same text
    passes once per `every` seconds. check() is the number held back since it last passed, or
    None to hold this one back too; line() is the text to write, or None; log() writes it."""

    def __init__(self, every: float = QUIET_FOR, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self._text = ""
        self._at = -every
        self._held = 0

    def check(self, text: str) -> int | None:
        now = self.clock()
        if text != self._text or now - self._at >= self.every:
            held, self._text, self._at, self._held = self._held, text, now, 0
            return held
        self._held += 1
        return None

    def line(self, text: str, key: str | None = None) -> str | None:
        """key: what makes two lines the same (default the text; gist() ignores the numbers)."""
        held = self.check(text if key is None else key)
        if held is None:
            return None
        return f"{text} ({held} more like the last line held back)" if held else text

    def log(self, logger: logging.Logger, level: int, text: str, key: str | None = None) -> None:
        """line(text, key), written to logger at level when it passes."""
        line = self.line(text, key)
        if line is not None:
            logger.log(level, "%s", line)


_NUMBERS = re.compile(r"\d+")


def gist(text: str) -> str:
    """A line with its numbers masked: a refusal whose offsets move is still the same refusal."""
    return _NUMBERS.sub("#", text)
