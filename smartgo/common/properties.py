"""Java properties text in request bodies (UPDATE_BROKER_CONFIG, UPDATE_NAMESRV_CONFIG) and its
true/false values: the broker and the registry read their runtime settings changes with it."""

from __future__ import annotations

from smartgo.common.bodies import BodyError
from smartgo.config import FLAG_WORDS


def parse_flag(value: str) -> bool:
    """A setting that is true or false, in any case (Java's parseBoolean would take a typo as false)."""
    word = value.strip().lower()
    if word not in FLAG_WORDS:
        raise ValueError("must be true or false")
    return word == "true"


def parse_properties(raw: bytes | None, what: str = "broker config") -> dict[str, str]:
    """key=value (or key: value) lines; blank lines and #/! comments skipped."""
    if not raw:
        raise BodyError(f"{what}: the request has no body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(f"{what}: not UTF-8 text ({exc})") from None
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise BodyError(f"{what}: line {n} is not key=value: {line[:60]!r}")
        out[line[:cut].strip()] = line[cut + 1:].strip()
    if not out:
        raise BodyError(f"{what}: no key=value line in the body")
    return out
