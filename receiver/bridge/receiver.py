"""The ``bridge`` receiver: run one gputally pipeline on a Collector's batch, in the call.

Each call of ``gputally.bridge.v1.Bridge/Process{Metrics,Logs,Traces}`` names a pipeline this
receiver feeds; the batch goes through that pipeline's processors (:meth:`Pipeline.process`)
and the answer is what comes out. Nothing the caller sent is exported here: the Collector
carries the answer on. What the processors create on their own (``usage``'s counters, summaries
and idle events) leaves through the pipeline's exporters, as in any pipeline. Codes follow
``proto/bridge/README.md``: NOT_FOUND for a pipeline it does not feed, FAILED_PRECONDITION for
one of another signal, INVALID_ARGUMENT for a batch that is not OTLP, RESOURCE_EXHAUSTED with
RetryInfo for backpressure, INTERNAL for a processor whose failure policy refuses.

Served on :class:`gputally.h2.Server` in the event loop's thread, as the ``otlp`` receiver's gRPC.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from gputally.auth import BearerTokenAuth
from gputally.endpoint import listen
from gputally.errors import InvalidRequest, Refused
from gputally.h2 import GrpcError, Metadata, Method, Server, metadata_value
from gputally.h2.server import UnaryHandler
from gputally.otlp.known import CheckedShapes
from gputally.otlp.signals import Signal
from gputally.pipeline.component import ComponentContext, Consumer, InlinePipeline, ProcessorFailed, Receiver
from gputally.proto.bridge.v1 import bridge_pb2
from gputally.tls import ServerTLS

from .config import BridgeReceiverConfig
from .patch import Patches, nameless_metrics, response_field

__all__ = ["METHODS", "BridgeReceiver", "create"]

log = logging.getLogger(__name__)

class _Call(Protocol):
    """A ``Process*Request`` of any signal (the three share their fields)."""

    otlp: bytes
    pipeline: str
    accept_patch: bool

    def ParseFromString(self, serialized: bytes) -> int: ...


class _Answer(Protocol):
    """A ``Process*Response`` of any signal."""

    otlp: bytes
    dropped_items: int
    error_message: str

    def SerializeToString(self) -> bytes: ...


_SERVICE = "/gputally.bridge.v1.Bridge"
METHODS: dict[Signal, tuple[str, Callable[[], _Call], Callable[[], _Answer]]] = {
    Signal.METRICS: (f"{_SERVICE}/ProcessMetrics", bridge_pb2.ProcessMetricsRequest, bridge_pb2.ProcessMetricsResponse),
    Signal.LOGS: (f"{_SERVICE}/ProcessLogs", bridge_pb2.ProcessLogsRequest, bridge_pb2.ProcessLogsResponse),
    Signal.TRACES: (f"{_SERVICE}/ProcessTraces", bridge_pb2.ProcessTracesRequest, bridge_pb2.ProcessTracesResponse),
}
"""Per signal: the method's path, its request and its response message."""
_MAX_GRACE = 5.0
"""Longest wait for calls in flight at shutdown: the Collector's own timeout is shorter."""


class BridgeReceiver(Receiver):
    """Serves the bridge API for the pipelines that list this receiver."""

    def __init__(self, config: BridgeReceiverConfig, context: ComponentContext, *, reuse_port: bool = False) -> None:
        self._config = config
        self._name = context.id
        self._pipelines: Mapping[str, InlinePipeline] = context.inline
        self._auth: BearerTokenAuth | None = context.authenticator(config.auth)
        self._tls = ServerTLS.load(config.tls, f"receivers::{context.id}") if config.tls else None
        self._metrics = context.telemetry.for_receiver(context.id, "grpc")
        self._checked = CheckedShapes(budget=config.checked_shapes_mib << 20)
        self._patches = Patches()
        self._grace = min(context.shutdown_timeout, _MAX_GRACE)
        self._reuse_port = reuse_port
        self._server: Server | None = None
        self._address: str | None = None

    def listening(self) -> dict[str, str]:
        return {"grpc": self._address} if self._address else {}

    async def start(self) -> None:
        served = {pipeline.signal for pipeline in self._pipelines.values()}
        methods = {path: Method(self._handler(signal)) for signal, (path, _, _) in METHODS.items() if signal in served}
        server = Server(methods, max_receive_message_length=self._config.max_recv_msg_size,
                        ssl_context=self._tls.h2_ssl_context if self._tls else None, reuse_port=self._reuse_port)
        self._address = await listen(server, self._config.endpoint, where=f"receivers::{self._name}: endpoint")
        self._server = server
        log.info("%s: bridge for %s on %s", self._name, ", ".join(sorted(self._pipelines)), self._address)

    async def shutdown(self) -> None:
        """Refuse new calls and give those in flight a short grace. Idempotent."""
        server, self._server = self._server, None
        self._address = None
        if server is not None:
            await server.shutdown(self._grace)

    def _handler(self, signal: Signal) -> UnaryHandler:
        _, request_type, response_type = METHODS[signal]

        async def handle(request: bytes, metadata: Metadata) -> bytes:
            if self._auth is not None:
                if not self._auth.verify(metadata_value(metadata, "authorization")):
                    raise self._refuse(signal, grpc.StatusCode.UNAUTHENTICATED, "missing or invalid authorization",
                                       reason="unauthenticated")
            call = request_type()
            try:
                call.ParseFromString(request)
            except DecodeError:
                raise self._refuse(signal, grpc.StatusCode.INVALID_ARGUMENT, "not a bridge request") from None
            pipeline = self._pipeline(signal, call.pipeline)
            response = response_type()
            dropped, patch = await self._process(signal, pipeline, call.otlp, response, patch=call.accept_patch)
            response.dropped_items = dropped
            if dropped:
                response.error_message = f"pipeline {pipeline.id} dropped {dropped} of the batch's items"
            if patch is None:
                return response.SerializeToString()
            return response.SerializeToString() + patch  # its field appended, not parsed into the message

        return handle

    def _pipeline(self, signal: Signal, pipeline_id: str) -> InlinePipeline:
        if not pipeline_id:
            raise self._refuse(signal, grpc.StatusCode.INVALID_ARGUMENT, "pipeline: required")
        pipeline = self._pipelines.get(pipeline_id)
        if pipeline is None:
            fed = ", ".join(sorted(self._pipelines)) or "none"
            raise self._refuse(signal, grpc.StatusCode.NOT_FOUND,
                               f"no pipeline {pipeline_id!r} lists receiver {self._name} (it feeds: {fed})")
        if pipeline.signal is not signal:
            raise self._refuse(signal, grpc.StatusCode.FAILED_PRECONDITION,
                               f"pipeline {pipeline_id!r} is a {pipeline.signal} pipeline, not {signal}")
        return pipeline

    async def _process(self, signal: Signal, pipeline: InlinePipeline, otlp: bytes, response: _Answer, *,
                       patch: bool) -> tuple[int, bytes | None]:
        """Run the batch; put what comes out in ``response.otlp``, or return what changed (the
        encoded ``patch`` field) when the caller takes a patch and the pipeline only annotates;
        and the items dropped."""
        try:
            batch = self._checked.decode(signal, otlp)
        except InvalidRequest as exc:
            raise self._refuse(signal, grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        received = batch.items  # a processor may change the batch in place
        before = batch.serialize()  # bytes: what processors do later cannot change them
        sent = received + batch.rejected  # items as the caller holds them (nameless metrics included)
        try:
            result = await pipeline.process(batch)
        except Refused as exc:
            raise self._refuse(signal, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc) or "refused, retry later",
                               items=batch.items, reason="backpressure", retry_after=exc.retry_after) from None
        except ProcessorFailed:  # the pipeline logged the cause once
            raise self._refuse(signal, grpc.StatusCode.INTERNAL, "internal error in a processor; see the gputally log",
                               items=batch.items, reason="internal") from None
        except Exception:
            log.exception("%s: unexpected error while processing a %s batch in %s", self._name, signal, pipeline.id)
            raise self._refuse(signal, grpc.StatusCode.INTERNAL, "internal error in the receiver; see the gputally log",
                               items=batch.items, reason="internal") from None
        self._metrics.accepted[signal].inc(received)
        if batch.rejected:
            self._metrics.rejected[signal].inc(batch.rejected)
        if result is None:
            return received + batch.rejected, None
        after = result.serialize()
        if patch and pipeline.annotates:
            # Metrics without a name were dropped by the decode; the caller still holds them.
            drops = nameless_metrics(otlp) if sent > received else None
            change = self._patches.build(before, after, items=sent, drops=drops)
            if change is not None:
                return max(0, received - result.items) + batch.rejected, response_field(change)
        response.otlp = after
        return max(0, received - result.items) + batch.rejected, None

    def _refuse(self, signal: Signal, code: grpc.StatusCode, message: str, *, items: int = 0, reason: str = "invalid",
                retry_after: float | None = None) -> GrpcError:
        """The error for a refused call, counted as the ``otlp`` receiver counts its refusals."""
        self._metrics.refused(signal, reason).inc(items)
        status = status_pb2.Status(code=code.value[0], message=message)
        if retry_after is not None:
            delay = Duration()
            delay.FromNanoseconds(round(retry_after * 1e9))
            status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        return GrpcError(code, message, (("grpc-status-details-bin", status.SerializeToString()),))


def create(
    config: BridgeReceiverConfig, context: ComponentContext, consumers: Mapping[Signal, Consumer], *,
    reuse_port: bool = False,
) -> BridgeReceiver:
    """Factory hook. ``consumers`` go unused: a bridge answers with its pipelines' output
    (``context.inline``) instead of handing requests on."""
    return BridgeReceiver(config, context, reuse_port=reuse_port)
