"""The ``otlp`` exporter: OTLP over gRPC, as the OpenTelemetry Collector's exporter of that name.

Batches go out as the bytes they arrived as: a generic unary call with no serializer posts
``batch.serialize()`` to ``/opentelemetry.proto.collector.<signal>.v1.<Service>/Export``,
through the native transport (:mod:`.native`, the default) or, with ``implementation:
grpcio``, through grpc.aio (:class:`GrpcTransport`, here). Status codes are classified as the
OTLP specification says (:mod:`.channels`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import grpc
import grpc.aio

from gputally import __version__
from gputally.auth import BearerTokenAuth
from gputally.config.types import ClientTLSSettings
from gputally.errors import ConfigError
from gputally.exporterhelper.otlpconfig import Target
from gputally.exporterhelper.sender import QueuedExporter
from gputally.exporterhelper.settings import RetrySettings
from gputally.exporterhelper.transport import Receipt
from gputally.exporters.otlp.channels import ChannelKey, ChannelTransport, translate
from gputally.exporters.otlp.config import GrpcKeepalive, OTLPGrpcConfig
from gputally.exporters.otlp.native import NativeGrpcTransport
from gputally.h2 import parse_target
from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal
from gputally.pipeline.component import ComponentContext
from gputally.tls import grpc_channel_credentials

__all__ = ["GrpcTransport", "create_exporter"]

log = logging.getLogger(__name__)

_COMPRESSION = {"gzip": grpc.Compression.Gzip, "none": grpc.Compression.NoCompression}
_ChannelKey = tuple[str, ClientTLSSettings]


def _status_details(error: grpc.aio.AioRpcError) -> bytes | None:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            return value
    return None


class GrpcTransport(ChannelTransport[grpc.aio.Channel]):
    """The grpcio transport (``implementation: grpcio``): grpc.aio channels."""

    def __init__(
        self,
        targets: Mapping[Signal, Target],
        *,
        authenticator: BearerTokenAuth | None,
        retry: RetrySettings,
    ) -> None:
        super().__init__(targets, authenticator=authenticator, retry=retry)
        initial_ms = int(self._initial_backoff * 1000)
        self._options = [
            ("grpc.primary_user_agent", f"gputally/{__version__}"),
            ("grpc.initial_reconnect_backoff_ms", initial_ms),
            ("grpc.max_reconnect_backoff_ms", max(int(self._max_backoff * 1000), initial_ms)),
        ]
        self._calls: dict[Signal, grpc.aio.UnaryUnaryMultiCallable] = {}

    def add_options(self, options: list[tuple[str, int]]) -> None:
        self._options.extend(options)

    def _opened(self, signal: Signal, channel: grpc.aio.Channel) -> None:
        self._calls[signal] = channel.unary_unary(
            SIGNALS[signal].grpc_method, request_serializer=None, response_deserializer=None
        )

    async def _open(self, target: Target) -> grpc.aio.Channel:
        if target.tls.insecure:
            return grpc.aio.insecure_channel(target.endpoint, options=self._options)
        credentials = await asyncio.to_thread(grpc_channel_credentials, target.tls)
        options = list(self._options)
        if target.tls.server_name_override:
            options.append(("grpc.ssl_target_name_override", target.tls.server_name_override))
        return grpc.aio.secure_channel(target.endpoint, credentials, options=options)

    async def _watch(self, key: ChannelKey) -> None:
        """Mark the channel reached once it connects, without waiting for the first export."""
        channel = self._channels[key]
        try:
            state = channel.get_state(try_to_connect=True)
            while state is not grpc.ChannelConnectivity.READY and key not in self._reached:
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=True)
        except asyncio.CancelledError:
            raise
        except Exception:  # never let a watcher die silently
            log.exception("watching the gRPC channel to %s failed", key[0])
            return
        self._reached.add(key)

    async def send(self, batch: Batch) -> Receipt:
        signal = batch.signal
        target = self._targets[signal]
        try:
            raw = await self._calls[signal](
                batch.serialize(),
                timeout=target.timeout,
                metadata=self._metadata(target),
                compression=_COMPRESSION[target.compression],
                wait_for_ready=self._draining,
            )
        except grpc.aio.AioRpcError as exc:
            raise translate(exc.code(), exc.details(), _status_details(exc)) from exc
        return self._receipt(signal, target, raw)

    async def _close(self, channel: grpc.aio.Channel) -> None:
        await channel.close()


def create_exporter(
    config: OTLPGrpcConfig,
    context: ComponentContext,
    *,
    environ: Mapping[str, str],
) -> QueuedExporter:
    """Build the exporter, with ``environ`` supplying OTEL_EXPORTER_OTLP_* defaults."""
    targets = config.targets(environ)
    if any(t.tls.insecure_skip_verify and not t.tls.insecure for t in targets.values()):
        raise ConfigError(f"{context.id}: tls.insecure_skip_verify is not supported over gRPC; set tls.ca_file")
    for target in targets.values() if config.implementation == "native" else ():
        try:
            parse_target(target.endpoint)
        except ValueError as exc:
            raise ConfigError(f"{context.id}: endpoint: {exc}") from exc
    kind = NativeGrpcTransport if config.implementation == "native" else GrpcTransport
    transport = kind(targets, authenticator=context.authenticator(config.auth), retry=config.retry_on_failure)
    if isinstance(transport, NativeGrpcTransport):
        transport.keepalive = config.keepalive
    elif config.keepalive is not None:
        transport.add_options(keepalive_options(config.keepalive))
    return QueuedExporter.from_config(
        transport, retry=config.retry_on_failure, queue=config.sending_queue, context=context
    )


def keepalive_options(keepalive: GrpcKeepalive) -> list[tuple[str, int]]:
    """grpcio's channel options for the ``keepalive`` key."""
    return [("grpc.keepalive_time_ms", int(keepalive.time * 1000)),
            ("grpc.keepalive_timeout_ms", int(keepalive.timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", int(keepalive.permit_without_stream))]
