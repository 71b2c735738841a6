"""Client SDK exceptions. Every one reads as a sentence a user can act on; callers branch on the
type (and BrokerError.code), never on the text."""

from __future__ import annotations

from smartgo.net.codes import code_name


class ClientError(Exception):
    """Base of every error the SDK raises on purpose."""


class ClientStateError(ClientError):
    """The client is not started, or already closed."""


class NoRouteError(ClientError):
    """The registries know no route for a topic (it does not exist and cannot be auto-created)."""

    def __init__(self, topic: str, detail: str = "") -> None:
        super().__init__(f"no route info of topic {topic!r}{': ' + detail if detail else ''}")
        self.topic = topic


class RegistryUnavailableError(ClientError):
    """No registry answered."""


class BrokerError(ClientError):
    """A broker (or registry) answered with a non-success response code."""

    def __init__(self, code: int, remark: str | None, addr: str = "", what: str = "") -> None:
        name = code_name(code)
        where = f" from {addr}" if addr else ""
        prefix = f"{what}: " if what else ""
        super().__init__(f"{prefix}{name}{where}: {remark or 'no remark'}")
        self.code = code
        self.remark = remark or ""
        self.addr = addr


class SendTimeoutError(ClientError, TimeoutError):
    """A send did not complete within its total timeout (retries included)."""


class MessageError(ClientError, ValueError):
    """A message the client refuses before sending (bad topic, empty or oversize body)."""


class RequestTimeoutError(ClientError, TimeoutError):
    """A request (request-reply) was sent but its reply did not come within the timeout."""
