"""Test helpers for the otlp receiver: request builders, a recording consumer, a raw gRPC client."""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import trustme
from google.rpc import status_pb2
from grpc_status import rpc_status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gputally.auth import BearerTokenAuth, BearerTokenAuthConfig
from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal
from gputally.pipeline.component import ComponentContext
from gputally.receiver.otlp import OTLPReceiver
from gputally.telemetry import SelfTelemetry

TOKEN = "s3cret-token"
TRACE_ID = bytes.fromhex("5b8efff798038103d269b633813fc60c")
SPAN_ID = bytes.fromhex("eee19b7ec3c1b174")
PARENT_ID = bytes.fromhex("eee19b7ec3c1b173")


class Recorder:
    """A consumer that keeps what it is given, or raises ``error`` when one is set."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.error: Exception | None = None

    async def consume(self, batch: Batch) -> None:
        if self.error is not None:
            raise self.error
        self.batches.append(batch)

    @property
    def raw(self) -> list[bytes]:
        return [b.serialize() for b in self.batches]


def metrics_request(points: int = 3, *, nameless: int = 0) -> ExportMetricsServiceRequest:
    """One gauge with ``points`` points, plus ``nameless`` one-point metrics without a name."""
    request = ExportMetricsServiceRequest()
    scope = request.resource_metrics.add().scope_metrics.add()
    gauge = scope.metrics.add(name="gpu.utilization").gauge
    for i in range(points):
        point = gauge.data_points.add(time_unix_nano=1_700_000_000_000_000_000 + i, as_double=0.5)
        point.attributes.add(key="gpu", value={"string_value": str(i)})
    for _ in range(nameless):
        scope.metrics.add(name="").gauge.data_points.add(as_int=1)
    return request


def logs_request(records: int = 2) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    scope = request.resource_logs.add().scope_logs.add()
    for i in range(records):
        scope.log_records.add(body={"string_value": f"line {i}"}, trace_id=TRACE_ID, span_id=SPAN_ID)
    return request


def traces_request(spans: int = 2) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i in range(spans):
        span = scope.spans.add(name=f"span {i}", trace_id=TRACE_ID, span_id=SPAN_ID, parent_span_id=PARENT_ID)
        span.links.add(trace_id=TRACE_ID, span_id=PARENT_ID)
    return request


REQUESTS: dict[Signal, tuple[Callable[[], Any], int]] = {
    Signal.METRICS: (metrics_request, 3),
    Signal.LOGS: (logs_request, 2),
    Signal.TRACES: (traces_request, 2),
}
"""Per signal: a request builder and how many items its default request holds."""


@dataclasses.dataclass
class Env:
    """Everything one test's receiver was built from."""

    telemetry: SelfTelemetry
    consumers: dict[Signal, Recorder]
    ready: list[bool]

    def count(self, name: str, transport: str, signal: Signal, reason: str | None = None) -> float | None:
        labels = {"receiver": "otlp", "transport": transport, "signal": signal.value}
        if reason is not None:
            labels["reason"] = reason
        return self.telemetry.registry.get_sample_value(f"gputally_receiver_{name}_items_total", labels)

    def context(self, **changes: Any) -> ComponentContext:
        base = ComponentContext(
            id="otlp",
            telemetry=self.telemetry,
            authenticators={"bearertokenauth": BearerTokenAuth(BearerTokenAuthConfig(token=TOKEN))},
            shutdown_timeout=2.0,
            is_ready=lambda: self.ready[0],
        )
        return dataclasses.replace(base, **changes)


StartReceiver = Callable[..., Awaitable[OTLPReceiver]]
"""The ``start_receiver`` fixture: ``await start_receiver(config, signals=..., health_interval=...)``."""


@dataclasses.dataclass(frozen=True)
class Certs:
    ca: trustme.CA
    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_file: Path
    client_key_file: Path


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def noncanonical(request: Any) -> bytes:
    """``request`` encoded validly but not as protobuf would re-encode it.

    A resource attribute is written value-before-key; a serializer always writes fields in
    number order, so forwarding a re-encoded request would not give these bytes back.
    """
    (resource_entry,) = request.ListFields()[0][1]
    assert not resource_entry.HasField("resource")
    attribute = _field(2, _field(1, b"node-1")) + _field(1, b"host.name")  # KeyValue: value, then key
    resource = _field(1, _field(1, attribute))  # Resource.attributes inside Resource*.resource
    return _field(1, resource + resource_entry.SerializeToString())


PATHS = {
    Signal.METRICS: "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    Signal.LOGS: "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
    Signal.TRACES: "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
}


@dataclasses.dataclass
class GrpcResult:
    """What an OTLP exporter would learn from one call."""

    code: grpc.StatusCode
    details: str
    response: Any = None
    """The decoded Export*ServiceResponse when the call succeeded."""
    status: status_pb2.Status | None = None
    """The rich status from ``grpc-status-details-bin``, when the server sent one."""


async def grpc_export(
    address: str | None,
    signal: Signal,
    body: bytes,
    *,
    metadata: tuple[tuple[str, str], ...] = (),
    compression: grpc.Compression | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> GrpcResult:
    assert address is not None, "the receiver is not listening"
    if credentials is not None:
        channel = grpc.aio.secure_channel(address, credentials)
    else:
        channel = grpc.aio.insecure_channel(address)
    async with channel:
        stub: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(PATHS[signal])
        call = stub(body, metadata=metadata, compression=compression, timeout=10)
        try:
            raw = await call
        except grpc.aio.AioRpcError as exc:
            return GrpcResult(exc.code(), exc.details() or "", status=await rpc_status.aio.from_call(call))
        return GrpcResult(grpc.StatusCode.OK, "", response=SIGNALS[signal].response.FromString(raw))


@dataclasses.dataclass
class HttpResult:
    status: int
    headers: Mapping[str, str]
    body: bytes


async def http_post(
    address: str | None,
    path: str,
    body: bytes,
    *,
    content_type: str = "application/x-protobuf",
    headers: Mapping[str, str] | None = None,
    method: str = "POST",
    ssl_context: ssl.SSLContext | None = None,
) -> HttpResult:
    assert address is not None, "the receiver is not listening"
    scheme = "https" if ssl_context else "http"
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.request(
            method,
            f"{scheme}://{address}{path}",
            data=body,
            headers={"Content-Type": content_type, **(headers or {})},
            ssl=ssl_context if ssl_context else False,
            timeout=aiohttp.ClientTimeout(total=10),
        ) as response,
    ):
        return HttpResult(response.status, dict(response.headers), await response.read())
