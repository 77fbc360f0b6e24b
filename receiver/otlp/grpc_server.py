"""OTLP/gRPC on gputally's own HTTP/2 server (``implementation: native``, the default).

The three ``Export`` methods and ``grpc.health.v1`` on :class:`gputally.h2.Server`, which runs
in the event loop's thread: a request costs about half what it costs through grpc.aio, whose
core polls its completion queue from a thread of its own (``bench/grpc_floor.py``). Requests
are handled exactly as the grpcio implementation handles them (:mod:`.grpc_export`): the same
checks, counts, codes, messages and RetryInfo.
"""

from __future__ import annotations

import logging

from grpc_status import rpc_status

from gputally.endpoint import listen
from gputally.h2 import GrpcError, Metadata, Method, Server, metadata_value
from gputally.h2.limits import Limits
from gputally.h2.server import TooLargeHandler, UnaryHandler
from gputally.otlp.signals import SIGNALS, Signal

from .config import GRPCSettings
from .grpc_export import CORE_LIMIT_FACTOR, GRPCListener, export, refuse_too_large
from .status import Failure

__all__ = ["GRPCServer", "h2_limits"]

log = logging.getLogger(__name__)

_MIB = 1024 * 1024


class GRPCServer(GRPCListener):
    """The gRPC listener of one ``otlp`` receiver, on :class:`gputally.h2.Server`."""

    _server: Server | None = None

    async def _listen(self) -> str:
        methods = {
            SIGNALS[s].grpc_method: Method(self._export_handler(s), max_request=self._limit,
                                           too_large=self._too_large_handler(s))
            for s in sorted(self._intake.signals)
        }
        methods.update(self._health.methods())
        self._server = Server(
            methods,
            max_receive_message_length=CORE_LIMIT_FACTOR * self._limit,
            ssl_context=self._tls.h2_ssl_context if self._tls else None,
            reuse_port=self._reuse_port,
            limits=h2_limits(self._settings),
        )
        return await self._bind(self._server)

    async def _stop(self, grace: float) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.shutdown(grace)

    async def _bind(self, server: Server) -> str:
        return await listen(server, self._settings.endpoint, where=f"receivers::{self._name}: grpc endpoint")

    def _export_handler(self, signal: Signal) -> UnaryHandler:
        intake, limit = self._intake, self._limit

        async def handle(request: bytes, metadata: Metadata) -> bytes:
            outcome = await export(intake, signal, request, metadata_value(metadata, "authorization"), limit)
            if not isinstance(outcome, Failure):
                return outcome
            status = rpc_status.to_status(outcome.rpc_status())
            raise GrpcError(status.code, status.details, tuple(status.trailing_metadata))

        return handle

    def _too_large_handler(self, signal: Signal) -> TooLargeHandler:
        """A gzip request that inflated past the limit: answered as :func:`export` answers an
        oversized one, without its bytes (only their count was kept)."""
        intake, limit = self._intake, self._limit

        async def refuse(size: int, metadata: Metadata) -> bytes:
            failure = refuse_too_large(intake, signal, size, metadata_value(metadata, "authorization"), limit)
            status = rpc_status.to_status(failure.rpc_status())
            raise GrpcError(status.code, status.details, tuple(status.trailing_metadata))

        return refuse


def h2_limits(settings: GRPCSettings) -> Limits:
    """The native server's limits from ``protocols.grpc``."""
    limits, keepalive = settings.limits, settings.keepalive.server_parameters
    return Limits(
        max_concurrent_streams=settings.max_concurrent_streams,
        max_header_list_size=limits.max_header_list_size,
        max_continuation_frames=limits.max_continuation_frames,
        max_queued_control_frames=limits.max_queued_control_frames,
        max_settings_entries=limits.max_settings_entries,
        reset_burst=limits.reset_burst,
        reset_rate=limits.reset_rate,
        max_buffered_request_bytes=limits.max_buffered_request_mib * _MIB,
        max_process_buffered_request_bytes=limits.max_process_buffered_request_mib * _MIB,
        max_output_buffer=limits.max_output_buffer_kib * 1024,
        write_timeout=limits.write_timeout,
        read_timeout=limits.read_timeout,
        max_connection_idle=keepalive.max_connection_idle,
        max_connection_age=keepalive.max_connection_age,
        max_connection_age_grace=keepalive.max_connection_age_grace,
        keepalive_time=keepalive.time,
        keepalive_timeout=keepalive.timeout,
    )
