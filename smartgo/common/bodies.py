"""Reading JSON request bodies from clients: every field checked, every problem named.

A bad body (not JSON, a field of the wrong type, a missing required field) raises BodyError
with a message that names the body and the field's path ("HeartbeatData:
consumerDataSet[0].subscriptionDataSet[1].codeSet[2] is not an integer: 'x'"); processors
answer it SYSTEM_ERROR with that remark and the connection goes on.
"""

from __future__ import annotations

from typing import Any

from smartgo.net import fastjson

_MISSING = object()


class BodyError(ValueError):
    """A malformed request body; the message says what and where."""


class Fields:
    """Typed access to one JSON object of a body, for error messages that name the path."""

    __slots__ = ("obj", "path", "body")

    def __init__(self, obj: Any, path: str, body: str) -> None:
        if not isinstance(obj, dict):
            raise BodyError(f"{body}: {path or 'the body'} is not an object")
        self.obj, self.path, self.body = obj, path, body

    def _where(self, name: str) -> str:
        return f"{self.body}: {self.path}.{name}" if self.path else f"{self.body}: {name}"

    def _get(self, name: str, default: Any) -> Any:
        value = self.obj.get(name, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise BodyError(f"{self._where(name)} is missing")
            return default
        return value

    def text(self, name: str, default: Any = _MISSING) -> str:
        value = self._get(name, default)
        if not isinstance(value, str):
            raise BodyError(f"{self._where(name)} is not a string: {value!r:.60}")
        return value

    def integer(self, name: str, default: Any = _MISSING) -> int:
        return as_int(self._get(name, default), self._where(name))

    def flag(self, name: str, default: Any = _MISSING) -> bool:
        value = self._get(name, default)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise BodyError(f"{self._where(name)} is not a boolean: {value!r:.60}")
        return value

    def enum(self, name: str, names: tuple[str, ...], default: str) -> str:
        """A Java enum field: its name, or its ordinal as fastjson also reads it (the C++ client
        writes consumeType, messageModel and consumeFromWhere as numbers)."""
        value = self._get(name, default)
        if isinstance(value, str) and value.upper() in names:
            return value.upper()
        if type(value) is int and 0 <= value < len(names):
            return names[value]
        raise BodyError(f"{self._where(name)} must be one of {', '.join(names)} (or its ordinal), "
                        f"got {value!r:.40}")

    def array(self, name: str, default: Any = _MISSING) -> list:
        value = self._get(name, default)
        if not isinstance(value, list):
            raise BodyError(f"{self._where(name)} is not an array: {value!r:.60}")
        return value

    def objects(self, name: str) -> list[Fields]:
        """An optional array of objects (absent or null: empty)."""
        prefix = f"{self.path}.{name}" if self.path else name
        return [Fields(item, f"{prefix}[{i}]", self.body) for i, item in enumerate(self.array(name, []))]


def as_int(value: Any, where: str) -> int:
    """An integer, also from a numeric string (the Go client writes codeSet items as strings)."""
    if isinstance(value, bool):
        raise BodyError(f"{where} is not an integer: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip(), 10)
        except ValueError:
            pass
    raise BodyError(f"{where} is not an integer: {value!r:.60}")


def parse_body(raw: bytes | None, body: str) -> Fields:
    """The top-level object of a JSON body."""
    if not raw:
        raise BodyError(f"{body}: the request has no body")
    try:
        obj = fastjson.loads(raw)
    except ValueError as exc:
        raise BodyError(f"{body}: not JSON ({exc})") from None
    return Fields(obj, "", body)
