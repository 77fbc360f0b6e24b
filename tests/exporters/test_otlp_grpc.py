"""The ``otlp`` exporter against a real gRPC sink on loopback."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from gputally.auth import BearerTokenAuth, BearerTokenAuthConfig
from gputally.errors import ConfigError, Refused
from gputally.exporters.config import OTLPGrpcConfig
from gputally.exporters.otlp_grpc import create_exporter
from gputally.exporters.sender import QueuedExporter
from gputally.otlp.signals import SIGNALS, Signal

M, L, T = Signal.METRICS, Signal.LOGS, Signal.TRACES
FAST_RETRY = {"initial_interval": "10ms", "max_interval": "50ms", "max_elapsed_time": "5s"}


@pytest.fixture
def make_exporter(context, cleanup) -> Callable[..., QueuedExporter]:
    def make(section: dict[str, Any], *, environ: dict[str, str] | None = None, component_id: str = "otlp",
             shutdown_timeout: float = 2.0, **context_extra: Any) -> QueuedExporter:
        config = OTLPGrpcConfig.model_validate({"retry_on_failure": FAST_RETRY} | section)
        exporter = create_exporter(config, context(component_id, shutdown_timeout=shutdown_timeout, **context_extra),
                                   environ=environ or {})
        cleanup.append(exporter)
        return exporter

    return make


async def test_each_signal_arrives_unchanged(make_exporter, grpc_sink, make_batch, counted) -> None:
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{grpc_sink.port}"})
    await exporter.start()
    batches = {s: make_batch(s, items=n + 1, tag=s.value) for n, s in enumerate(Signal)}
    for batch in batches.values():
        await exporter.export(batch)
    calls = await grpc_sink.wait_calls(3)
    assert {c.path: c.body for c in calls} == {SIGNALS[s].grpc_method: b.serialize() for s, b in batches.items()}
    await exporter.shutdown()
    assert [counted("sent", "otlp", s) for s in Signal] == [1, 2, 3]
    assert SIGNALS[T].grpc_method == "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


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


@pytest.mark.parametrize("compression", ["gzip", "none"])
async def test_compression_on_the_wire(make_exporter, grpc_sink, make_batch, compression: str) -> None:
    proxy, counter = await _byte_counting_proxy(grpc_sink.port)
    port = proxy.sockets[0].getsockname()[1]
    exporter = make_exporter({"endpoint": f"127.0.0.1:{port}", "tls": {"insecure": True}, "compression": compression})
    await exporter.start()
    batch = make_batch(items=5000)
    raw_size = len(batch.serialize())
    await exporter.export(batch)
    calls = await grpc_sink.wait_calls(1)
    assert calls[0].body == batch.serialize()
    await exporter.shutdown()
    proxy.close()
    if compression == "gzip":
        assert counter["up"] < raw_size / 4
    else:
        assert counter["up"] > raw_size


async def test_headers_environment_and_bearer_token(make_exporter, grpc_sink, make_batch) -> None:
    auth = BearerTokenAuth(BearerTokenAuthConfig(token="s3cret"))
    exporter = make_exporter(
        {"endpoint": f"127.0.0.1:{grpc_sink.port}", "headers": {"X-Tenant": "gpu-team"},
         "auth": {"authenticator": "bearertokenauth"}},
        environ={"OTEL_EXPORTER_OTLP_HEADERS": "x-env=from%20env,x-tenant=overridden",
                 "OTEL_EXPORTER_OTLP_INSECURE": "true"},
        authenticators={"bearertokenauth": auth},
    )
    await exporter.start()
    await exporter.export(make_batch())
    headers = (await grpc_sink.wait_calls(1))[0].headers
    await exporter.shutdown()
    assert headers["authorization"] == "Bearer s3cret"
    assert headers["x-tenant"] == "gpu-team"
    assert headers["x-env"] == "from env"
    assert headers["user-agent"].startswith("gputally/")


def test_missing_authenticator_is_a_config_error(make_exporter) -> None:
    with pytest.raises(ConfigError, match="bearertokenauth/nope"):
        make_exporter({"auth": {"authenticator": "bearertokenauth/nope"}})


@pytest.fixture
def tls_files(ca: trustme.CA, tmp_path: Path) -> dict[str, Path]:
    client = ca.issue_cert("gputally-client@example.com")
    files = {"ca_file": tmp_path / "ca.pem", "cert_file": tmp_path / "client.pem", "key_file": tmp_path / "client.key"}
    ca.cert_pem.write_to_path(str(files["ca_file"]))
    client.cert_chain_pems[0].write_to_path(str(files["cert_file"]))
    client.private_key_pem.write_to_path(str(files["key_file"]))
    return files


async def test_mutual_tls(make_exporter, start_grpc_sink, ca, tls_files, make_batch, counted) -> None:
    server = ca.issue_cert("127.0.0.1")
    credentials = grpc.ssl_server_credentials(
        [(server.private_key_pem.bytes(), b"".join(p.bytes() for p in server.cert_chain_pems))],
        root_certificates=ca.cert_pem.bytes(),
        require_client_auth=True,
    )
    sink = await start_grpc_sink(credentials=credentials)
    endpoint = f"127.0.0.1:{sink.port}"

    exporter = make_exporter({"endpoint": endpoint, "tls": {k: str(v) for k, v in tls_files.items()}})
    await exporter.start()
    await exporter.export(make_batch(items=2))
    assert (await sink.wait_calls(1))[0].body == make_batch(items=2).serialize()
    await exporter.shutdown()

    # The same CA from the environment, but no client certificate: the server refuses the handshake.
    anonymous = make_exporter({"endpoint": endpoint, "retry_on_failure": {"enabled": False}},
                              environ={"OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls_files["ca_file"])},
                              component_id="otlp/anon")
    await anonymous.start()
    await anonymous.export(make_batch(items=4))
    await anonymous.shutdown()
    assert counted("send_failed", "otlp/anon", M) == 4
    assert len(sink.calls) == 1


async def test_backend_down_then_up_loses_nothing(make_exporter, start_grpc_sink, free_port, make_batch,
                                                  counted, eventually) -> None:
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{free_port}"})
    await exporter.start()
    batches = [make_batch(s, items=2, tag=f"{s}{n}") for n in range(3) for s in Signal]
    for batch in batches:
        await exporter.export(batch)
    await asyncio.sleep(0.2)
    assert not exporter.ready
    sink = await start_grpc_sink(port=free_port)
    await eventually(lambda: sum(counted("sent", "otlp", s) for s in Signal) == 18)
    assert sorted(c.body for c in sink.calls) == sorted(b.serialize() for b in batches)
    assert exporter.ready
    await exporter.shutdown()


async def test_retry_info_delay_replaces_backoff(make_exporter, grpc_sink, make_batch, counted, eventually) -> None:
    grpc_sink.fail(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", retry_delay=0.3)
    exporter = make_exporter({"endpoint": f"127.0.0.1:{grpc_sink.port}", "tls": {"insecure": True},
                              "retry_on_failure": {"initial_interval": "3s", "randomization_factor": 0}})
    await exporter.start()
    await exporter.export(make_batch())
    first, second = await grpc_sink.wait_calls(2)
    assert 0.25 < second.at - first.at < 1.5
    await eventually(lambda: counted("sent", "otlp", M) == 3)
    await exporter.shutdown()


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  grpc.StatusCode.UNAUTHENTICATED])
async def test_permanent_errors_are_dropped_at_once(make_exporter, grpc_sink, make_batch, counted, eventually,
                                                    code: grpc.StatusCode) -> None:
    grpc_sink.fail(code, "no")  # RESOURCE_EXHAUSTED without RetryInfo is not retryable
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{grpc_sink.port}"})
    await exporter.start()
    await exporter.export(make_batch(items=3))
    await eventually(lambda: counted("send_failed", "otlp", M) == 3)
    await asyncio.sleep(0.1)  # time for several 10 ms retries, were there any
    assert len(grpc_sink.calls) == 1
    await exporter.shutdown()


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.ABORTED, grpc.StatusCode.DATA_LOSS])
async def test_transient_codes_are_retried(make_exporter, grpc_sink, make_batch, counted, eventually,
                                           code: grpc.StatusCode) -> None:
    grpc_sink.fail(code, times=2)
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{grpc_sink.port}"})
    await exporter.start()
    await exporter.export(make_batch(items=3))
    await eventually(lambda: counted("sent", "otlp", M) == 3)
    assert len(grpc_sink.calls) == 3 and counted("send_failed", "otlp", M) == 0
    await exporter.shutdown()


async def test_partial_success_is_counted(make_exporter, grpc_sink, make_batch, counted, eventually) -> None:
    response = ExportMetricsServiceResponse()
    response.partial_success.rejected_data_points = 2
    response.partial_success.error_message = "2 points too old"
    grpc_sink.response = response.SerializeToString()
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{grpc_sink.port}"})
    await exporter.start()
    await exporter.export(make_batch(items=5))
    await eventually(lambda: counted("sent", "otlp", M) == 3)
    assert counted("send_failed", "otlp", M) == 2
    await exporter.shutdown()


async def test_ready_once_the_channel_connects(make_exporter, start_grpc_sink, free_port, eventually) -> None:
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{free_port}"})
    started = time.monotonic()
    await exporter.start()
    assert time.monotonic() - started < 0.5  # start does not wait for the backend
    await asyncio.sleep(0.2)
    assert not exporter.ready
    await start_grpc_sink(port=free_port)
    await eventually(lambda: exporter.ready)  # no export needed
    await exporter.shutdown()


async def test_full_queue_pushes_back(make_exporter, grpc_sink, make_batch, counted, eventually) -> None:
    gate = grpc_sink.hold()
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{grpc_sink.port}",
                              "sending_queue": {"queue_size": 1, "num_consumers": 1}})
    await exporter.start()
    await exporter.export(make_batch(items=1))
    await grpc_sink.wait_calls(1)
    await exporter.export(make_batch(items=1))
    with pytest.raises(Refused):
        await exporter.export(make_batch(L, items=6))
    assert counted("enqueue_failed", "otlp", L) == 6
    gate.set()
    await eventually(lambda: counted("sent", "otlp", M) == 2)
    await exporter.shutdown()


async def test_persistent_queue_survives_a_restart(make_exporter, start_grpc_sink, free_port, make_batch,
                                                   counted, tmp_path: Path) -> None:
    section = {"endpoint": f"http://127.0.0.1:{free_port}",
               "sending_queue": {"storage": str(tmp_path), "num_consumers": 2}}
    first = make_exporter(section, component_id="otlp/durable", shutdown_timeout=0.5)
    await first.start()
    batches = [make_batch(s, items=2, tag=f"{s}{n}") for n in range(2) for s in Signal]
    for batch in batches:
        await first.export(batch)
    stored = sorted((tmp_path / "otlp%2Fdurable").glob("*.otlp"))
    assert [p.read_bytes() for p in stored] == [b.serialize() for b in batches]  # on disk before export returned
    await first.shutdown()
    assert len(list((tmp_path / "otlp%2Fdurable").glob("*.otlp"))) == 6  # the backend was down: all kept
    assert sum(counted("send_failed", "otlp/durable", s) for s in Signal) == 0

    sink = await start_grpc_sink(port=free_port)
    second = make_exporter(section, component_id="otlp/durable")
    await second.start()
    await sink.wait_calls(6)
    await second.shutdown()
    assert sorted(c.body for c in sink.calls) == sorted(b.serialize() for b in batches)  # each once
    assert list((tmp_path / "otlp%2Fdurable").glob("*.otlp")) == []


def test_insecure_skip_verify_is_refused_over_grpc(make_exporter) -> None:
    with pytest.raises(ConfigError, match="insecure_skip_verify"):
        make_exporter({"endpoint": "collector:4317", "tls": {"insecure_skip_verify": True}})


_CRASHING_PROCESS = """
import asyncio, json, os, sys
from gputally.exporters.config import OTLPGrpcConfig
from gputally.exporters.otlp_grpc import create_exporter
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext
from gputally.telemetry import SelfTelemetry

async def main(storage, port, batches):
    config = OTLPGrpcConfig.model_validate(
        {"endpoint": f"http://127.0.0.1:{port}", "sending_queue": {"storage": storage}})
    exporter = create_exporter(config, ComponentContext(id="otlp/crash", telemetry=SelfTelemetry()), environ={})
    await exporter.start()
    for signal, items, raw in batches:
        await exporter.export(Batch(Signal(signal), raw=bytes.fromhex(raw), items=items))
    os._exit(0)  # killed: no shutdown, no drain

asyncio.run(main(sys.argv[1], int(sys.argv[2]), json.loads(sys.stdin.read())))
"""


async def test_persistent_queue_survives_a_crash(make_exporter, start_grpc_sink, free_port, make_batch,
                                                 tmp_path: Path) -> None:
    batches = [make_batch(s, items=2, tag=f"crash-{s}") for s in Signal]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASHING_PROCESS, str(tmp_path), str(free_port), stdin=asyncio.subprocess.PIPE,
    )
    await process.communicate(json.dumps([[b.signal.value, b.items, b.serialize().hex()] for b in batches]).encode())
    assert process.returncode == 0
    assert len(list((tmp_path / "otlp%2Fcrash").glob("*.otlp"))) == 3

    sink = await start_grpc_sink(port=free_port)
    survivor = make_exporter({"endpoint": f"http://127.0.0.1:{free_port}", "sending_queue": {"storage": str(tmp_path)}},
                             component_id="otlp/crash")
    await survivor.start()
    await sink.wait_calls(3)
    await survivor.shutdown()
    assert sorted(c.body for c in sink.calls) == sorted(b.serialize() for b in batches)
    assert list((tmp_path / "otlp%2Fcrash").glob("*.otlp")) == []


async def test_a_backend_back_just_before_shutdown_still_gets_the_queue(
    make_exporter, start_grpc_sink, free_port, make_batch, counted
) -> None:
    """The shutdown drain waits for gRPC's reconnect instead of failing fast on a stale failure."""
    port = free_port
    # A long backoff: without the drain's wait-for-ready the last attempt would find the channel
    # still in TRANSIENT_FAILURE and drop everything.
    exporter = make_exporter({
        "endpoint": f"127.0.0.1:{port}", "tls": {"insecure": True},
        "retry_on_failure": {"initial_interval": "1s", "max_interval": "1s", "max_elapsed_time": "0"},
    }, shutdown_timeout=5.0)
    await exporter.start()
    for n in range(4):
        await exporter.export(make_batch(items=2, tag=str(n)))
    await asyncio.sleep(0.2)  # the first attempt was refused; the consumers wait out 1 s
    sink = await start_grpc_sink(port=port)
    await exporter.shutdown()
    assert len(await sink.wait_calls(4)) == 4
    assert counted("sent", "otlp", M) == 8 and counted("send_failed", "otlp", M) == 0
