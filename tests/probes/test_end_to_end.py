"""Probe (replay) -> the probe's exporter -> a real ``gputally serve`` -> an OTLP sink."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from harness.processes import unused_port
from support.otlp import OtlpSink

from gputally.cli.main import build_parser
from gputally.pipeline.config import load_config
from gputally.pipeline.service import Service
from gputally.probes.amd import cli as amd_cli
from gputally.probes.core.runner import ProbeOptions, Runner
from gputally.probes.delivery.exporter import create_exporter
from gputally.probes.gaudi import cli as gaudi_cli
from gputally.probes.nvml.replay import ReplaySource
from gputally.telemetry import SelfTelemetry
from tests.probes.nvml.helpers import GPU_UUID, collector, recording

LOGS = "opentelemetry.proto.collector.logs.v1.LogsService"
FAST_RETRY = {"retry_on_failure": {"initial_interval": "50ms", "max_interval": "200ms", "max_elapsed_time": "0"}}


def gateway(sink: OtlpSink, listen: str, listen_http: str = "127.0.0.1:0", *, reuse_port: bool = False) -> Service:
    text = yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": listen}, "http": {"endpoint": listen_http}}}},
        "exporters": {"otlp": {"endpoint": sink.endpoint, "tls": {"insecure": True}, **FAST_RETRY}},
        "service": {
            "pipelines": {
                "metrics": {"receivers": ["otlp"], "exporters": ["otlp"]},
                "logs": {"receivers": ["otlp"], "exporters": ["otlp"]},
            },
            "telemetry": {"metrics": {"address": None}},
            "shutdown_timeout": "2s",
        },
    })
    return Service(load_config(text), reuse_port=reuse_port)


def probe(
    endpoint: str, options: ProbeOptions, on_cycle: Any = None, protocol: Any = "grpc", queue_dir: Path | None = None
) -> Runner:
    telemetry = SelfTelemetry()
    _, exporter = create_exporter(
        protocol=protocol, endpoint=endpoint, insecure=True, headers={}, queue_dir=queue_dir, telemetry=telemetry,
        shutdown_timeout=2.0, overrides=FAST_RETRY,
    )
    return Runner(collector(ReplaySource(recording())), options=options, exporter=exporter, on_cycle=on_cycle)


async def vendor_replay_through_serve(sink: OtlpSink, vendor: str, recording: Path) -> Any:
    """``gputally probe <vendor> --replay recording --once`` into a real ``serve``: the one
    metrics message the sink got (its snapshot logs have arrived too)."""
    service = gateway(sink, "127.0.0.1:0")
    await service.start()
    try:
        endpoint = service.receivers["otlp"].listening()["grpc"]
        args = build_parser().parse_args(
            ["probe", vendor, "--replay", str(recording), "--once", "--endpoint", endpoint, "--insecure",
             "--node-name", "mi-1"])
        run = {"amd": amd_cli.run, "gaudi": gaudi_cli.run}[vendor]
        assert await run(args, 10.0) == 0
        await sink.wait_for(lambda: sink.messages() and sink.received[LOGS])
    finally:
        await service.shutdown()
    (message,) = sink.messages()
    return message


def delivered_cycles(sink: OtlpSink) -> set[int]:
    """The collection times of the GPU resources the sink got: one per delivered cycle."""
    return {
        rm.scope_metrics[0].metrics[0].gauge.data_points[0].time_unix_nano
        for message in sink.messages()
        for rm in message.resource_metrics
        if "process.pid" not in attributes(rm.resource.attributes)
    }


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in kvs}


async def test_one_collection_reaches_the_backend_through_serve(otlp_sink: OtlpSink) -> None:
    service = gateway(otlp_sink, "127.0.0.1:0")
    await service.start()
    try:
        endpoint = service.receivers["otlp"].listening()["grpc"]
        assert await probe(endpoint, ProbeOptions(once=True, drain_timeout_s=10)).run() == 0
        await otlp_sink.wait_for(lambda: otlp_sink.messages() and otlp_sink.received[LOGS])
    finally:
        await service.shutdown()
    (message,) = otlp_sink.messages()
    resources = [attributes(rm.resource.attributes) for rm in message.resource_metrics]
    processes = {r["process.pid"]: r for r in resources if "process.pid" in r}
    assert set(processes) == {628, 629}
    assert processes[628]["process.linux.cgroup"] == "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"
    assert "kubepods-burstable-pod6ee8558e" in processes[629]["process.linux.cgroup"]
    assert all(r["hw.id"] == GPU_UUID for r in resources)
    metrics = {m.name: m for m in message.resource_metrics[0].scope_metrics[0].metrics}
    assert (metrics["hw.power"].unit, metrics["hw.power"].gauge.data_points[0].as_double) == ("W", 683.843)
    assert (metrics["hw.energy"].unit, metrics["hw.energy"].sum.data_points[0].as_double) == ("J", 38481.635)
    assert metrics["hw.gpu.memory.usage"].sum.data_points[0].as_int == 14013562880
    (logs,) = otlp_sink.messages(LOGS)
    assert logs.resource_logs[0].scope_logs[0].log_records[0].event_name == "gputally.gpu.snapshot"


async def test_a_gateway_restart_loses_nothing(otlp_sink: OtlpSink) -> None:
    port = unused_port()  # the gateway is down, then comes up there
    times: list[int] = []

    def seen(cycle: Any) -> None:
        times.append(cycle.time_ns)
        if len(times) == 6:
            runner.stop()

    runner = probe(f"127.0.0.1:{port}", ProbeOptions(interval_s=0.1), on_cycle=seen)
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(0.35)  # three cycles while the gateway is down
    service = gateway(otlp_sink, f"127.0.0.1:{port}", reuse_port=True)  # beside the hold, as --workers binds
    await service.start()
    try:
        assert await asyncio.wait_for(task, timeout=20) == 0
        # Batches queued behind one in flight travel as one request, so count cycles, not requests.
        await otlp_sink.wait_for(lambda: delivered_cycles(otlp_sink) >= set(times), timeout=20)
    finally:
        await service.shutdown()
    assert delivered_cycles(otlp_sink) == set(times)


async def test_over_otlp_http_too(otlp_sink: OtlpSink) -> None:
    service = gateway(otlp_sink, "127.0.0.1:0")
    await service.start()
    try:
        endpoint = service.receivers["otlp"].listening()["http"]
        runner = probe(endpoint, ProbeOptions(once=True, drain_timeout_s=10), protocol="http")
        assert await runner.run() == 0
        await otlp_sink.wait_for(lambda: bool(otlp_sink.messages()))
    finally:
        await service.shutdown()
    pids = {attributes(rm.resource.attributes).get("process.pid") for rm in otlp_sink.messages()[0].resource_metrics}
    assert pids == {None, 628, 629}


async def test_a_persistent_queue_keeps_collections_across_a_probe_restart(
    otlp_sink: OtlpSink, tmp_path: Path
) -> None:
    times: list[int] = []

    def seen(cycle: Any) -> None:
        times.append(cycle.time_ns)
        if len(times) == 3:
            first.stop()

    first = probe(f"127.0.0.1:{unused_port()}", ProbeOptions(interval_s=0.05), on_cycle=seen, queue_dir=tmp_path)
    assert await asyncio.wait_for(first.run(), timeout=20) == 0  # the gateway was never there
    assert [p for p in tmp_path.rglob("*") if p.is_file()]
    service = gateway(otlp_sink, "127.0.0.1:0")
    await service.start()
    try:
        endpoint = service.receivers["otlp"].listening()["grpc"]
        second = probe(endpoint, ProbeOptions(once=True, drain_timeout_s=10), on_cycle=seen, queue_dir=tmp_path)
        assert await second.run() == 0
        await otlp_sink.wait_for(lambda: delivered_cycles(otlp_sink) >= set(times), timeout=20)
    finally:
        await service.shutdown()
    assert delivered_cycles(otlp_sink) == set(times)
