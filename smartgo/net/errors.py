"""Exceptions of the remoting layer. Every one names what went wrong in words a log reader can act on."""

from __future__ import annotations


class RemotingError(Exception):
    """Base of every remoting failure; a processor raising one gets its message as the SYSTEM_ERROR remark."""


class FrameError(RemotingError):
    """The byte stream cannot be framed or a header cannot be decoded; the connection must be closed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HeaderError(FrameError):
    """A header that framed correctly but does not decode (bad JSON, bad field types, bad lengths)."""


class HeaderFieldError(RemotingError, ValueError):
    """A custom header field (extFields) is missing or does not parse; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class RemotingConnectError(RemotingError, ConnectionError):
    """Could not connect to a remote address."""


class ConnectionClosedError(RemotingError, ConnectionError):
    """The connection closed before the request was answered (or was already closed)."""


class RemotingTimeoutError(RemotingError, TimeoutError):
    """No response arrived within the request's timeout."""
