"""What the protocol core tells the code around it: the events of one connection.

The core (:class:`~.core.Core`) calls these on the object it was given, in the order the
peer's frames caused them; nothing here owns a socket or a task. The asyncio shell
(:class:`~.connection.Connection`) implements them, and so do the core's tests, with no
network at all.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Events"]


class Events(Protocol):
    """The receiver of one core's events."""

    def on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        """A header block on a stream (a request, a response, or trailers); ``headers`` is the
        memo's list, not to be changed."""

    def on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        """DATA on a live stream (padding removed)."""

    def on_reset(self, stream_id: int, code: int) -> None:
        """The stream was reset: by the peer, or by the core for a stream error (``code`` is
        what the peer was sent)."""

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        """The peer's GOAWAY."""

    def on_settings(self) -> None:
        """The peer's settings changed (a client may now open more streams)."""

    def on_headers_too_large(self, stream_id: int, size: int, end_stream: bool) -> None:
        """The peer's header list decoded to more than ``max_header_list_size`` (but no more
        than twice that); the stream is open for an answer."""

    def on_local_end(self, stream_id: int) -> None:
        """Our side of the stream has ended (its END_STREAM is written)."""

    def on_output(self) -> None:
        """Output was queued (an answer, a reset, what a read made us owe), or answers are
        counted that a drained output resets: write it. A read that left neither is silent."""

    def on_terminate(self) -> None:
        """A connection error: the GOAWAY is queued (:attr:`~.core.Core.error` says why);
        write it and close."""

    def on_limit(self, limit: str, detail: str) -> None:
        """A stream-level limit of :class:`~.limits.Limits` refused something; the connection
        goes on."""
