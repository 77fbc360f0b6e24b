"""The slurm processor inside a real service: the NVIDIA probe's OTLP (replayed from the H200
recording, with a real Slurm job's process in it) in over gRPC, attributed, out to a backend."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path
from typing import Any

import grpc
import yaml
from harness.slurm.cluster import SlurmCluster
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from support.otlp import OtlpSink

from gputally.pipeline.config import load_config
from gputally.pipeline.registry import Registry
from gputally.pipeline.service import Service
from gputally.probes.core.otlp_shape import metrics_request
from gputally.probes.nvml.collector import NvmlCollector
from gputally.probes.nvml.replay import ReplaySource, load_recording
from gputally.processors.slurm import SlurmProcessor, factory
from tests.processors.builders import from_any_value
from tests.processors.slurm.scenario import Jobs

RECORDING = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "nvml" / "h200-two-workloads.json"
METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


def registry() -> Registry:
    """The installed registry, with the slurm factory whether or not its entry point is installed yet."""
    found = Registry.discover()
    return Registry(
        receivers=found.receivers, processors={**found.processors, "slurm": factory},
        exporters=found.exporters, extensions=found.extensions,
    )


def config_text(port: int, sink: OtlpSink, cluster: SlurmCluster) -> str:
    return yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "processors": {
            "slurm": {
                "backend": "slurmrestd",
                "slurmrestd": {"endpoint": cluster.restd_url, "token": "${env:TEST_SLURM_JWT}", "timeout": "2s"},
                "gres": {"conf": str(cluster.gres_conf)},
                "cache": {"refresh_interval": "1s"},
            }
        },
        "exporters": {"otlp": {
            "endpoint": sink.endpoint, "tls": {"insecure": True},
            "retry_on_failure": {"initial_interval": "50ms", "max_interval": "200ms"},
        }},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["slurm"], "exporters": ["otlp"]}},
            "telemetry": {"metrics": {"address": None}},
            "shutdown_timeout": "2s",
        },
    })


async def probe_request(cluster: SlurmCluster, jobs: Jobs) -> ExportMetricsServiceRequest:
    """One cycle of the real probe over the H200 recording, moved onto the test cluster: the
    busy process (pid 628) runs in the real job holding GRES index 0 (device minor 5)."""
    recording = copy.deepcopy(load_recording(RECORDING))
    recording["device"]["minor_number"] = 5
    for snapshot in recording["snapshots"]:
        facts = snapshot.get("proc_facts", {})
        if "628" in facts:
            facts["628"]["cgroup"] = jobs.gpu_first.cgroup
    source = ReplaySource(recording)
    collector = NvmlCollector(source, source, node_name=cluster.node, events=False)
    await collector.open()
    try:
        cycle = await collector.collect()
    finally:
        await collector.close()
    return metrics_request(cycle.entities, time.time_ns())


def resource_attributes(raw: bytes) -> list[dict[str, Any]]:
    message = ExportMetricsServiceRequest.FromString(raw)
    return [{kv.key: from_any_value(kv.value) for kv in rm.resource.attributes} for rm in message.resource_metrics]


async def test_probe_data_through_a_service_gets_slurm_attributes(
    slurm_cluster: SlurmCluster, slurm_jobs: Jobs, otlp_sink: OtlpSink, monkeypatch: Any
) -> None:
    monkeypatch.setenv("TEST_SLURM_JWT", slurm_cluster.token())
    service = Service(load_config(config_text(0, otlp_sink, slurm_cluster), registry=registry()))
    await service.start()
    try:
        address = service.receivers["otlp"].listening()["grpc"]
        [stage] = service.pipelines["metrics"].stages
        processor = stage.processor
        assert isinstance(processor, SlurmProcessor)
        request = (await probe_request(slurm_cluster, slurm_jobs)).SerializeToString()
        async with grpc.aio.insecure_channel(address) as channel:
            export = channel.unary_unary(METRICS_EXPORT)
            await export(request, timeout=5)
            await asyncio.wait_for(processor.lookups_answered(), 15)
            await export(request, timeout=5)
        deadline = time.monotonic() + 10
        while len(otlp_sink.received[SERVICE]) < 2:
            assert time.monotonic() < deadline, "the backend did not get both requests"
            await asyncio.sleep(0.05)
    finally:
        await service.shutdown()

    first, second = (resource_attributes(raw) for raw in otlp_sink.received[SERVICE][:2])
    by_pid = {r.get("process.pid"): r for r in second}
    gpu = by_pid[None]
    assert gpu["hw.name"] == "nvidia5"
    job = slurm_jobs.gpu_first.job_id
    assert gpu["slurm.job.id"] == job and gpu["slurm.job.source"] == "gres"
    assert gpu["slurm.job.name"] == "gpu-first" and gpu["slurm.job.user"] == "root"
    busy = by_pid[628]
    assert busy["slurm.job.id"] == job and busy["slurm.job.step"] == "batch" and busy["slurm.job.source"] == "cgroup"
    assert busy["slurm.job.account"] == "physics" and busy["slurm.cluster.name"] == "gputally-test"
    assert not any(k.startswith("slurm.") for k in by_pid[629])  # the Kubernetes container is not Slurm's
    # the first request went out at once, attributed from the cgroup before any lookup answered
    assert {r.get("process.pid"): r.get("slurm.job.id") for r in first}[628] == job
