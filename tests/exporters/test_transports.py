"""The ``otlp`` (gRPC) and ``otlphttp`` exporters against real sinks on loopback.

What both transports share is one test run once per transport through the ``backend``
fixture; where the two answer differently (status codes, throttle hints, TLS sources) the
test is parametrised with each transport's own expectation. Transport-only behaviour is in
the ``test_grpc_*`` and ``test_http_*`` sections at the end.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

import gputally.exporters.otlp as otlp_grpc
import gputally.exporters.otlphttp as otlp_http
from gputally.auth import BearerTokenAuth, BearerTokenAuthConfig
from gputally.errors import ConfigError, Refused
from gputally.exporterhelper.sender import QueuedExporter
from gputally.exporters.otlp.config import OTLPGrpcConfig
from gputally.exporters.otlphttp.config import OTLPHttpConfig
from gputally.exporters.otlphttp.exporter import parse_retry_after
from gputally.otlp.batch import Signal
from gputally.storage import FileStorageConfig

M, L, T = Signal.METRICS, Signal.LOGS, Signal.TRACES
FAST_RETRY = {"initial_interval": "10ms", "max_interval": "50ms", "max_elapsed_time": "5s"}
Code = grpc.StatusCode


# --- the backend fixture: one transport, its sink and its exporter ------------------------


@dataclass
class Backend:
    """One transport: starts its sink, builds its exporter, scripts its sink's failures."""

    kind: str
    """``grpc`` or ``http``."""
    name: str
    """The exporter's type name, also its component id unless a test gives one."""
    config: type[OTLPGrpcConfig] | type[OTLPHttpConfig]
    module: Any
    paths: dict[Signal, str]
    """Where each signal arrives when the endpoint is ``url(port, "/otlp")``."""
    _start_sink: Callable[..., Awaitable[Any]]
    _context: Callable[..., Any]
    _cleanup: list[QueuedExporter]
    implementation: str | None = None
    """gRPC: the exporter's ``implementation`` (native, the default, or grpcio)."""

    def url(self, port: int, path: str = "") -> str:
        """A plain-text endpoint (for gRPC the scheme decides TLS and a path means nothing)."""
        return f"http://127.0.0.1:{port}{path}"

    def tls_endpoint(self, port: int) -> str:
        return f"127.0.0.1:{port}" if self.kind == "grpc" else f"https://127.0.0.1:{port}"

    def exporter(self, section: dict[str, Any], *, environ: dict[str, str] | None = None,
                 component_id: str | None = None, shutdown_timeout: float = 2.0,
                 **context_extra: Any) -> QueuedExporter:
        defaults: dict[str, Any] = {"retry_on_failure": FAST_RETRY}
        if self.implementation is not None:
            defaults["implementation"] = self.implementation
        config = self.config.model_validate(defaults | section)
        context = self._context(component_id or self.name, shutdown_timeout=shutdown_timeout, **context_extra)
        exporter = self.module.create_exporter(config, context, environ=environ or {})
        self._cleanup.append(exporter)
        return exporter

    async def start_sink(self, *, port: int = 0, ca: trustme.CA | None = None, max_request_bytes: int | None = None
                         ) -> Any:
        """A sink on ``port``; with ``ca``, TLS that requires a client certificate from it;
        with ``max_request_bytes``, refusing larger requests (gRPC RESOURCE_EXHAUSTED, HTTP 413)."""
        if ca is None:
            return await self._start_sink(port=port, max_request_bytes=max_request_bytes)
        server = ca.issue_cert("127.0.0.1")
        if self.kind == "grpc":
            credentials = grpc.ssl_server_credentials(
                [(server.private_key_pem.bytes(), b"".join(p.bytes() for p in server.cert_chain_pems))],
                root_certificates=ca.cert_pem.bytes(),
                require_client_auth=True,
            )
            return await self._start_sink(port=port, credentials=credentials)
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.configure_cert(server_context)
        ca.configure_trust(server_context)
        server_context.verify_mode = ssl.CERT_REQUIRED
        return await self._start_sink(port=port, ssl_context=server_context)

    def fail(self, sink: Any, code: Code | int, message: str = "", *, times: int = 1) -> None:
        """The next ``times`` requests fail with ``code``; HTTP carries ``message`` as a Status body."""
        if self.kind == "grpc":
            sink.fail(code, message, times=times)
        elif message:
            body = status_pb2.Status(code=3, message=message).SerializeToString()
            sink.fail(code, headers={"Content-Type": "application/x-protobuf"}, body=body, times=times)
        else:
            sink.fail(code, times=times)

    def throttle(self, sink: Any, code: Code | int, delay: float) -> None:
        """The next request fails with ``code`` and the server's delay (RetryInfo, Retry-After)."""
        if self.kind == "grpc":
            sink.fail(code, "slow down", retry_delay=delay)
        else:
            sink.fail(code, headers={"Retry-After": str(delay)})


_PATHS = {
    "grpc": {
        M: "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        L: "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
        T: "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    },
    "http": {M: "/otlp/v1/metrics", L: "/otlp/v1/logs", T: "/otlp/v1/traces"},
}


def _backend(kind: str, request: pytest.FixtureRequest) -> Backend:
    context, cleanup = request.getfixturevalue("context"), request.getfixturevalue("cleanup")
    if kind in ("grpc", "grpcio"):
        return Backend("grpc", "otlp", OTLPGrpcConfig, otlp_grpc, _PATHS["grpc"],
                       request.getfixturevalue("start_grpc_sink"), context, cleanup,
                       implementation="grpcio" if kind == "grpcio" else None)
    return Backend("http", "otlphttp", OTLPHttpConfig, otlp_http, _PATHS["http"],
                   request.getfixturevalue("start_http_sink"), context, cleanup)


@pytest.fixture(params=["grpc", "grpcio", "http"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each transport in turn: gRPC native (the default), gRPC on grpcio, HTTP (or the one a test
    names with ``indirect=["backend"]``)."""
    return _backend(request.param, request)


@pytest.fixture
async def sink(backend: Backend) -> Any:
    """The backend's sink, up on port 0 (its port is `sink.port`)."""
    return await backend.start_sink()


@pytest.fixture
def tls_files(ca: trustme.CA, tmp_path: Path) -> dict[str, Path]:
    client = ca.issue_cert("gputally-client@example.com")
    files = {"ca_file": tmp_path / "ca.pem", "cert_file": tmp_path / "client.pem", "key_file": tmp_path / "client.key"}
    ca.cert_pem.write_to_path(str(files["ca_file"]))
    client.cert_chain_pems[0].write_to_path(str(files["cert_file"]))
    client.private_key_pem.write_to_path(str(files["key_file"]))
    return files


def _per_transport(grpc_cases: list[Any], http_cases: list[Any]) -> list[Any]:
    """Parameters for ("backend", x): each gRPC case, then each HTTP case, with readable ids."""
    def label(case: Any) -> str:
        return case.name if isinstance(case, Code) else str(case)

    return ([pytest.param(kind, c, id=f"{kind}-{label(c)}") for kind in ("grpc", "grpcio") for c in grpc_cases]
            + [pytest.param("http", c, id=f"http-{label(c)}") for c in http_cases])


# --- delivery -------------------------------------------------------------------------------


async def test_each_signal_arrives_unchanged(backend, sink, make_batch, counted) -> None:
    exporter = backend.exporter({"endpoint": backend.url(sink.port, "/otlp")})
    await exporter.start()
    batches = {s: make_batch(s, items=n + 1, tag=s.value) for n, s in enumerate(Signal)}
    for batch in batches.values():
        await exporter.export(batch)
    calls = await sink.wait_calls(3)
    await exporter.shutdown()
    assert {c.path: c.body for c in calls} == {backend.paths[s]: b.serialize() for s, b in batches.items()}
    assert [counted("sent", backend.name, s) for s in Signal] == [1, 2, 3]
    if backend.kind == "http":  # gzip is the default
        for call in calls:
            assert call.headers["Content-Encoding"] == "gzip"
            assert call.headers["Content-Type"] == "application/x-protobuf"


async def _byte_counting_proxy(target_port: int) -> tuple[asyncio.Server, dict[str, int]]:
    counter = {"up": 0}

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: bool) -> None:
        try:
            while data := await reader.read(65536):
                if count:
                    counter["up"] += len(data)
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False), return_exceptions=True)

    return await asyncio.start_server(handle, "127.0.0.1", 0), counter


@pytest.mark.parametrize("compression", [None, "gzip", "none"], ids=["default", "gzip", "none"])
async def test_compression_on_the_wire(backend, sink, make_batch, compression: str | None) -> None:
    """Bytes really sent, counted by a proxy; gzip (the default) makes them a fraction of the batch."""
    proxy, counter = await _byte_counting_proxy(sink.port)
    section: dict[str, Any] = {"endpoint": backend.url(proxy.sockets[0].getsockname()[1])}
    if compression is not None:
        section["compression"] = compression
    exporter = backend.exporter(section)
    await exporter.start()
    batch = make_batch(items=5000)
    raw_size = len(batch.serialize())
    await exporter.export(batch)
    call = (await sink.wait_calls(1))[0]
    assert call.body == batch.serialize()
    await exporter.shutdown()
    proxy.close()
    compressed = compression != "none"
    if compressed:
        assert counter["up"] < raw_size / 4
    else:
        assert counter["up"] > raw_size
    if backend.kind == "http":
        assert call.headers["Content-Type"] == "application/x-protobuf"
        if compressed:
            assert call.headers["Content-Encoding"] == "gzip"
            assert call.wire_size is not None and call.wire_size < len(call.body) / 4
        else:
            assert "Content-Encoding" not in call.headers


@pytest.mark.parametrize(
    ("authenticator", "token", "environ", "expected"),
    [
        pytest.param(
            "bearertokenauth", BearerTokenAuthConfig(token="s3cret"),
            {"OTEL_EXPORTER_OTLP_HEADERS": "x-env=from%20env,x-tenant=overridden"},
            {"authorization": "Bearer s3cret", "x-tenant": "gpu-team", "x-env": "from env"},
            id="generic-env",
        ),
        pytest.param(
            "bearertokenauth/backend", BearerTokenAuthConfig(token="t0k", scheme="Token"),
            {"OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-scope-orgid=a%2Cb"},
            {"authorization": "Token t0k", "x-tenant": "gpu-team", "x-scope-orgid": "a,b"},
            id="signal-env",
        ),
    ],
)
async def test_headers_environment_and_bearer_token(backend, sink, make_batch, authenticator: str,
                                                    token: BearerTokenAuthConfig, environ: dict[str, str],
                                                    expected: dict[str, str]) -> None:
    """Config headers win over the environment's per name; the token carries its scheme."""
    exporter = backend.exporter(
        {"endpoint": backend.url(sink.port), "headers": {"X-Tenant": "gpu-team"},
         "auth": {"authenticator": authenticator}},
        environ=environ,
        authenticators={authenticator: BearerTokenAuth(token)},
    )
    await exporter.start()
    await exporter.export(make_batch())
    headers = (await sink.wait_calls(1))[0].headers  # gRPC metadata is lower-case, HTTP's case-insensitive
    await exporter.shutdown()
    assert {name: headers[name] for name in expected} == expected
    assert headers["user-agent"].startswith("gputally/")


def test_missing_authenticator_is_a_config_error(backend) -> None:
    with pytest.raises(ConfigError, match="bearertokenauth/nope"):
        backend.exporter({"auth": {"authenticator": "bearertokenauth/nope"}})


@pytest.mark.parametrize("client_tls_from", ["config", "environment"])
async def test_mutual_tls(backend, ca, tls_files, make_batch, counted, client_tls_from: str) -> None:
    """Client certificate from the config or the environment; without one the server refuses."""
    sink = await backend.start_sink(ca=ca)
    endpoint = backend.tls_endpoint(sink.port)
    in_config = {"tls": {k: str(v) for k, v in tls_files.items()}}
    in_environment = {
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls_files["ca_file"]),
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(tls_files["cert_file"]),
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(tls_files["key_file"]),
    }
    # The anonymous client trusts the same CA from the other source, but has no client certificate.
    if client_tls_from == "config":
        client: tuple[dict[str, Any], dict[str, str]] = (in_config, {})
        anonymous = ({}, {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls_files["ca_file"])})
    else:
        client = ({}, in_environment)
        anonymous = ({"tls": {"ca_file": str(tls_files["ca_file"])}}, {})

    exporter = backend.exporter({"endpoint": endpoint} | client[0], environ=client[1])
    await exporter.start()
    await exporter.export(make_batch(items=2))
    assert (await sink.wait_calls(1))[0].body == make_batch(items=2).serialize()
    await exporter.shutdown()

    refused = backend.exporter({"endpoint": endpoint, "retry_on_failure": {"enabled": False}} | anonymous[0],
                               environ=anonymous[1], component_id=f"{backend.name}/anon")
    await refused.start()
    await refused.export(make_batch(items=4))
    await refused.shutdown()
    assert counted("send_failed", f"{backend.name}/anon", M) == 4
    assert len(sink.calls) == 1


# --- failures, retry and partial success -----------------------------------------------------


async def test_backend_down_then_up_loses_nothing(backend, unused_port, make_batch, counted, eventually) -> None:
    exporter = backend.exporter({"endpoint": backend.url(unused_port)})
    await exporter.start()
    batches = [make_batch(s, items=2, tag=f"{s}{n}") for n in range(3) for s in Signal]
    for batch in batches:
        await exporter.export(batch)
    await asyncio.sleep(0.2)
    assert not exporter.ready
    sink = await backend.start_sink(port=unused_port)
    await eventually(lambda: sum(counted("sent", backend.name, s) for s in Signal) == 18)
    assert sorted(c.body for c in sink.calls) == sorted(b.serialize() for b in batches)
    assert exporter.ready
    await exporter.shutdown()


@pytest.mark.parametrize(
    ("backend", "throttles", "first_wait"),
    [
        # RESOURCE_EXHAUSTED is retried only because RetryInfo came with it; gRPC's delay may be sub-second.
        pytest.param("grpc", [(Code.RESOURCE_EXHAUSTED, 0.3), (Code.UNAVAILABLE, 0)], (0.25, 1.5), id="grpc"),
        # Retry-After is whole seconds.
        pytest.param("http", [(429, 1), (503, 0)], (0.9, 2.0), id="http"),
    ],
    indirect=["backend"],
)
async def test_server_delay_replaces_backoff(backend, sink, make_batch, counted, eventually,
                                             throttles: list[tuple[Code | int, float]],
                                             first_wait: tuple[float, float]) -> None:
    """RetryInfo / Retry-After replace a 3 s backoff: the server's delay, a zero one included."""
    for code, delay in throttles:
        backend.throttle(sink, code, delay)
    exporter = backend.exporter({"endpoint": backend.url(sink.port),
                                 "retry_on_failure": {"initial_interval": "3s", "randomization_factor": 0}})
    await exporter.start()
    await exporter.export(make_batch())
    first, second, third = await sink.wait_calls(3)
    assert first_wait[0] < second.at - first.at < first_wait[1]
    assert third.at - second.at < 0.5
    await eventually(lambda: counted("sent", backend.name, M) == 3)
    await exporter.shutdown()


@pytest.mark.parametrize(
    ("backend", "code"),
    _per_transport([Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.ABORTED, Code.DATA_LOSS], [429, 502, 503, 504]),
    indirect=["backend"],
)
async def test_transient_failures_are_retried(backend, sink, make_batch, counted, eventually,
                                              code: Code | int) -> None:
    backend.fail(sink, code, times=2)
    exporter = backend.exporter({"endpoint": backend.url(sink.port)})
    await exporter.start()
    await exporter.export(make_batch(items=3))
    await eventually(lambda: counted("sent", backend.name, M) == 3)
    assert len(sink.calls) == 3 and counted("send_failed", backend.name, M) == 0
    await exporter.shutdown()


@pytest.mark.parametrize(
    ("backend", "code"),
    # RESOURCE_EXHAUSTED without RetryInfo is not retryable; 500 is not among HTTP's retryable statuses.
    _per_transport([Code.INVALID_ARGUMENT, Code.RESOURCE_EXHAUSTED, Code.UNAUTHENTICATED], [400, 401, 404, 413, 500]),
    indirect=["backend"],
)
async def test_permanent_failures_are_dropped_at_once(backend, sink, make_batch, counted, eventually,
                                                      caplog: pytest.LogCaptureFixture, code: Code | int) -> None:
    backend.fail(sink, code, "metric name is empty")
    exporter = backend.exporter({"endpoint": backend.url(sink.port)})
    await exporter.start()
    await exporter.export(make_batch(items=3))
    await eventually(lambda: counted("send_failed", backend.name, M) == 3)
    await asyncio.sleep(0.1)  # time for several 10 ms retries, were there any
    assert len(sink.calls) == 1
    await exporter.shutdown()
    status = code.name if isinstance(code, Code) else f"HTTP {code}"
    assert status in caplog.text and "metric name is empty" in caplog.text


async def test_partial_success_is_counted(backend, sink, make_batch, counted, eventually) -> None:
    response = ExportMetricsServiceResponse()
    response.partial_success.rejected_data_points = 2
    response.partial_success.error_message = "2 points too old"
    sink.response = response.SerializeToString()
    exporter = backend.exporter({"endpoint": backend.url(sink.port)})
    await exporter.start()
    await exporter.export(make_batch(items=5))
    await eventually(lambda: counted("sent", backend.name, M) == 3)
    assert counted("send_failed", backend.name, M) == 2
    await exporter.shutdown()


async def test_queued_batches_arrive_as_one_request(backend, sink, make_batch, entries, counted, eventually) -> None:
    gate = sink.hold()
    exporter = backend.exporter({"endpoint": backend.url(sink.port), "sending_queue": {"num_consumers": 1}})
    await exporter.start()
    await exporter.export(make_batch(items=1, tag="first"))
    await sink.wait_calls(1)
    batches = [make_batch(items=2, tag=str(n)) for n in range(4)]
    for batch in batches:
        await exporter.export(batch)
    gate.set()
    calls = await sink.wait_calls(2)
    await eventually(lambda: counted("sent", backend.name, M) == 9)
    assert len(calls) == 2 and calls[1].body == b"".join(b.serialize() for b in batches)
    assert len(entries(M, calls[1].body)) == 4
    await exporter.shutdown()


async def test_a_request_over_the_backends_size_limit_is_sent_again_batch_by_batch(
    backend, make_batch, entries, counted, eventually
) -> None:
    """Together the batches are more than the backend takes (gRPC RESOURCE_EXHAUSTED, HTTP 413,
    both permanent); alone each fits, and nothing is lost."""
    batches = [make_batch(items=300, tag=str(n)) for n in range(4)]
    size = len(batches[0].serialize())
    sink = await backend.start_sink(max_request_bytes=2 * size)
    gate = sink.hold()
    exporter = backend.exporter({"endpoint": backend.url(sink.port), "compression": "none",
                                 "sending_queue": {"num_consumers": 1}})
    await exporter.start()
    await exporter.export(make_batch(items=1, tag="first"))
    await sink.wait_calls(1)
    for batch in batches:
        await exporter.export(batch)
    gate.set()
    await eventually(lambda: counted("sent", backend.name, M) == 1 + 4 * 300)
    assert counted("send_failed", backend.name, M) == 0
    assert [c.body for c in sink.calls[1:]] == [b.serialize() for b in batches]  # the refused request never arrived
    await exporter.shutdown()


# --- readiness, queue and shutdown -----------------------------------------------------------


async def test_ready_once_the_backend_is_reached(backend, unused_port, eventually) -> None:
    exporter = backend.exporter({"endpoint": backend.url(unused_port)})
    assert not exporter.ready
    started = time.monotonic()
    await exporter.start()
    assert time.monotonic() - started < 0.5  # start does not wait for the backend
    await asyncio.sleep(0.2)
    assert not exporter.ready
    await backend.start_sink(port=unused_port)
    await eventually(lambda: exporter.ready)  # no export needed
    await exporter.shutdown()


async def test_full_queue_pushes_back(backend, sink, make_batch, counted, eventually) -> None:
    gate = sink.hold()
    exporter = backend.exporter({"endpoint": backend.url(sink.port),
                                 "sending_queue": {"queue_size": 1, "num_consumers": 1}})
    await exporter.start()
    await exporter.export(make_batch(items=1))
    await sink.wait_calls(1)
    await exporter.export(make_batch(items=1))
    with pytest.raises(Refused):
        await exporter.export(make_batch(L, items=6))
    assert counted("enqueue_failed", backend.name, L) == 6
    gate.set()
    await eventually(lambda: counted("sent", backend.name, M) == 2)
    await exporter.shutdown()


@pytest.mark.parametrize(
    ("backend", "component_id", "directory"),
    [
        pytest.param("grpc", "otlp/durable", "otlp%2Fdurable", id="grpc"),  # a '/' in the id is quoted
        pytest.param("http", "otlphttp", "otlphttp", id="http"),
    ],
    indirect=["backend"],
)
async def test_persistent_queue_survives_a_restart(backend, unused_port, make_batch, counted, tmp_path: Path,
                                                   component_id: str, directory: str) -> None:
    section = {"endpoint": backend.url(unused_port), "sending_queue": {"storage": "file_storage", "num_consumers": 2}}
    first = backend.exporter(section, component_id=component_id, shutdown_timeout=0.5, storage={"file_storage": FileStorageConfig(directory=tmp_path)})
    await first.start()
    batches = [make_batch(s, items=2, tag=f"{s}{n}") for n in range(2) for s in Signal]
    for batch in batches:
        await first.export(batch)
    stored = sorted((tmp_path / directory).glob("*.otlp"))
    assert [p.read_bytes() for p in stored] == [b.serialize() for b in batches]  # on disk before export returned
    await first.shutdown()
    assert len(list((tmp_path / directory).glob("*.otlp"))) == 6  # the backend was down: all kept
    assert sum(counted("send_failed", component_id, s) for s in Signal) == 0

    sink = await backend.start_sink(port=unused_port)
    second = backend.exporter(section, component_id=component_id,
                              storage={"file_storage": FileStorageConfig(directory=tmp_path)})
    await second.start()
    await sink.wait_calls(6)
    await second.shutdown()
    assert sorted(c.body for c in sink.calls) == sorted(b.serialize() for b in batches)  # each once
    assert list((tmp_path / directory).glob("*.otlp")) == []


_CRASHING_PROCESS = """
import asyncio, importlib, json, os, sys
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext
from gputally.storage import FileStorageConfig
from gputally.telemetry import SelfTelemetry

async def main(module, config_class, component_id, storage, port, batches):
    exporter_module = importlib.import_module(module)
    exporter_config = getattr(exporter_module, config_class).model_validate(
        {"endpoint": f"http://127.0.0.1:{port}", "sending_queue": {"storage": "file_storage"}})
    context = ComponentContext(id=component_id, telemetry=SelfTelemetry(),
                               storage={"file_storage": FileStorageConfig(directory=storage)})
    exporter = exporter_module.create_exporter(exporter_config, context, environ={})
    await exporter.start()
    for signal, items, raw in batches:
        await exporter.export(Batch(Signal(signal), raw=bytes.fromhex(raw), items=items))
    os._exit(0)  # killed: no shutdown, no drain

asyncio.run(main(*sys.argv[1:5], int(sys.argv[5]), json.loads(sys.stdin.read())))
"""


async def test_persistent_queue_survives_a_crash(backend, unused_port, make_batch, tmp_path: Path) -> None:
    component_id = f"{backend.name}/crash"
    batches = [make_batch(s, items=2, tag=f"crash-{s}") for s in Signal]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASHING_PROCESS, backend.module.__name__, backend.config.__name__, component_id,
        str(tmp_path), str(unused_port), stdin=asyncio.subprocess.PIPE,
    )
    await process.communicate(json.dumps([[b.signal.value, b.items, b.serialize().hex()] for b in batches]).encode())
    assert process.returncode == 0
    assert len(list((tmp_path / f"{backend.name}%2Fcrash").glob("*.otlp"))) == 3

    sink = await backend.start_sink(port=unused_port)
    survivor = backend.exporter({"endpoint": backend.url(unused_port), "sending_queue": {"storage": "file_storage"}},
                                component_id=component_id, storage={"file_storage": FileStorageConfig(directory=tmp_path)})
    await survivor.start()
    await sink.wait_calls(3)
    await survivor.shutdown()
    assert sorted(c.body for c in sink.calls) == sorted(b.serialize() for b in batches)
    assert list((tmp_path / f"{backend.name}%2Fcrash").glob("*.otlp")) == []


async def test_a_backend_back_just_before_shutdown_still_gets_the_queue(
    backend, unused_port, make_batch, counted, entries
) -> None:
    """The shutdown drain's last attempt reaches a backend that came back during a long backoff
    (gRPC: it waits for the channel's reconnect instead of failing fast on a stale failure)."""
    # A long backoff: without the drain's wait-for-ready the last gRPC attempt would find the
    # channel still in TRANSIENT_FAILURE and drop everything.
    exporter = backend.exporter({
        "endpoint": backend.url(unused_port),
        "retry_on_failure": {"initial_interval": "1s", "max_interval": "1s", "max_elapsed_time": "0"},
    }, shutdown_timeout=5.0)
    await exporter.start()
    batches = [make_batch(items=2, tag=str(n)) for n in range(4)]
    for batch in batches:
        await exporter.export(batch)
    await asyncio.sleep(0.2)  # the first attempt was refused; the consumers wait out 1 s
    sink = await backend.start_sink(port=unused_port)
    await exporter.shutdown()
    arrived = [entry for call in sink.calls for entry in entries(M, call.body)]
    assert sorted(arrived) == sorted(entry for b in batches for entry in entries(M, b.serialize()))
    assert counted("sent", backend.name, M) == 8 and counted("send_failed", backend.name, M) == 0


# --- gRPC only -------------------------------------------------------------------------------


@pytest.fixture
def grpc_backend(request: pytest.FixtureRequest) -> Backend:
    return _backend("grpc", request)


@pytest.mark.parametrize(
    ("endpoint", "section", "environ"),
    [
        pytest.param("http://127.0.0.1:{port}", {}, {"OTEL_EXPORTER_OTLP_INSECURE": "false"}, id="scheme-wins"),
        pytest.param("127.0.0.1:{port}", {"tls": {"insecure": True}}, {}, id="tls-insecure"),
        pytest.param("127.0.0.1:{port}", {}, {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, id="env-insecure"),
    ],
)
async def test_grpc_plain_text_endpoint_forms(grpc_backend, grpc_sink, make_batch, endpoint: str,
                                              section: dict[str, Any], environ: dict[str, str]) -> None:
    """``http://host:port`` is plain text whatever the environment says; ``host:port`` is plain
    text with ``tls.insecure`` or OTEL_EXPORTER_OTLP_INSECURE."""
    exporter = grpc_backend.exporter({"endpoint": endpoint.format(port=grpc_sink.port)} | section, environ=environ)
    await exporter.start()
    await exporter.export(make_batch(items=2))
    assert (await grpc_sink.wait_calls(1))[0].body == make_batch(items=2).serialize()
    await exporter.shutdown()


@pytest.mark.parametrize("endpoint", ["collector:port", "collector:70000", "unix:"])
def test_a_malformed_grpc_endpoint_is_a_config_error(grpc_backend, endpoint: str) -> None:
    with pytest.raises(ConfigError, match="endpoint"):
        grpc_backend.exporter({"endpoint": endpoint, "tls": {"insecure": True}})


def test_grpc_insecure_skip_verify_is_refused(grpc_backend) -> None:
    with pytest.raises(ConfigError, match="insecure_skip_verify"):
        grpc_backend.exporter({"endpoint": "collector:4317", "tls": {"insecure_skip_verify": True}})


# --- HTTP only -------------------------------------------------------------------------------


@pytest.fixture
def http_backend(request: pytest.FixtureRequest) -> Backend:
    return _backend("http", request)


async def test_http_signal_endpoint_from_config_and_environment(http_backend, http_sink, make_batch) -> None:
    base = f"http://127.0.0.1:{http_sink.port}"
    exporter = http_backend.exporter(
        {"compression": "none", "traces_endpoint": f"{base}/custom/spans"},
        environ={"OTEL_EXPORTER_OTLP_ENDPOINT": f"{base}/env", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": f"{base}/logs-here"},
    )
    await exporter.start()
    for signal in Signal:
        await exporter.export(make_batch(signal))
    calls = await http_sink.wait_calls(3)
    await exporter.shutdown()
    assert sorted(c.path for c in calls) == ["/custom/spans", "/env/v1/metrics", "/logs-here"]
    assert all("Content-Encoding" not in c.headers for c in calls)


async def test_http_json_encoding_uses_hex_ids(http_backend, http_sink, make_batch, counted, eventually) -> None:
    """OTLP/JSON out (hex trace and span IDs) and a JSON partial success back."""
    http_sink.response = b'{"partialSuccess":{"rejectedLogRecords":"1","errorMessage":"one too long"}}'
    http_sink.content_type = "application/json"
    exporter = http_backend.exporter({"endpoint": f"http://127.0.0.1:{http_sink.port}", "encoding": "json"})
    await exporter.start()
    await exporter.export(make_batch(T, items=1, tag="j"))
    await exporter.export(make_batch(L, items=2, tag="j"))
    calls = await http_sink.wait_calls(2)
    await eventually(lambda: counted("sent", "otlphttp", L) == 1)
    await exporter.shutdown()
    assert counted("send_failed", "otlphttp", L) == 1
    traces = json.loads(next(c.body for c in calls if c.path == "/v1/traces"))
    span = traces["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span["traceId"] == "000102030405060708090a0b0c0d0e0f"
    assert span["spanId"] == "0000000000000001"
    assert span["parentSpanId"] == "abababababababab"
    assert calls[0].headers["Content-Type"] == "application/json"
    logs = json.loads(next(c.body for c in calls if c.path == "/v1/logs"))
    assert logs["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["spanId"] == "0001020304050607"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("120", 120.0),
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # in the past: retry now
        ("soon", None),
        ("-5", None),
    ],
)
def test_http_parse_retry_after(value: str | None, expected: float | None) -> None:
    now = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC)
    assert parse_retry_after(value, now=now) == expected
