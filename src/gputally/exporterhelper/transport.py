"""The one-request interface under the queue and retry: a transport sends a batch once.

Transports translate their library's failures into :class:`~gputally.errors.PermanentExportError`
or :class:`~gputally.errors.TransientExportError` (with the server's throttle hint), so queue
and retry are written once, and tests can swap in an in-process transport.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal

__all__ = ["Receipt", "Transport", "receipt_from_response"]

@dataclass(frozen=True)
class Receipt:
    """The backend's answer to an accepted request: OTLP partial success, if any."""

    rejected: int = 0
    message: str = ""


def receipt_from_response(signal: Signal, response: Any) -> Receipt:
    """Read ``partial_success`` from a decoded Export*ServiceResponse."""
    if not response.HasField("partial_success"):
        return Receipt()
    partial = response.partial_success
    return Receipt(rejected=int(getattr(partial, SIGNALS[signal].rejected_field)), message=partial.error_message)


class Transport(Protocol):
    """Sends one batch, once. ``start`` and ``close`` bracket its connections."""

    @property
    def description(self) -> str:
        """Where it sends, for log lines."""
        ...

    @property
    def ready(self) -> bool:
        """True once the backend has been reached."""
        ...

    async def start(self) -> None: ...

    async def send(self, batch: Batch) -> Receipt:
        """Send ``batch``; raise PermanentExportError or TransientExportError on failure."""
        ...

    def drain(self) -> None:
        """Shutdown has begun: from now on each send is a last attempt for its batch.

        A transport with its own reconnect backoff (gRPC) waits for the connection, within the
        request timeout, instead of failing fast, so a backend that came back just before
        shutdown still gets the data.
        """
        ...

    async def close(self) -> None: ...
