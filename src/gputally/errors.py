"""The one exception tree of gputally.

    GputallyError
    ├── ConfigError            bad configuration; raised at startup only, never after
    ├── InvalidRequest         the sender's data cannot be decoded or breaks a limit (permanent)
    ├── Refused                backpressure: try again later (queue full, memory limit)
    └── ExportError            a send to a backend failed
        ├── PermanentExportError   retrying cannot help (bad request, auth): dropped at once
        └── TransientExportError   retrying may help (unavailable, timeout, throttled)

Foreign exceptions (grpc, aiohttp, protobuf, OS) are translated into these at the boundary
with ``raise ... from exc`` so callers handle one family.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ExportError",
    "GputallyError",
    "InvalidRequest",
    "PermanentExportError",
    "Refused",
    "TransientExportError",
]


class GputallyError(Exception):
    """Root of every error gputally raises on purpose."""


class ConfigError(GputallyError):
    """The configuration is invalid. ``problems`` holds one line per fault, each naming its key."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class InvalidRequest(GputallyError):
    """The request is malformed or too large; the sender must not retry it unchanged."""


class Refused(GputallyError):
    """Backpressure: the data was not taken, and the sender should retry after ``retry_after`` s."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ExportError(GputallyError):
    """A send to a backend failed."""


class PermanentExportError(ExportError):
    """The backend rejected the data for good (for example 400, 401, INVALID_ARGUMENT)."""


class TransientExportError(ExportError):
    """The send may succeed later. ``retry_after`` is the server's throttle hint, if it gave one."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
