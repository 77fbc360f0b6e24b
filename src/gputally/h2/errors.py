"""The two kinds of HTTP/2 error (RFC 9113 section 5.4): one that ends the connection, one
that resets a stream alone."""

from __future__ import annotations

from .frames import ErrorCode

__all__ = ["ProtocolError", "StreamError"]


class ProtocolError(Exception):
    """A connection error: GOAWAY with ``code``, then close. ``limit`` names the bound the peer
    hit when it is one of :class:`~.limits.Limits` (logged as an attack, not a bug)."""

    def __init__(self, code: ErrorCode, message: str, *, limit: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.limit = limit


class StreamError(Exception):
    """A stream error: RST_STREAM with ``code`` on that stream alone."""

    def __init__(self, stream_id: int, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.code = code
