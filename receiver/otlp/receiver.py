"""The ``otlp`` receiver: an OTLP/gRPC server and an OTLP/HTTP server feeding the same pipelines."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from gputally.config.types import AuthSettings
from gputally.otlp.batch import Signal
from gputally.otlp.known import CheckedShapes
from gputally.pipeline.component import ComponentContext, Consumer, Receiver
from gputally.tls.server import ServerTLS

from .config import OTLPReceiverConfig
from .grpc_grpcio import GrpcioServer
from .grpc_server import GRPCServer
from .http_server import HTTPServer
from .intake import Intake

__all__ = ["MAX_GRACE", "OTLPReceiver", "create"]

MAX_GRACE = 5.0
"""Longest wait for requests in flight at shutdown: they are small, and exporters drain after us."""


class OTLPReceiver(Receiver):
    """Accepts OTLP metrics, logs and traces and hands each request to the signal's consumer.

    Everything that can be checked before binding (authenticators, TLS files) is checked
    here, so a bad config fails when the service is built; ports are bound by :meth:`start`.
    """

    def __init__(
        self,
        config: OTLPReceiverConfig,
        context: ComponentContext,
        consumers: Mapping[Signal, Consumer],
        *,
        reuse_port: bool = False,
        health_interval: float = 1.0,
    ) -> None:
        grace = min(context.shutdown_timeout, MAX_GRACE)
        where = f"receivers::{context.id}: protocols"
        self._grpc: GRPCServer | GrpcioServer | None = None
        self._http: HTTPServer | None = None
        self._started = False
        grpc, http = config.protocols.grpc, config.protocols.http
        checked = CheckedShapes(budget=config.checked_shapes_mib << 20)  # one cache for both transports

        def intake(transport: str, auth: AuthSettings | None) -> Intake:
            return Intake(name=context.id, consumers=consumers, checked=checked,
                          metrics=context.telemetry.for_receiver(context.id, transport),
                          auth=context.authenticator(auth))

        if grpc is not None:
            server = GRPCServer if grpc.implementation == "native" else GrpcioServer
            self._grpc = server(
                grpc,
                name=context.id,
                intake=intake("grpc", grpc.auth),
                tls=ServerTLS.load(grpc.tls, f"{where}.grpc") if grpc.tls else None,
                is_ready=context.is_ready,
                reuse_port=reuse_port,
                grace=grace,
                health_interval=health_interval,
            )
        if http is not None:
            self._http = HTTPServer(
                http,
                name=context.id,
                intake=intake("http", http.auth),
                tls=ServerTLS.load(http.tls, f"{where}.http") if http.tls else None,
                reuse_port=reuse_port,
                grace=grace,
                registry=context.telemetry.registry,
            )

    @property
    def grpc_address(self) -> str | None:
        """``host:port`` (or ``unix:...``) the gRPC server is bound to; None when not serving."""
        return self._grpc.address if self._grpc else None

    @property
    def http_address(self) -> str | None:
        """``host:port`` the HTTP server is bound to; None when not serving."""
        return self._http.address if self._http else None

    def listening(self) -> dict[str, str]:
        addresses = {"grpc": self.grpc_address, "http": self.http_address}
        return {transport: address for transport, address in addresses.items() if address}

    async def start(self) -> None:
        """Bind both servers; a port that cannot be bound raises ConfigError and nothing stays bound."""
        if self._started:
            raise RuntimeError("an OTLPReceiver starts once")
        self._started = True
        try:
            for server in self._servers():
                await server.start()
        except BaseException:
            await self.shutdown()
            raise

    async def shutdown(self) -> None:
        """Stop accepting, let requests in flight finish (bounded by the grace period). Idempotent."""
        await asyncio.gather(*(server.shutdown() for server in self._servers()))

    def _servers(self) -> list[GRPCServer | GrpcioServer | HTTPServer]:
        return [server for server in (self._grpc, self._http) if server is not None]


def create(
    config: OTLPReceiverConfig,
    context: ComponentContext,
    consumers: Mapping[Signal, Consumer],
    *,
    reuse_port: bool = False,
) -> OTLPReceiver:
    """Factory hook; ``reuse_port`` lets several gputally processes share the ports."""
    return OTLPReceiver(config, context, consumers, reuse_port=reuse_port)
