"""Why a request failed, and how each transport says so (OTLP spec, "Failures").

One :class:`Failure` value describes a failed request for both transports: the gRPC code, the
HTTP status, the reason label for self-metrics, and the ``google.rpc.Status`` (with
``RetryInfo`` for backpressure) that both send back. OTLP clients retry RESOURCE_EXHAUSTED
and 429 only when a retry delay is given, so backpressure always carries one.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc import code_pb2, error_details_pb2, status_pb2

from gputally.errors import InvalidRequest, Refused

__all__ = ["Failure", "Reason"]


class Reason(enum.StrEnum):
    """The ``reason`` label of ``gputally_receiver_refused_items``."""

    INVALID = "invalid"
    TOO_LARGE = "too_large"
    UNAUTHENTICATED = "unauthenticated"
    BACKPRESSURE = "backpressure"
    INTERNAL = "internal"


_GRPC_CODES = {
    Reason.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Reason.BACKPRESSURE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.INTERNAL: grpc.StatusCode.INTERNAL,
}
_HTTP_STATUS = {
    Reason.INVALID: 400,
    Reason.TOO_LARGE: 413,
    Reason.UNAUTHENTICATED: 401,
    Reason.BACKPRESSURE: 429,
    Reason.INTERNAL: 500,
}
_RPC_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: code_pb2.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED: code_pb2.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: code_pb2.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL: code_pb2.INTERNAL,
}


@dataclass(frozen=True)
class Failure:
    """A request the receiver did not take, and what to tell its sender."""

    reason: Reason
    message: str
    retry_after: float | None = None
    """Seconds the sender should wait before retrying; set for backpressure only."""
    unsupported: bool = False
    """An invalid request in a content type or coding the receiver does not speak (HTTP 415)."""

    @classmethod
    def invalid(cls, message: str) -> Failure:
        return cls(Reason.INVALID, message)

    @classmethod
    def unsupported_media(cls, message: str) -> Failure:
        return cls(Reason.INVALID, message, unsupported=True)

    @classmethod
    def too_large(cls, size: int | None, limit: int, setting: str) -> Failure:
        what = f"request of {size} bytes" if size is not None else "request"
        return cls(Reason.TOO_LARGE, f"{what} exceeds the limit of {limit} bytes ({setting})")

    @classmethod
    def unauthenticated(cls) -> Failure:
        return cls(Reason.UNAUTHENTICATED, "missing or invalid authorization")

    @classmethod
    def internal(cls) -> Failure:
        # The cause is logged; it is not the sender's business and may hold internal detail.
        return cls(Reason.INTERNAL, "internal error in the receiver; see the gputally log")

    @classmethod
    def from_error(cls, exc: InvalidRequest | Refused) -> Failure:
        """The failure for one of gputally's own request errors."""
        if isinstance(exc, Refused):
            return cls(Reason.BACKPRESSURE, str(exc) or "refused, retry later", retry_after=exc.retry_after)
        return cls.invalid(str(exc))

    @property
    def grpc_code(self) -> grpc.StatusCode:
        return _GRPC_CODES[self.reason]

    @property
    def http_status(self) -> int:
        return 415 if self.unsupported else _HTTP_STATUS[self.reason]

    @property
    def retry_after_header(self) -> str | None:
        """``Retry-After`` value: whole seconds, rounded up so the sender never comes back early."""
        if self.retry_after is None:
            return None
        return str(max(0, math.ceil(self.retry_after)))

    def rpc_status(self) -> status_pb2.Status:
        """``google.rpc.Status`` for the response, with ``RetryInfo`` when a delay is known."""
        status = status_pb2.Status(code=_RPC_CODES[self.grpc_code], message=self.message)
        if self.retry_after is not None:
            delay = Duration()
            delay.FromNanoseconds(max(0, round(self.retry_after * 1e9)))
            status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        return status
