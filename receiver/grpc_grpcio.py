"""OTLP/gRPC on grpc.aio (``implementation: grpcio``): the three ``Export`` methods and health
checking on one gRPC core server.

Requests arrive as raw bytes (no deserializer), are checked once by ``Intake.decode`` and
forwarded as the same bytes. gzip is decompressed by gRPC core. The size rules are
:mod:`.grpc_export`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
from grpc_status import rpc_status

from gputally.errors import ConfigError
from gputally.otlp.signals import SIGNALS, Signal

from .config import GRPCSettings, split_endpoint
from .grpc_export import CORE_LIMIT_FACTOR, export
from .health import HealthReporter
from .intake import Intake
from .net import bind_problem, host_port
from .status import Failure
from .tls import ServerTLS

__all__ = ["GrpcioServer"]

log = logging.getLogger(__name__)

class GrpcioServer:
    """The gRPC listener of one ``otlp`` receiver, on grpc.aio."""

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
        self._server: grpc.aio.Server | None = None
        self._address: str | None = None

    @property
    def address(self) -> str | None:
        """Where the server listens (the real port when configured with 0); None when it does not."""
        return self._address

    async def start(self) -> None:
        """Bind and serve; a port that cannot be bound raises ConfigError."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", CORE_LIMIT_FACTOR * self._limit),
                # gRPC turns SO_REUSEPORT on by default, which lets a second instance share the
                # port silently; only a deliberate multi-process setup should.
                ("grpc.so_reuseport", 1 if self._reuse_port else 0),
            ]
        )
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(SIGNALS[signal].service, {"Export": self._export_handler(signal)})
                for signal in sorted(self._intake.signals)
            ]
        )
        self._health.register(server)
        self._address = self._bind(server)
        self._server = server
        try:
            await self._health.start()
            await server.start()
        except BaseException:
            await self.shutdown()
            raise
        log.info("%s: OTLP/gRPC listening on %s%s", self._name, self._address, " (TLS)" if self._tls else "")

    async def shutdown(self) -> None:
        """Report NOT_SERVING, refuse new calls, and give calls in flight the grace period."""
        if self._server is None:
            return
        server, self._server = self._server, None
        await self._health.shutdown()
        await server.stop(self._grace)
        log.info("%s: OTLP/gRPC on %s stopped", self._name, self._address)
        self._address = None

    def _bind(self, server: grpc.aio.Server) -> str:
        endpoint = self._settings.endpoint
        if endpoint.startswith("unix:"):
            host, port = "", 0
            target = endpoint
        else:
            host, port = split_endpoint(endpoint)
            target = host_port(host, port)
        try:
            if self._tls is not None:
                bound = server.add_secure_port(target, self._tls.grpc_credentials())
            else:
                bound = server.add_insecure_port(target)
        except RuntimeError:
            bound = 0
        if not bound:
            problem = (
                "cannot bind the unix socket (does its directory exist, and may gputally write there?)"
                if endpoint.startswith("unix:")
                else bind_problem(host, port)
            )
            raise ConfigError(f"receivers::{self._name}: grpc endpoint {endpoint}: {problem}")
        return endpoint if endpoint.startswith("unix:") else host_port(host, bound)

    def _export_handler(self, signal: Signal) -> grpc.RpcMethodHandler[bytes, bytes]:
        intake, limit = self._intake, self._limit

        async def handle(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            outcome = await export(intake, signal, request, _metadata(context, "authorization"), limit)
            if not isinstance(outcome, Failure):
                return outcome
            status = rpc_status.to_status(outcome.rpc_status())
            await context.abort(status.code, status.details, status.trailing_metadata)

        # No (de)serializers: the handler gets and returns bytes, so each request is parsed once.
        return grpc.unary_unary_rpc_method_handler(handle)


def _metadata(context: grpc.aio.ServicerContext[bytes, bytes], key: str) -> str | bytes | None:
    for item_key, value in context.invocation_metadata() or ():
        if item_key == key:
            return value
    return None
