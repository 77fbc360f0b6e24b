"""Real OTLP sinks on loopback (gRPC and HTTP) and small builders for exporter tests.

Sinks are scripted: queued replies (errors, throttles) are used first, then the default
(success). Each call is recorded with its arrival time, so tests can measure retry waits.
:class:`FakeTransport` is the in-process transport for tests of the queued exporter itself.
Tests reach everything through fixtures, which the conftests of ``tests/exporters`` (the
exporters) and ``tests/exporterhelper`` (the queued exporter they are built on) take from here.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import trustme
from aiohttp import web
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from harness import processes
from multidict import CIMultiDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gputally.exporterhelper.sender import QueuedExporter
from gputally.exporterhelper.settings import QueueSettings, RetrySettings
from gputally.exporterhelper.transport import Receipt
from gputally.otlp.batch import Batch, Signal
from gputally.otlp.signals import SIGNALS
from gputally.pipeline.component import ComponentContext, Exporter
from gputally.telemetry import SelfTelemetry


@dataclass
class Call:
    """One request as the sink saw it."""

    path: str
    body: bytes
    headers: Mapping[str, str]
    """HTTP: case-insensitive."""
    at: float = field(default_factory=time.monotonic)
    wire_size: int | None = None
    """HTTP: the Content-Length as sent (compressed size)."""


def _retry_info_status(code: grpc.StatusCode, message: str, delay: float | None) -> grpc.Status:
    details = []
    if delay is not None:
        packed = any_pb2.Any()
        packed.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
            seconds=int(delay), nanos=int((delay % 1) * 1e9))))
        details.append(packed)
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=details))


class FakeTransport:
    """Sends nowhere; fails as scripted (in order: ``errors``, ``fails_on``, ``always``); can be held."""

    description = "fake-backend"

    def __init__(self) -> None:
        self.errors: list[Exception] = []
        self.always: Exception | None = None
        self.fails_on: Callable[[Batch], Exception | None] | None = None
        """An error for a request from what it holds (a bad batch in it), or None."""
        self.sent: list[Batch] = []
        self.attempts = 0
        self.gate: asyncio.Event | None = None
        self.receipt = Receipt()
        self.ready = False
        self.closed = False
        self.draining = False

    async def start(self) -> None:
        self.ready = True

    async def send(self, batch: Batch) -> Receipt:
        self.attempts += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.errors:
            raise self.errors.pop(0)
        error = self.fails_on(batch) if self.fails_on is not None else None
        if error is not None:
            raise error
        if self.always is not None:
            raise self.always
        self.sent.append(batch)
        return self.receipt

    def drain(self) -> None:
        self.draining = True

    async def close(self) -> None:
        self.closed = True


class _Sink:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.replies: deque[Any] = deque()
        self.gate: asyncio.Event | None = None
        self.port = 0
        self._arrived = asyncio.Condition()

    def hold(self) -> asyncio.Event:
        """Make every request wait until the returned event is set."""
        self.gate = asyncio.Event()
        return self.gate

    async def _record(self, call: Call) -> None:
        async with self._arrived:
            self.calls.append(call)
            self._arrived.notify_all()

    async def wait_calls(self, n: int, timeout: float = 5.0) -> list[Call]:
        """Wait until ``n`` requests arrived (successful or not)."""
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: len(self.calls) >= n), timeout)
        return self.calls


class GrpcSink(_Sink):
    """A gRPC server taking any method as raw bytes."""

    def __init__(self, *, credentials: grpc.ServerCredentials | None = None, max_request_bytes: int | None = None
                 ) -> None:
        super().__init__()
        self.credentials = credentials
        self.max_request_bytes = max_request_bytes
        self.response = b""
        self._server: grpc.aio.Server | None = None

    def fail(
        self, code: grpc.StatusCode, message: str = "", *, retry_delay: float | None = None, times: int = 1
    ) -> None:
        self.replies.extend([(code, message, retry_delay)] * times)

    async def _handle(self, request: bytes, context: grpc.aio.ServicerContext, method: str) -> bytes:
        headers = {m.key: m.value for m in context.invocation_metadata() or ()}
        await self._record(Call(method, request, headers))
        if self.gate is not None:
            await self.gate.wait()
        if self.replies:
            code, message, delay = self.replies.popleft()
            await context.abort_with_status(_retry_info_status(code, message, delay))
        return self.response

    async def start(self, port: int = 0) -> GrpcSink:
        sink = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
                method = details.method

                async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                    return await sink._handle(request, context, method)

                return grpc.unary_unary_rpc_method_handler(unary)

        options = [] if self.max_request_bytes is None else [
            ("grpc.max_receive_message_length", self.max_request_bytes)]
        self._server = grpc.aio.server(options=options)
        self._server.add_generic_rpc_handlers([Handler()])
        address = f"127.0.0.1:{port}"
        if self.credentials is None:
            self.port = self._server.add_insecure_port(address)
        else:
            self.port = self._server.add_secure_port(address, self.credentials)
        await self._server.start()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None


class HttpSink(_Sink):
    """An aiohttp server taking POSTs on any path."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None, max_request_bytes: int | None = None) -> None:
        super().__init__()
        self.ssl_context = ssl_context
        self.max_request_bytes = max_request_bytes
        self.response = b""
        self.content_type = "application/x-protobuf"
        self._runner: web.AppRunner | None = None

    def fail(self, status: int, *, headers: dict[str, str] | None = None, body: bytes = b"", times: int = 1) -> None:
        self.replies.extend([(status, headers or {}, body)] * times)

    async def _handle(self, request: web.Request) -> web.Response:
        wire_size = request.content_length
        body = await request.read()
        await self._record(Call(request.path, body, CIMultiDict(request.headers), wire_size=wire_size))
        if self.gate is not None:
            await self.gate.wait()
        if self.replies:
            status, headers, error_body = self.replies.popleft()
            return web.Response(status=status, headers=headers, body=error_body)
        return web.Response(body=self.response, content_type=self.content_type)

    async def start(self, port: int = 0) -> HttpSink:
        app = web.Application(client_max_size=self.max_request_bytes or 1024**2)
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        # A port given is a down backend's coming up (`processes.unused_port`, held with SO_REUSEPORT).
        site = web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=self.ssl_context, reuse_port=bool(port))
        await site.start()
        self.port = port or site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@pytest.fixture
async def sinks() -> AsyncIterator[list[_Sink]]:
    """Started sinks register here and are stopped after the test."""
    started: list[_Sink] = []
    yield started
    for sink in started:
        await sink.stop()


@pytest.fixture
def start_grpc_sink(sinks: list[_Sink]) -> Callable[..., Awaitable[GrpcSink]]:
    async def start(*, port: int = 0, credentials: grpc.ServerCredentials | None = None,
                    max_request_bytes: int | None = None) -> GrpcSink:
        sink = await GrpcSink(credentials=credentials, max_request_bytes=max_request_bytes).start(port)
        sinks.append(sink)
        return sink

    return start


@pytest.fixture
def start_http_sink(sinks: list[_Sink]) -> Callable[..., Awaitable[HttpSink]]:
    async def start(*, port: int = 0, ssl_context: ssl.SSLContext | None = None,
                    max_request_bytes: int | None = None) -> HttpSink:
        sink = await HttpSink(ssl_context=ssl_context, max_request_bytes=max_request_bytes).start(port)
        sinks.append(sink)
        return sink

    return start


@pytest.fixture
async def grpc_sink(start_grpc_sink: Callable[..., Awaitable[GrpcSink]]) -> GrpcSink:
    return await start_grpc_sink()


@pytest.fixture
async def http_sink(start_http_sink: Callable[..., Awaitable[HttpSink]]) -> HttpSink:
    return await start_http_sink()


@pytest.fixture
async def cleanup() -> AsyncIterator[list[Exporter]]:
    """Exporters appended here are shut down after the test, even when it fails half-way."""
    exporters: list[Exporter] = []
    yield exporters
    for exporter in exporters:
        await exporter.shutdown()


@pytest.fixture
def transport() -> FakeTransport:
    return FakeTransport()


@pytest.fixture
def make_exporter(transport: FakeTransport, telemetry: SelfTelemetry, cleanup: list[Exporter]
                  ) -> Callable[..., QueuedExporter]:
    """make_exporter(retry=..., queue=..., storage=..., max_request_batches=...): a QueuedExporter
    "otlp/test" over ``transport`` (10 ms retries unless ``retry`` says otherwise); ``storage`` is
    the directory of the file_storage extension ``queue.storage`` names."""

    def make(
        *, retry: RetrySettings | None = None, queue: QueueSettings | None = None, shutdown_timeout: float = 2.0,
        storage: Path | None = None, **limits: int,
    ) -> QueuedExporter:
        exporter = QueuedExporter(
            exporter_id="otlp/test",
            transport=transport,
            retry=retry or RetrySettings(initial_interval=0.01, max_interval=0.02, randomization_factor=0,
                                         max_elapsed_time=5),
            queue=queue or QueueSettings(num_consumers=2, queue_size=10),
            metrics=telemetry.for_exporter("otlp/test"),
            shutdown_timeout=shutdown_timeout,
            storage=storage,
            **limits,
        )
        cleanup.append(exporter)
        return exporter

    return make


@pytest.fixture
def entries() -> Callable[[Signal, bytes], list[bytes]]:
    """entries(signal, body): a request's resource entries, each encoded: the batches that went
    out as one request are told apart by them (make_batch gives each batch one, tagged)."""

    def split(signal: Signal, body: bytes) -> list[bytes]:
        spec = SIGNALS[signal]
        return [entry.SerializeToString()
                for entry in getattr(spec.request.FromString(body), spec.resource_field)]

    return split


@pytest.fixture
def unused_port() -> int:
    """A loopback port with nothing listening (a backend that is down), held so that nothing
    else can listen there; a sink started on it later (``port=``) comes up there
    (`harness.processes.unused_port`)."""
    return processes.unused_port()


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def telemetry() -> SelfTelemetry:
    return SelfTelemetry()


@pytest.fixture
def context(telemetry: SelfTelemetry) -> Callable[..., ComponentContext]:
    def make(component_id: str = "otlp", *, shutdown_timeout: float = 2.0, **extra: Any) -> ComponentContext:
        return ComponentContext(id=component_id, telemetry=telemetry, shutdown_timeout=shutdown_timeout, **extra)

    return make


@pytest.fixture
def counted(telemetry: SelfTelemetry) -> Callable[[str, str, Signal], float]:
    """counted("sent", "otlp", Signal.METRICS): an exporter counter's value."""
    names = {
        "sent": "gputally_exporter_sent_items_total",
        "send_failed": "gputally_exporter_send_failed_items_total",
        "enqueue_failed": "gputally_exporter_enqueue_failed_items_total",
    }

    def value(kind: str, exporter: str, signal: Signal) -> float:
        found = telemetry.registry.get_sample_value(names[kind], {"exporter": exporter, "signal": signal.value})
        return found or 0.0

    return value


def _request(signal: Signal, items: int, tag: str) -> Any:
    if signal is Signal.METRICS:
        request = ExportMetricsServiceRequest()
        resource = request.resource_metrics.add()
        resource.resource.attributes.add(key="tag", value={"string_value": tag})
        metric = resource.scope_metrics.add().metrics.add(name=f"gpu.utilization.{tag}")
        for n in range(items):
            metric.gauge.data_points.add(as_double=float(n), time_unix_nano=1_700_000_000_000_000_000 + n)
        return request
    if signal is Signal.LOGS:
        request = ExportLogsServiceRequest()
        resource = request.resource_logs.add()
        resource.resource.attributes.add(key="tag", value={"string_value": tag})
        scope = resource.scope_logs.add()
        for n in range(items):
            scope.log_records.add(severity_text="INFO", body={"string_value": f"{tag} line {n}"},
                                  trace_id=bytes(range(16)), span_id=bytes(range(8)))
        return request
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.add(key="tag", value={"string_value": tag})
    scope = resource.scope_spans.add()
    for n in range(items):
        scope.spans.add(name=f"{tag}-{n}", trace_id=bytes(range(16)), span_id=(n + 1).to_bytes(8, "big"),
                        parent_span_id=bytes([0xAB] * 8), start_time_unix_nano=1, end_time_unix_nano=2_000_001)
    return request


@pytest.fixture
def make_batch() -> Callable[..., Batch]:
    """make_batch(Signal.LOGS, items=3, tag="a"): a batch from its serialized bytes."""

    def make(signal: Signal = Signal.METRICS, *, items: int = 3, tag: str = "a") -> Batch:
        return Batch(signal, raw=_request(signal, items, tag).SerializeToString(), items=items)

    return make


@pytest.fixture
def eventually() -> Callable[..., Awaitable[None]]:
    """await eventually(lambda: cond): poll a condition for up to ``timeout`` seconds."""

    async def wait(condition: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError("condition not met in time")
            await asyncio.sleep(0.01)

    return wait
