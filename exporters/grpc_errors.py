"""gRPC statuses as export errors, per the OTLP specification's retry rules, for both transports.

CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE and DATA_LOSS are retried,
RESOURCE_EXHAUSTED only when the server sent RetryInfo (its delay then replaces our backoff);
anything else is permanent.
"""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from gputally.errors import ExportError, PermanentExportError, TransientExportError

__all__ = ["translate"]

_RETRYABLE = frozenset({
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
})

def _retry_delay(details: bytes | None) -> float | None:
    """Seconds from a RetryInfo in a ``grpc-status-details-bin`` trailer, if the server sent one."""
    if not details:
        return None
    try:
        status = status_pb2.Status.FromString(details)
    except DecodeError:
        return None  # malformed grpc-status-details-bin
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return max(float(info.retry_delay.ToTimedelta().total_seconds()), 0.0)
    return None


def translate(code: grpc.StatusCode, details: str | None, status_details: bytes | None) -> ExportError:
    """The gputally error for a failed call (its code, message and ``grpc-status-details-bin``),
    per the OTLP specification's retry rules."""
    delay = _retry_delay(status_details)
    message = f"{code.name}: {details}"
    if code in _RETRYABLE or (code is grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None):
        return TransientExportError(message, retry_after=delay)
    return PermanentExportError(message)
