"""The OTLP shape: one Resource per GPU and per process, identity on resources, one scope."""

from __future__ import annotations

import importlib


import doctext
from opentelemetry.proto.metrics.v1 import metrics_pb2

from gputally import __version__
from gputally.otlp.batch import Batch, Signal
from gputally.probes.core import catalog
from gputally.probes.core.otlp_shape import logs_request, metrics_request
from gputally.probes.nvml.replay import ReplaySource
from tests.probes.nvml.helpers import GPU_UUID, recording, run_cycles

CUMULATIVE = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def attributes(kvs) -> dict:  # type: ignore[no-untyped-def,type-arg]
    out = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


async def test_one_resource_per_gpu_and_per_process() -> None:
    (cycle,) = await run_cycles(ReplaySource(recording()), 1)
    request = metrics_request(cycle.entities, cycle.time_ns)
    resources = [attributes(rm.resource.attributes) for rm in request.resource_metrics]
    assert [r["hw.id"] for r in resources] == [GPU_UUID] * 3
    assert [r.get("process.pid") for r in resources] == [None, 628, 629]
    assert resources[1]["process.linux.cgroup"] == "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"
    for rm in request.resource_metrics:
        (scope,) = rm.scope_metrics
        assert (scope.scope.name, scope.scope.version) == ("gputally.probes.nvml", __version__)
        for metric in scope.metrics:
            points = metric.gauge.data_points or metric.sum.data_points
            for point in points:
                keys = {kv.key for kv in point.attributes}
                assert not keys & {"hw.id", "process.pid", "host.name"}  # identity lives on the resource
                assert point.time_unix_nano == cycle.time_ns


async def test_metric_types_units_and_values() -> None:
    (cycle,) = await run_cycles(ReplaySource(recording()), 1)
    request = metrics_request(cycle.entities, cycle.time_ns)
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    energy = metrics["hw.energy"]
    assert energy.unit == "J" and energy.sum.is_monotonic and energy.sum.aggregation_temporality == CUMULATIVE
    assert energy.sum.data_points[0].as_double == 38481.635
    assert energy.sum.data_points[0].start_time_unix_nano > 0
    usage = metrics["hw.gpu.memory.usage"]
    assert usage.unit == "By" and not usage.sum.is_monotonic and usage.sum.data_points[0].as_int == 14013562880
    power = metrics["hw.power"]
    assert power.unit == "W" and power.HasField("gauge") and power.gauge.data_points[0].as_double == 683.843
    utilization = metrics["hw.gpu.utilization"]
    assert {attributes(p.attributes)["hw.gpu.task"]: p.as_double for p in utilization.gauge.data_points} == {
        "general": 0.99, "encoder": 0.0, "decoder": 0.0,
    }
    assert metrics["hw.temperature"].unit == "Cel" and metrics["gputally.gpu.clock.frequency"].unit == "Hz"
    for name, metric in metrics.items():
        assert metric.unit == catalog.by_name(name).unit and metric.description


async def test_request_counts_as_a_batch() -> None:
    (cycle,) = await run_cycles(ReplaySource(recording()), 1)
    batch = Batch(Signal.METRICS, message=metrics_request(cycle.entities, cycle.time_ns))
    assert batch.items == sum(len(e.points) for e in cycle.entities)


async def test_one_snapshot_log_per_gpu_per_cycle() -> None:
    (cycle,) = await run_cycles(ReplaySource(recording(), copies=2), 1)
    request = logs_request(cycle.logs, cycle.time_ns)
    assert len(request.resource_logs) == 2
    for resource_logs in request.resource_logs:
        (record,) = resource_logs.scope_logs[0].log_records
        assert record.event_name == "gputally.gpu.snapshot" and record.severity_text == "INFO"
        body = {kv.key: kv.value for kv in record.body.kvlist_value.values}
        assert body["name"].string_value == "NVIDIA H200"
        readings = {kv.key for kv in body["readings"].kvlist_value.values}
        assert {"utilization", "memory_v2", "compute_procs"} <= readings
        processes = body["processes"].array_value.values
        assert [attributes(p.kvlist_value.values)["pid"] for p in processes] == [628, 629]


def test_readme_documents_every_metric() -> None:
    section = doctext.section("NVIDIA probe")  # docs/components/probes.md
    missing = [m.name for m in catalog.ALL if f"`{m.name}`" not in section]
    assert not missing, f"the NVIDIA probe section (docs) lacks {missing}"


def test_public_api_is_pinned() -> None:
    """The probe core's public names, each exported by its module."""
    homes = {"Collector": "collector", "OtlpEncoder": "otlp_shape", "ProbeOptions": "runner", "ProcFacts": "procfacts",
             "ProcFs": "hints", "Runner": "runner"}
    for name, module in homes.items():
        found = importlib.import_module(f"gputally.probes.core.{module}")
        assert name in found.__all__ and getattr(found, name).__name__ == name
