"""A real OTLP/gRPC backend on loopback that records what it is sent, for any test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

SERVICES = {
    "opentelemetry.proto.collector.metrics.v1.MetricsService": ExportMetricsServiceRequest,
    "opentelemetry.proto.collector.logs.v1.LogsService": ExportLogsServiceRequest,
    "opentelemetry.proto.collector.trace.v1.TraceService": ExportTraceServiceRequest,
}


@dataclass
class OtlpSink:
    """An OTLP/gRPC backend that records every request it is sent, by service name."""

    port: int = 0
    """0: the kernel picks one when it starts (read it back from :attr:`port`); a fixed one
    only where a test must know it before the sink is up."""
    received: dict[str, list[bytes]] = field(default_factory=lambda: {name: [] for name in SERVICES})
    _server: grpc.aio.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        def handler(service: str) -> grpc.RpcMethodHandler:
            async def export(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                self.received[service].append(request)
                return b""

            return grpc.unary_unary_rpc_method_handler(export)

        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(name, {"Export": handler(name)}) for name in SERVICES]
        )
        self.port = server.add_insecure_port(self.endpoint)
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    def received_metrics(self) -> list[bytes]:
        return self.received["opentelemetry.proto.collector.metrics.v1.MetricsService"]

    def messages(self, service: str = "opentelemetry.proto.collector.metrics.v1.MetricsService") -> list:  # type: ignore[type-arg]
        parse = SERVICES[service].FromString
        return [parse(raw) for raw in self.received[service]]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("the sink did not receive what was expected in time")
            await asyncio.sleep(0.02)


