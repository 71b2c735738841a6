"""JSON bodies as Java peers write and read them (fastjson).

fastjson writes map keys that are not strings without quotes (`{0:"ip:port"}` for a
HashMap<Long,String>), which strict JSON parsers reject; `loads` accepts that. It writes a map
keyed by objects (MessageQueue) with the object itself in key position; `dumps_keyed` writes
that form, which Java peers read back into their maps. `dumps` writes
compact JSON (no whitespace: the Go client splits brokerAddrs text on ',' and ':') with every key
quoted, which fastjson, the Go client and ali-ons all read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

# A JSON string (skipped untouched) or a bare integer in key position.
_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?\d+)(\s*:)', re.S)
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


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
