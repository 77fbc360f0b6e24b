"""One OTLP ``Export`` call, whichever gRPC implementation carried it: auth, size, delivery.

Size limit: OTLP wants INVALID_ARGUMENT (not retryable) for an oversized request, but gRPC
answers RESOURCE_EXHAUSTED itself for messages over its receive limit (both grpc.aio's core
and the native server, before the handler sees the request). So that limit is set to
``CORE_LIMIT_FACTOR`` times ``max_recv_msg_size_mib`` and the handler answers
INVALID_ARGUMENT between 1x and 4x. Beyond 4x the transport answers RESOURCE_EXHAUSTED
without RetryInfo, which OTLP clients also treat as not retryable, and the request is never
seen or counted.
"""

from __future__ import annotations

from gputally.otlp.signals import Signal

from .intake import Intake
from .status import Failure

__all__ = ["CORE_LIMIT_FACTOR", "export"]

CORE_LIMIT_FACTOR = 4


async def export(intake: Intake, signal: Signal, request: bytes, authorization: str | bytes | None,
                 limit: int) -> bytes | Failure:
    """The serialized Export response, or the failure to answer with."""
    failure = intake.authorize(signal, authorization)
    if failure is None and len(request) > limit:
        failure = intake.refuse(signal, Failure.too_large(len(request), limit, "max_recv_msg_size_mib"))
    if failure is not None:
        return failure
    outcome = await intake.deliver(signal, lambda: intake.decode(signal, request))
    if isinstance(outcome, Failure):
        return outcome
    return bytes(outcome.SerializeToString())
