"""Time arguments of the analytics commands: ISO-8601 or epoch milliseconds, always UTC inside."""

from __future__ import annotations

from datetime import datetime, timezone


def parse_time(text: str | int) -> int:
    """'1795000020000', '2026-11-22T14:00:00Z', '2026-11-22 14:00+01:00' or '2026-11-22' to epoch
    ms. A time without an offset is UTC. ValueError says what is accepted."""
    if isinstance(text, int):
        return text
    value = str(text).strip()
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        moment = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise ValueError(f"time {text!r} is neither epoch milliseconds nor ISO-8601 "
                         "(e.g. 2026-11-22T14:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def format_time(ms: int) -> str:
    """Epoch ms as ISO-8601 UTC with a Z, to the second (what reports show)."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def time_arg(text: str) -> int:
    """argparse type for --since/--until: a clear message instead of argparse's generic one."""
    import argparse

    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
