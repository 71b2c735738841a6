"""RemotingCommand: one request or response on the wire (RocketMQ's RemotingCommand, minus reflection).

Custom headers travel as `ext_fields` (a str -> str map); processors read them with the typed
accessors below, which fail with the same wording as Java's decodeCommandCustomHeader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from smartgo.net.codes import (CURRENT_VERSION, FLAG_ONEWAY, FLAG_RESPONSE, LanguageCode,
                               SerializeType)
from smartgo.net.errors import HeaderFieldError

Buffer = Union[bytes, bytearray, memoryview]
#: A body is one buffer or a sequence of buffers (a zero-copy response: e.g. mapped store slices).
Body = Union[Buffer, Sequence[Buffer], None]

_MISSING = object()


@dataclass(slots=True)
class RemotingCommand:
    code: int
    language: int = LanguageCode.PYTHON
    version: int = CURRENT_VERSION
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] | None = None
    body: Body = None
    serialize_type: int = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def make_response(self, code: int, remark: str | None = None,
                      ext_fields: dict[str, str] | None = None, body: Body = None) -> RemotingCommand:
        """The reply to this request: same opaque and serialize type, response bit set."""
        return RemotingCommand(code, LanguageCode.PYTHON, CURRENT_VERSION, self.opaque, FLAG_RESPONSE,
                               remark, ext_fields, body, self.serialize_type)

    def body_bytes(self) -> bytes:
        """The body as one bytes object (joins a multi-buffer body; b"" when there is none)."""
        body = self.body
        if body is None:
            return b""
        if isinstance(body, bytes):
            return body
        if isinstance(body, (bytearray, memoryview)):
            return bytes(body)
        return b"".join(body)

    # -- custom header fields -------------------------------------------------------------------

    def ext_str(self, name: str, default: object = _MISSING) -> str:
        """A required string field (or `default` when given and the field is absent)."""
        ext = self.ext_fields
        value = ext.get(name) if ext else None
        if value is None:
            if default is _MISSING:
                raise HeaderFieldError(name, f"the custom field {name} is null")
            return default  # type: ignore[return-value]  # the caller's default
        return value

    def ext_int(self, name: str, default: object = _MISSING) -> int:
        """An Integer or Long field, parsed like Java's Long.parseLong (decimal, optional sign)."""
        value = self.ext_str(name, default)
        if value is default:
            return value  # type: ignore[return-value]  # the caller's default
        try:
            return int(value, 10)
        except (TypeError, ValueError):
            raise HeaderFieldError(name, f"the custom field {name} is not an integer: {value!r}") from None

    def ext_bool(self, name: str, default: object = _MISSING) -> bool:
        """A Boolean field: "true" in any case is True, anything else False (Boolean.parseBoolean)."""
        value = self.ext_str(name, default)
        if value is default:
            return value  # type: ignore[return-value]  # the caller's default
        return value.lower() == "true"
