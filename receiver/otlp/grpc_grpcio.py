"""OTLP/gRPC on grpc.aio (``implementation: grpcio``): the three ``Export`` methods and health
checking on one gRPC core server.

Requests arrive as raw bytes (no deserializer), are checked once by ``Intake.decode`` and
forwarded as the same bytes. gzip is decompressed by gRPC core. The size rules are
:mod:`.grpc_export`'s.
"""

from __future__ import annotations

import logging

import grpc
from grpc_status import rpc_status

from gputally.endpoint import bind_problem, host_port, split_endpoint
from gputally.errors import ConfigError
from gputally.otlp.signals import SIGNALS, Signal

from .grpc_export import CORE_LIMIT_FACTOR, GRPCListener, export
from .status import Failure

__all__ = ["GrpcioServer"]

log = logging.getLogger(__name__)


class GrpcioServer(GRPCListener):
    """The gRPC listener of one ``otlp`` receiver, on grpc.aio."""

    _server: grpc.aio.Server | None = None

    async def _listen(self) -> str:
        keepalive = self._settings.keepalive.server_parameters
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", CORE_LIMIT_FACTOR * self._limit),
                # What gRPC core lets us bound of the native server's limits (receiver/README.md).
                ("grpc.max_concurrent_streams", self._settings.max_concurrent_streams),
                ("grpc.max_metadata_size", self._settings.limits.max_header_list_size),
                ("grpc.keepalive_time_ms", int(keepalive.time * 1000) or 2**31 - 1),
                ("grpc.keepalive_timeout_ms", int(keepalive.timeout * 1000)),
                *([("grpc.max_connection_idle_ms", int(keepalive.max_connection_idle * 1000))]
                  if keepalive.max_connection_idle else []),
                *([("grpc.max_connection_age_ms", int(keepalive.max_connection_age * 1000))]
                  if keepalive.max_connection_age else []),
                *([("grpc.max_connection_age_grace_ms", int(keepalive.max_connection_age_grace * 1000))]
                  if keepalive.max_connection_age_grace else []),
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
        address = self._bind(server)
        self._server = server
        await server.start()
        return address

    async def _stop(self, grace: float) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)

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
