"""The ``otlphttp`` exporter against a real aiohttp sink on loopback."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trustme
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

from gputally.auth import BearerTokenAuth, BearerTokenAuthConfig
from gputally.exporters.config import OTLPHttpConfig
from gputally.exporters.otlp_http import create_exporter, parse_retry_after
from gputally.exporters.sender import QueuedExporter
from gputally.otlp.batch import Signal

M, L, T = Signal.METRICS, Signal.LOGS, Signal.TRACES
FAST_RETRY = {"initial_interval": "10ms", "max_interval": "50ms", "max_elapsed_time": "5s"}


@pytest.fixture
def make_exporter(context, cleanup) -> Callable[..., QueuedExporter]:
    def make(section: dict[str, Any], *, environ: dict[str, str] | None = None, component_id: str = "otlphttp",
             shutdown_timeout: float = 2.0, **context_extra: Any) -> QueuedExporter:
        config = OTLPHttpConfig.model_validate({"retry_on_failure": FAST_RETRY} | section)
        exporter = create_exporter(config, context(component_id, shutdown_timeout=shutdown_timeout, **context_extra),
                                   environ=environ or {})
        cleanup.append(exporter)
        return exporter

    return make


async def test_each_signal_posted_unchanged_with_gzip(make_exporter, http_sink, make_batch, counted) -> None:
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{http_sink.port}/otlp"})
    await exporter.start()
    batches = {s: make_batch(s, items=400, tag=s.value) for s in Signal}
    for batch in batches.values():
        await exporter.export(batch)
    calls = await http_sink.wait_calls(3)
    await exporter.shutdown()
    assert {c.path: c.body for c in calls} == {f"/otlp/v1/{s}": b.serialize() for s, b in batches.items()}
    for call in calls:
        assert call.headers["Content-Encoding"] == "gzip"
        assert call.headers["Content-Type"] == "application/x-protobuf"
        assert call.wire_size is not None and call.wire_size < len(call.body) / 4
    assert [counted("sent", "otlphttp", s) for s in Signal] == [400, 400, 400]


async def test_signal_endpoint_from_config_and_environment(make_exporter, http_sink, make_batch) -> None:
    base = f"http://127.0.0.1:{http_sink.port}"
    exporter = make_exporter(
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


async def test_headers_and_bearer_token(make_exporter, http_sink, make_batch) -> None:
    exporter = make_exporter(
        {"endpoint": f"http://127.0.0.1:{http_sink.port}", "headers": {"X-Tenant": "gpu-team"},
         "auth": {"authenticator": "bearertokenauth/backend"}},
        environ={"OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-scope-orgid=a%2Cb"},
        authenticators={"bearertokenauth/backend": BearerTokenAuth(BearerTokenAuthConfig(token="t0k", scheme="Token"))},
    )
    await exporter.start()
    await exporter.export(make_batch())
    headers = (await http_sink.wait_calls(1))[0].headers
    await exporter.shutdown()
    assert headers["Authorization"] == "Token t0k"
    assert headers["X-Tenant"] == "gpu-team"
    assert headers["x-scope-orgid"] == "a,b"
    assert headers["User-Agent"].startswith("gputally/")


async def test_json_encoding_uses_hex_ids(make_exporter, http_sink, make_batch, counted, eventually) -> None:
    response = ExportLogsServiceResponse()
    response.partial_success.rejected_log_records = 1
    http_sink.response = b'{"partialSuccess":{"rejectedLogRecords":"1","errorMessage":"one too long"}}'
    http_sink.content_type = "application/json"
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{http_sink.port}", "encoding": "json"})
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


@pytest.fixture
def tls_files(ca: trustme.CA, tmp_path: Path) -> dict[str, Path]:
    client = ca.issue_cert("gputally-client@example.com")
    files = {"ca_file": tmp_path / "ca.pem", "cert_file": tmp_path / "client.pem", "key_file": tmp_path / "client.key"}
    ca.cert_pem.write_to_path(str(files["ca_file"]))
    client.cert_chain_pems[0].write_to_path(str(files["cert_file"]))
    client.private_key_pem.write_to_path(str(files["key_file"]))
    return files


async def test_mutual_tls(make_exporter, start_http_sink, ca, tls_files, make_batch, counted) -> None:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    ca.configure_trust(server_context)
    server_context.verify_mode = ssl.CERT_REQUIRED
    sink = await start_http_sink(ssl_context=server_context)
    url = f"https://127.0.0.1:{sink.port}"

    exporter = make_exporter({"endpoint": url}, environ={
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls_files["ca_file"]),
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(tls_files["cert_file"]),
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(tls_files["key_file"]),
    })
    await exporter.start()
    await exporter.export(make_batch(items=2))
    assert (await sink.wait_calls(1))[0].body == make_batch(items=2).serialize()
    await exporter.shutdown()

    anonymous = make_exporter({"endpoint": url, "tls": {"ca_file": str(tls_files["ca_file"])},
                               "retry_on_failure": {"enabled": False}}, component_id="otlphttp/anon")
    await anonymous.start()
    await anonymous.export(make_batch(items=4))
    await anonymous.shutdown()
    assert counted("send_failed", "otlphttp/anon", M) == 4
    assert len(sink.calls) == 1


async def test_backend_down_then_up_loses_nothing(make_exporter, start_http_sink, free_port, make_batch,
                                                  counted, eventually) -> None:
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{free_port}"})
    await exporter.start()
    batches = [make_batch(s, items=2, tag=f"{s}{n}") for n in range(3) for s in Signal]
    for batch in batches:
        await exporter.export(batch)
    await asyncio.sleep(0.2)
    assert not exporter.ready
    sink = await start_http_sink(port=free_port)
    await eventually(lambda: sum(counted("sent", "otlphttp", s) for s in Signal) == 18)
    assert sorted(c.body for c in sink.calls) == sorted(b.serialize() for b in batches)
    assert exporter.ready
    await exporter.shutdown()


async def test_retry_after_is_honoured(make_exporter, http_sink, make_batch, counted, eventually) -> None:
    http_sink.fail(429, headers={"Retry-After": "1"})
    http_sink.fail(503, headers={"Retry-After": "0"})
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{http_sink.port}",
                              "retry_on_failure": {"initial_interval": "10ms", "randomization_factor": 0}})
    await exporter.start()
    await exporter.export(make_batch())
    first, second, third = await http_sink.wait_calls(3)
    assert 0.9 < second.at - first.at < 2.0
    assert third.at - second.at < 0.5
    await eventually(lambda: counted("sent", "otlphttp", M) == 3)
    await exporter.shutdown()


@pytest.mark.parametrize("status", [429, 502, 503, 504])
async def test_retryable_statuses(make_exporter, http_sink, make_batch, counted, eventually, status: int) -> None:
    http_sink.fail(status, times=2)
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{http_sink.port}"})
    await exporter.start()
    await exporter.export(make_batch(items=3))
    await eventually(lambda: counted("sent", "otlphttp", M) == 3)
    assert len(http_sink.calls) == 3
    await exporter.shutdown()


@pytest.mark.parametrize("status", [400, 401, 404, 413, 500])
async def test_other_statuses_are_permanent(make_exporter, http_sink, make_batch, counted, eventually,
                                            caplog: pytest.LogCaptureFixture, status: int) -> None:
    body = status_pb2.Status(code=3, message="metric name is empty").SerializeToString()
    http_sink.fail(status, headers={"Content-Type": "application/x-protobuf"}, body=body)
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{http_sink.port}"})
    await exporter.start()
    await exporter.export(make_batch(items=3))
    await eventually(lambda: counted("send_failed", "otlphttp", M) == 3)
    await asyncio.sleep(0.1)  # time for several 10 ms retries, were there any
    assert len(http_sink.calls) == 1
    await exporter.shutdown()
    assert f"HTTP {status}" in caplog.text and "metric name is empty" in caplog.text


async def test_ready_after_tcp_connect(make_exporter, http_sink, eventually) -> None:
    exporter = make_exporter({"endpoint": f"http://127.0.0.1:{http_sink.port}"})
    assert not exporter.ready
    await exporter.start()
    await eventually(lambda: exporter.ready)  # no export needed
    await exporter.shutdown()


async def test_persistent_queue_survives_a_restart(make_exporter, start_http_sink, free_port, make_batch,
                                                   tmp_path: Path) -> None:
    section = {"endpoint": f"http://127.0.0.1:{free_port}", "sending_queue": {"storage": str(tmp_path)}}
    first = make_exporter(section, shutdown_timeout=0.5)
    await first.start()
    batches = [make_batch(s, tag="restart") for s in Signal]
    for batch in batches:
        await first.export(batch)
    await first.shutdown()
    assert len(list((tmp_path / "otlphttp").glob("*.otlp"))) == 3

    sink = await start_http_sink(port=free_port)
    second = make_exporter(section)
    await second.start()
    await sink.wait_calls(3)
    await second.shutdown()
    assert sorted(c.body for c in sink.calls) == sorted(b.serialize() for b in batches)
    assert list((tmp_path / "otlphttp").glob("*.otlp")) == []


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
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    now = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC)
    assert parse_retry_after(value, now=now) == expected
