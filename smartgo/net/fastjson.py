"""JSON bodies as Java peers write and read them (fastjson).

fastjson writes map keys that are not strings without quotes (`{0:"ip:port"}` for a
HashMap<Long,String>), which strict JSON parsers reject; `loads` accepts that. It writes a map
keyed by objects (MessageQueue) with the object itself in key position; `dumps_keyed` writes
that form, which Java peers read back into their maps, and `loads_keyed` reads it. `dumps` writes
compact JSON (no whitespace: the Go client splits brokerAddrs text on ',' and ':') with every key
quoted, which fastjson, the Go client and ali-ons all read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

# A JSON string (skipped untouched) or a bare integer in key position.
_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?\d+)(\s*:)', re.S)
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_WS = re.compile(r"[ \t\n\r]*")
_decoder = json.JSONDecoder()


def _quote_key(match: re.Match[str]) -> str:
    if match.group(2) is None:
        return match.group(0)
    return f'{match.group(1)}"{match.group(2)}"{match.group(3)}'


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse a JSON body, also accepting fastjson's unquoted integer map keys.
    Raises ValueError (json.JSONDecodeError or UnicodeDecodeError) on anything else malformed."""
    text = data if isinstance(data, str) else str(data, "utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        quoted = _BARE_KEY.sub(_quote_key, text)
        if quoted == text:
            raise
        return json.loads(quoted)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON."""
    return _compact(obj).encode("utf-8")


def dumps_keyed(pairs: Iterable[tuple[Any, Any]]) -> bytes:
    """A map whose keys are JSON values of any kind (objects too), as fastjson writes one."""
    return b"{" + b",".join(dumps(k) + b":" + dumps(v) for k, v in pairs) + b"}"


def hashable(key: Any) -> Any:
    """A parsed key usable in a dict: an object becomes its sorted (name, JSON text) pairs, an
    array a tuple."""
    if isinstance(key, dict):
        return tuple(sorted((k, json.dumps(v)) for k, v in key.items()))
    if isinstance(key, list):
        return tuple(key)
    return key


def loads_keyed(data: bytes | bytearray | memoryview | str, key: Callable[[Any], Any] = hashable) -> Any:
    """Parse a fastjson body whose maps may have any JSON value as a key (objects, numbers);
    `key` turns each parsed key into a dict key. ValueError when it is not one."""
    text = data if isinstance(data, str) else str(data, "utf-8")
    try:
        value, end = _KeyedParser(text, key).value(0)
    except (IndexError, json.JSONDecodeError) as exc:
        raise ValueError(f"undecodable JSON body: {exc}") from None
    if _WS.match(text, end).end() != len(text):  # type: ignore[union-attr]  # _WS matches empty too
        raise ValueError(f"trailing data after the JSON body at {end}")
    return value


class _KeyedParser:
    def __init__(self, text: str, key: Callable[[Any], Any]) -> None:
        self.text = text
        self.key = key

    def ws(self, i: int) -> int:
        return _WS.match(self.text, i).end()  # type: ignore[union-attr]  # _WS matches empty too

    def value(self, i: int) -> tuple[Any, int]:
        i = self.ws(i)
        c = self.text[i:i + 1]
        if c == "{":
            return self.obj(i + 1)
        if c == "[":
            return self.arr(i + 1)
        return _decoder.raw_decode(self.text, i)

    def obj(self, i: int) -> tuple[dict, int]:
        out: dict = {}

        def member(i: int) -> int:
            key, i = self.value(i)
            i = self.ws(i)
            if self.text[i:i + 1] != ":":
                raise ValueError(f"expected ':' at {i}")
            out[self.key(key)], i = self.value(i + 1)
            return i
        return out, self.items(i, "}", member)

    def arr(self, i: int) -> tuple[list, int]:
        out: list = []

        def element(i: int) -> int:
            val, i = self.value(i)
            out.append(val)
            return i
        return out, self.items(i, "]", element)

    def items(self, i: int, close: str, item: Callable[[int], int]) -> int:
        """Comma-separated items up to `close`; the position after it."""
        i = self.ws(i)
        if self.text[i:i + 1] == close:
            return i + 1
        while True:
            i = self.ws(item(i))
            c = self.text[i:i + 1]
            if c == close:
                return i + 1
            if c != ",":
                raise ValueError(f"expected ',' or '{close}' at {i}")
            i += 1
