"""What both gRPC implementations of the receiver share: one OTLP ``Export`` call (auth, size,
delivery) and the listener's state.

Size limit: OTLP wants INVALID_ARGUMENT (not retryable) for an oversized request, but gRPC
answers RESOURCE_EXHAUSTED itself for messages over its receive limit (both grpc.aio's core
and the native server, before the handler sees the request). So that limit is set to
``CORE_LIMIT_FACTOR`` times ``max_recv_msg_size_mib`` and the handler answers
INVALID_ARGUMENT between 1x and 4x. Beyond 4x the transport answers RESOURCE_EXHAUSTED
without RetryInfo, which OTLP clients also treat as not retryable, and the request is never
seen or counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gputally.otlp.signals import SIGNALS, Signal
from gputally.tls.server import ServerTLS

from .config import GRPCSettings
from .health import HealthReporter
from .intake import Intake
from .status import Failure

__all__ = ["CORE_LIMIT_FACTOR", "GRPCListener", "export", "refuse_too_large"]

log = logging.getLogger(__name__)

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


def refuse_too_large(intake: Intake, signal: Signal, size: int, authorization: str | bytes | None,
                     limit: int) -> Failure:
    """What :func:`export` answers a request of ``size`` bytes over ``limit``, for a transport
    that counted an inflating request's bytes instead of keeping them."""
    failure = intake.authorize(signal, authorization)
    return failure or intake.refuse(signal, Failure.too_large(size, limit, "max_recv_msg_size_mib"))


class GRPCListener:
    """What both gRPC implementations' listeners of one ``otlp`` receiver keep: settings,
    intake, TLS, health, the bound address. Subclasses start and stop their server."""

    def __init__(
        self,
        settings: GRPCSettings,
        *,
        name: str,
        intake: Intake,
        tls: ServerTLS | None,
        is_ready: Callable[[], bool],
        reuse_port: bool,
        grace: float,
        health_interval: float,
    ) -> None:
        self._settings = settings
        self._grace = grace
        self._name = name
        self._intake = intake
        self._tls = tls
        self._reuse_port = reuse_port
        self._limit = settings.max_recv_bytes
        self._health = HealthReporter(
            name=f"{name}/grpc",
            services=[SIGNALS[s].service for s in sorted(intake.signals)],
            is_ready=is_ready,
            interval=health_interval,
        )
        self._address: str | None = None
        self._started = False

    @property
    def address(self) -> str | None:
        """Where the server listens (the real port when configured with 0); None when it does not."""
        return self._address

    async def start(self) -> None:
        """Bind and serve; a port that cannot be bound raises ConfigError."""
        self._started = True
        try:
            self._address = await self._listen()
            await self._health.start()
        except BaseException:
            await self.shutdown()
            raise
        log.info("%s: OTLP/gRPC listening on %s%s", self._name, self._address, " (TLS)" if self._tls else "")

    async def shutdown(self) -> None:
        """Report NOT_SERVING, refuse new calls, and give calls in flight the grace period."""
        if not self._started:
            return
        self._started = False
        await self._health.shutdown()
        await self._stop(self._grace)
        if self._address is not None:
            log.info("%s: OTLP/gRPC on %s stopped", self._name, self._address)
        self._address = None

    async def _listen(self) -> str:
        """Build, bind and start the server; the address it listens on."""
        raise NotImplementedError

    async def _stop(self, grace: float) -> None:
        """Stop the server (if it was built), giving calls in flight ``grace`` seconds."""
        raise NotImplementedError
