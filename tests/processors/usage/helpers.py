"""Running the usage runtime by hand, and reading its counters and events back."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.processors.usage.config import UsageConfig
from gputally.processors.usage.processor import UsageRuntime

COUNTERS = {
    "gputally.usage.allocated.time": "allocated",
    "gputally.usage.busy.time": "busy",
    "gputally.usage.idle.time": "idle",
    "gputally.usage.energy": "energy",
    "gputally.usage.memory.peak": "peak",
    "gputally.usage.cost": "cost",
}


class FakeClock:
    """Monotonic seconds and wall nanoseconds that move only when told to."""

    def __init__(self, wall_ns: int = 1_800_000_000 * 10**9) -> None:
        self.now = 1000.0
        self.wall = wall_ns

    def monotonic(self) -> float:
        return self.now

    def wall_ns(self) -> int:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += int(seconds * 1e9)


def runtime(clock: FakeClock | None = None, *, storage: Path | None = None, **config: Any) -> UsageRuntime:
    """A runtime of ``config``; ``storage``: the directory of the file_storage extension it names."""
    clock = clock or FakeClock()
    config.setdefault("settle", 0)
    if storage is not None:
        config["storage"] = "file_storage"
    return UsageRuntime(UsageConfig(**config), name="usage", storage=storage, monotonic=clock.monotonic,
                        wall_ns=clock.wall_ns)


def feed(rt: UsageRuntime, requests: Iterable[ExportMetricsServiceRequest]) -> None:
    for request in requests:
        rt.observe(request.SerializeToString())


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))


def counters_of(request: ExportMetricsServiceRequest) -> dict[str, dict[str, float]]:
    """owner id -> counter -> value, summed over GPUs, from an emitted metrics request."""
    out: dict[str, dict[str, float]] = {}
    for rm in request.resource_metrics:
        resource = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
        owner = resource.get("gputally.usage.owner.id")
        if owner is None:
            continue
        mine = out.setdefault(owner, {})
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                name = COUNTERS.get(metric.name)
                if name is None:  # the served models' counters (tests/processors/usage/engines.py reads them)
                    continue
                point = getattr(metric, metric.WhichOneof("data")).data_points[-1]
                mine[name] = max(mine.get(name, 0.0), point.as_double) if name == "peak" else (
                    mine.get(name, 0.0) + point.as_double)
    return out


def gpu_counters(request: ExportMetricsServiceRequest) -> dict[str, dict[str, float]]:
    """hw.id -> observed / unobserved time."""
    out: dict[str, dict[str, float]] = {}
    for rm in request.resource_metrics:
        resource = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
        if "gputally.usage.owner.id" in resource:
            continue
        for metric in rm.scope_metrics[0].metrics:
            out.setdefault(resource["hw.id"], {})[metric.name.rsplit(".", 2)[1]] = metric.sum.data_points[-1].as_double
    return out


def emitted(rt: UsageRuntime) -> ExportMetricsServiceRequest:
    batch = rt.emit(final=True)
    assert batch is not None, "no counters emitted"
    return batch.message  # type: ignore[no-any-return]
