"""gRPC health checking (``grpc.health.v1``) on the OTLP gRPC port.

Load balancers and Kubernetes gRPC probes ask the overall status (service ``""``) or one OTLP
service. The answer is the service's readiness, the same predicate ``/readyz`` asks
(exporters connected, not shutting down): ``Check`` asks it at the moment of the call, so the
two never disagree, and a small background task polls it so that ``Watch`` streams see changes
too. Health checks need no auth.

The reporter serves either gRPC implementation: it registers grpcio's servicer on a grpc.aio
server, or gives the native server (:mod:`gputally.h2`) its own ``Check`` and ``Watch``
handlers over the same status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from gputally.h2 import GrpcError, Metadata, Method

__all__ = ["HealthReporter"]

log = logging.getLogger(__name__)

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
_SERVICE = "/grpc.health.v1.Health"


class _LiveHealthServicer(health_aio.HealthServicer):
    """grpcio's servicer, but ``Check`` refreshes the status first instead of answering the
    last polled one (which lagged ``/readyz`` by up to the poll interval)."""

    def __init__(self, refresh: Callable[[], Awaitable[None]]) -> None:
        super().__init__()
        self._refresh = refresh

    async def Check(  # noqa: N802
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse],
    ) -> health_pb2.HealthCheckResponse:
        if not self._gracefully_shutting_down:  # type: ignore[attr-defined]  # grpcio's, not in its stubs
            await self._refresh()
        return await super().Check(request, context)


class HealthReporter:
    """Keeps the health servicer of one gRPC server in step with ``is_ready``."""

    def __init__(
        self,
        *,
        name: str,
        services: Iterable[str],
        is_ready: Callable[[], bool],
        interval: float = 1.0,
    ) -> None:
        self._name = name
        self._services = ("", *services)
        self._is_ready = is_ready
        self._interval = interval
        self._servicer = _LiveHealthServicer(self._update)
        self._task: asyncio.Task[None] | None = None
        self._status: int | None = None
        self._check_failing = False
        self._shutting_down = False
        self._changed = asyncio.Event()

    def register(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)

    def methods(self) -> dict[str, Method]:
        """``Check`` and ``Watch`` for the native server."""
        return {f"{_SERVICE}/Check": Method(self._check), f"{_SERVICE}/Watch": Method(self._watch, streaming=True)}

    def _served(self, request: bytes) -> str:
        try:
            return health_pb2.HealthCheckRequest.FromString(request).service
        except Exception as exc:  # noqa: BLE001 (protobuf's DecodeError, or worse)
            raise GrpcError(grpc.StatusCode.INVALID_ARGUMENT, "not a HealthCheckRequest") from exc

    def _answer(self, service: str) -> int:
        if service not in self._services:
            return _UNKNOWN
        return _NOT_SERVING if self._shutting_down or self._status is None else self._status

    async def _check(self, request: bytes, metadata: Metadata) -> bytes:
        service = self._served(request)
        if not self._shutting_down:
            await self._update()
        if service not in self._services:
            raise GrpcError(grpc.StatusCode.NOT_FOUND, "Unknown service")
        return health_pb2.HealthCheckResponse(status=self._answer(service)).SerializeToString()

    async def _watch(self, request: bytes, metadata: Metadata, send: Callable[[bytes], None]) -> None:
        service = self._served(request)
        last: int | None = None
        while True:
            status = self._answer(service)
            if status != last:
                send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
                last = status
            changed = self._changed
            await changed.wait()

    async def start(self) -> None:
        """Publish the current status, then keep it current in the background."""
        await self._update()
        self._task = asyncio.create_task(self._poll(), name=f"{self._name}-health")

    async def shutdown(self) -> None:
        """Report NOT_SERVING for good (so balancers drain first) and stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._shutting_down = True
        self._notify()
        await self._servicer.enter_graceful_shutdown()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self._update()

    async def _update(self) -> None:
        try:
            ready = bool(self._is_ready())
            self._check_failing = False
        except Exception:
            if not self._check_failing:  # once per outage, not every interval
                log.exception("%s: readiness check failed; reporting NOT_SERVING", self._name)
            self._check_failing = True
            ready = False
        status = _SERVING if ready else _NOT_SERVING
        if status == self._status:
            return
        if self._status is not None:
            log.info("%s: health now %s", self._name, health_pb2.HealthCheckResponse.ServingStatus.Name(status))
        self._status = status
        self._notify()
        for service in self._services:
            await self._servicer.set(service, status)
