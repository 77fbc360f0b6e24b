"""gputally serve, end to end: OTLP in, processors applied, OTLP out to a real gRPC backend."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import yaml
from harness.processes import free_port
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from support.otlp import OtlpSink

from gputally.pipeline.config import load_config
from gputally.pipeline.service import Service

METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
GPUTALLY = str(Path(sys.executable).parent / "gputally")


def gpu_request(points: int = 3, gpu: str = "GPU-0") -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    kv = resource.resource.attributes.add()
    kv.key, kv.value.string_value = "hw.id", gpu
    metric = resource.scope_metrics.add().metrics.add()
    metric.name = "hw.gpu.utilization"
    for value in range(points):
        metric.gauge.data_points.add().as_double = value / 10
    return request


def config_text(grpc_port: int, sink: OtlpSink, *, storage: Path | None = None, extra_exporter: dict[str, Any] | None = None) -> str:
    exporter: dict[str, Any] = {
        "endpoint": sink.endpoint,
        "tls": {"insecure": True},
        "retry_on_failure": {"initial_interval": "50ms", "max_interval": "200ms", "max_elapsed_time": "0"},
        "sending_queue": {"queue_size": 100},
    }
    extensions: dict[str, Any] = {}
    if storage:
        extensions["file_storage"] = {"directory": str(storage)}
        exporter["sending_queue"]["storage"] = "file_storage"
    exporter.update(extra_exporter or {})
    return yaml.safe_dump(
        {
            "extensions": extensions,
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"}}}},
            "processors": {
                "attributes/cluster": {
                    "actions": [{"key": "k8s.cluster.name", "value": "test", "action": "insert", "context": "resource"}]
                }
            },
            "exporters": {"otlp": exporter},
            "service": {
                "pipelines": {
                    "metrics": {"receivers": ["otlp"], "processors": ["attributes/cluster"], "exporters": ["otlp"]}
                },
                "telemetry": {"metrics": {"address": None}},
                "shutdown_timeout": "2s",
            },
        }
    )


def resource_attributes(message: ExportMetricsServiceRequest) -> list[dict[str, str]]:
    return [{kv.key: kv.value.string_value for kv in rm.resource.attributes} for rm in message.resource_metrics]


async def send(port: int, request: ExportMetricsServiceRequest) -> None:
    """One request on a connection of its own: grpc's global subchannel pool would otherwise
    hand a later channel the earlier one's TCP connection (and so the same --workers worker)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        await channel.unary_unary(METRICS_EXPORT)(request.SerializeToString(), timeout=5)


async def test_request_comes_out_enriched(otlp_sink: OtlpSink) -> None:
    port = free_port()
    service = Service(load_config(config_text(port, otlp_sink)))
    await service.start()
    try:
        await send(port, gpu_request())
        await otlp_sink.wait_for(lambda: len(otlp_sink.received_metrics()) == 1)
    finally:
        await service.shutdown()
    (message,) = otlp_sink.messages()
    assert resource_attributes(message) == [{"hw.id": "GPU-0", "k8s.cluster.name": "test"}]
    assert len(message.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points) == 3


async def test_backend_outage_loses_nothing_within_the_queue_bound() -> None:
    sink = OtlpSink(free_port())  # not started: the backend is down
    port = free_port()
    service = Service(load_config(config_text(port, sink)))
    await service.start()
    try:
        for gpu in range(20):
            await send(port, gpu_request(points=5, gpu=f"GPU-{gpu}"))
        assert not service.ready
        await asyncio.sleep(0.5)  # several failed retries
        await sink.start()
        await sink.wait_for(lambda: sum(
            len(rm.scope_metrics[0].metrics[0].gauge.data_points) for m in sink.messages() for rm in m.resource_metrics
        ) >= 100)
        assert service.ready
    finally:
        await service.shutdown()
        await sink.stop()
    gpus = sorted(attrs["hw.id"] for m in sink.messages() for attrs in resource_attributes(m))
    assert gpus == sorted(f"GPU-{gpu}" for gpu in range(20))


def _serve(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [GPUTALLY, "serve", "--config", str(config)], stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


def _wait_listening(proc: subprocess.Popen[str], workers: int = 1) -> list[str]:
    """stderr's lines until ``workers`` services have printed their pipelines (20 s at most).

    Read in a thread: a blocking readline on a process that prints nothing more would
    otherwise outlast any deadline."""
    assert proc.stderr is not None
    stderr = proc.stderr
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in stderr:
            lines.append(line)
            if sum(seen.count("gputally: pipelines") for seen in lines) >= workers:
                break
        started.set()

    threading.Thread(target=read, name="gputally stderr", daemon=True).start()
    if not started.wait(20) or sum(line.count("gputally: pipelines") for line in lines) < workers:
        raise AssertionError(f"gputally did not start: {''.join(lines)}")
    return lines


async def test_persistent_queue_survives_sigterm_and_restart(tmp_path: Path) -> None:
    sink = OtlpSink(free_port())
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(config_text(port, sink, storage=tmp_path / "queue"))

    first = _serve(config)
    lines = _wait_listening(first)
    assert any(f"listening on 127.0.0.1:{port}" in line for line in lines)
    for gpu in range(5):
        await send(port, gpu_request(points=2, gpu=f"GPU-{gpu}"))
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    assert list((tmp_path / "queue").rglob("*")), "the queue should hold the unsent batches on disk"

    await sink.start()
    second = _serve(config)
    try:
        _wait_listening(second)
        await sink.wait_for(lambda: len({a["hw.id"] for m in sink.messages() for a in resource_attributes(m)}) == 5)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
        await sink.stop()
    assert all(a["k8s.cluster.name"] == "test" for m in sink.messages() for a in resource_attributes(m))


async def test_admin_endpoint_reports_metrics_and_readiness(otlp_sink: OtlpSink) -> None:
    from gputally.cli.admin import AdminServer

    port = free_port()
    service = Service(load_config(config_text(port, otlp_sink)))
    admin = AdminServer("127.0.0.1:0", service.telemetry.registry, service.not_ready, service.degraded)
    await admin.start()
    await service.start()
    try:
        await send(port, gpu_request(points=4))
        await otlp_sink.wait_for(lambda: len(otlp_sink.received_metrics()) == 1)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{admin.address}/healthz") as response:
                assert response.status == 200
            for _ in range(100):
                async with http.get(f"http://{admin.address}/readyz") as response:
                    status, body = response.status, await response.text()
                if status == 200:
                    break
                await asyncio.sleep(0.05)
            assert status == 200
            assert json.loads(body) == {"ready": True, "waiting_for": [], "degraded": {}}
            async with http.get(f"http://{admin.address}/metrics") as response:
                text = await response.text()
        assert 'gputally_receiver_accepted_items_total{receiver="otlp",signal="metrics",transport="grpc"} 4.0' in text
        assert 'gputally_exporter_sent_items_total{exporter="otlp",signal="metrics"} 4.0' in text
    finally:
        await service.shutdown()
        await admin.shutdown()


def test_cli_validate_and_version(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("receivers: {otlp: {protocols: {grpc: {endpiont: x}}}}\nexporters: {debug: {}}\n"
                   "service: {pipelines: {metrics: {receivers: [otlp], exporters: [debug]}}}\n")
    result = subprocess.run([GPUTALLY, "validate", "--config", str(bad)], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == "gputally: config error: receivers.otlp.protocols.grpc.endpiont: unknown key"
    result = subprocess.run([GPUTALLY, "validate"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    result = subprocess.run([GPUTALLY, "version"], capture_output=True, text=True)
    assert result.stdout.startswith("gputally ")


def test_default_serve_prints_where_it_listens_and_shows_data() -> None:
    grpc_port, http_port, admin_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "GPUTALLY_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
        "GPUTALLY_HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
        "GPUTALLY_ADMIN_ENDPOINT": f"127.0.0.1:{admin_port}",
    }
    proc = subprocess.Popen([GPUTALLY, "serve"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = _wait_listening(proc)
        text = "".join(lines)
        # One clean startup block: each listener and the limiter's limits said once.
        assert text.count(f"OTLP/gRPC listening on 127.0.0.1:{grpc_port}") == 1
        assert text.count(f"OTLP/HTTP listening on 127.0.0.1:{http_port}") == 1
        assert text.count("memory_limiter: limits") == 1
        asyncio.run(send(grpc_port, gpu_request(points=7)))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    # The 7 points sent, and the default's usage processor's counters for the GPU they came
    # from at shutdown: observed and unobserved time, and the unattributed time of each of its
    # two reasons, each a 0 at its start and the value now.
    printed = [int(n) for n in re.findall(r"metrics: \d+ resources?, (\d+) data points?", out)]
    assert sum(printed) == 7 + 8, out


async def test_workers_share_the_port_and_each_serves_its_own_metrics(tmp_path: Path) -> None:
    sink = OtlpSink(free_port())
    await sink.start()
    port, admin = free_port(), free_port()
    while admin + 1 == port:
        admin = free_port()
    config = yaml.safe_load(config_text(port, sink))
    config["service"]["telemetry"]["metrics"]["address"] = f"127.0.0.1:{admin}"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([GPUTALLY, "serve", "--config", str(path), "--workers", "2"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait_listening(proc, workers=2)
        # The kernel spreads connections, not requests: use one connection per request.
        for gpu in range(12):
            await send(port, gpu_request(points=1, gpu=f"GPU-{gpu}"))
        await sink.wait_for(lambda: len(sink.received_metrics()) == 12)
        accepted = []
        async with aiohttp.ClientSession() as http:
            for worker in (0, 1):
                async with http.get(f"http://127.0.0.1:{admin + worker}/metrics") as response:
                    text = await response.text()
                line = next(li for li in text.splitlines()
                            if li.startswith('gputally_receiver_accepted_items_total{receiver="otlp",signal="metrics"'))
                accepted.append(float(line.rsplit(" ", 1)[1]))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        await sink.stop()
    assert sum(accepted) == 12
    # 12 connections all hashed to one worker would happen once in 2,048 runs.
    assert min(accepted) > 0, accepted
