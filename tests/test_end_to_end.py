"""gputally serve, end to end: OTLP in, processors applied, OTLP out to a real gRPC backend."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import yaml
from harness.processes import Ports, start_on_ports, unused_port
from harness.serve import Listening, wait_listening
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


def grpc_port(service: Service) -> int:
    """The port the service's otlp receiver got (configured with port 0)."""
    return int(service.receivers["otlp"].listening()["grpc"].rpartition(":")[2])


async def test_request_comes_out_enriched(otlp_sink: OtlpSink) -> None:
    service = Service(load_config(config_text(0, otlp_sink)))
    await service.start()
    try:
        await send(grpc_port(service), gpu_request())
        await otlp_sink.wait_for(lambda: len(otlp_sink.received_metrics()) == 1)
    finally:
        await service.shutdown()
    (message,) = otlp_sink.messages()
    assert resource_attributes(message) == [{"hw.id": "GPU-0", "k8s.cluster.name": "test"}]
    assert len(message.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points) == 3


async def test_backend_outage_loses_nothing_within_the_queue_bound() -> None:
    sink = OtlpSink(unused_port())  # not started: the backend is down
    service = Service(load_config(config_text(0, sink)))
    await service.start()
    port = grpc_port(service)
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


def _serve(config: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``gputally serve --config CONFIG ARGS``, its stderr appended to ``log``."""
    with log.open("ab") as stderr:
        return subprocess.Popen([GPUTALLY, "serve", "--config", str(config), *args], stderr=stderr,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _started(proc: subprocess.Popen[bytes], log: Path, workers: int = 1) -> Listening:
    """Where ``proc`` listens, once its ``workers`` services have started (20 s at most)."""
    return wait_listening(proc, log, 20, workers=workers, since=0)


async def test_persistent_queue_survives_sigterm_and_restart(tmp_path: Path) -> None:
    sink = OtlpSink(unused_port())
    config = tmp_path / "config.yaml"
    config.write_text(config_text(0, sink, storage=tmp_path / "queue"))

    first = _serve(config, tmp_path / "first.log")
    port = _started(first, tmp_path / "first.log").port("grpc")
    for gpu in range(5):
        await send(port, gpu_request(points=2, gpu=f"GPU-{gpu}"))
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    assert list((tmp_path / "queue").rglob("*")), "the queue should hold the unsent batches on disk"

    await sink.start()
    second = _serve(config, tmp_path / "second.log")
    try:
        _started(second, tmp_path / "second.log")
        await sink.wait_for(lambda: len({a["hw.id"] for m in sink.messages() for a in resource_attributes(m)}) == 5)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
        await sink.stop()
    assert all(a["k8s.cluster.name"] == "test" for m in sink.messages() for a in resource_attributes(m))


async def test_admin_endpoint_reports_metrics_and_readiness(otlp_sink: OtlpSink) -> None:
    from gputally.cli.admin import AdminServer

    service = Service(load_config(config_text(0, otlp_sink)))
    admin = AdminServer("127.0.0.1:0", service.telemetry.registry, service.not_ready, service.degraded)
    await admin.start()
    await service.start()
    try:
        await send(grpc_port(service), gpu_request(points=4))
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


def test_default_serve_prints_where_it_listens_and_shows_data(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "GPUTALLY_GRPC_ENDPOINT": "127.0.0.1:0",
        "GPUTALLY_HTTP_ENDPOINT": "127.0.0.1:0",
        "GPUTALLY_ADMIN_ENDPOINT": "127.0.0.1:0",
    }
    log = tmp_path / "serve.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen([GPUTALLY, "serve"], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    try:
        listening = wait_listening(proc, log, 20)
        text = log.read_text()
        # One clean startup block: each listener and the limiter's limits said once.
        for transport, said in (("grpc", "OTLP/gRPC"), ("http", "OTLP/HTTP")):
            assert text.count(f"{said} listening on ") == 1
            assert text.count(f"{said} listening on {listening.address(transport)}") == 1
        assert text.count("/healthz and /readyz on ") == 1 and listening.admin_port > 0
        assert text.count("memory_limiter: limits") == 1
        asyncio.run(send(listening.port("grpc"), gpu_request(points=7)))
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
    sink = OtlpSink()
    await sink.start()
    # Port 0 would give each worker a port of its own: the shared one is held here, and the
    # workers bind it beside the hold (SO_REUSEPORT, as they do to share it).
    port = unused_port()
    config = yaml.safe_load(config_text(port, sink))
    path, log = tmp_path / "config.yaml", tmp_path / "serve.log"

    def start(ports: Ports) -> tuple[subprocess.Popen[bytes], int]:
        """Worker N serves its metrics on the admin port + N: a picked port, and the next one,
        which another process may hold (then both start again on others)."""
        admin = ports["admin"]
        config["service"]["telemetry"]["metrics"]["address"] = f"127.0.0.1:{admin}"
        path.write_text(yaml.safe_dump(config))
        since = log.stat().st_size if log.exists() else 0
        proc = _serve(path, log, "--workers", "2")
        listening = wait_listening(proc, log, 20, workers=2, since=since)
        assert sorted(listening.admin) == [f"127.0.0.1:{admin}", f"127.0.0.1:{admin + 1}"], listening.admin
        return proc, admin

    proc, admin = start_on_ports(start, what="gputally serve --workers 2")
    try:
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
