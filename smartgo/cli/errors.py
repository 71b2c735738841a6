"""The one exception subcommands raise for a user-facing failure."""


class CliError(Exception):
    """Printed as `smartgo <command>: <message>`; `status` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status
