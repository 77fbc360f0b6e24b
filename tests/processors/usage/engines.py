"""Engine resources as a probe sends them (``docs/accounts.md``, "Engine points"), built by hand,
and reading the served models' counters back from an emit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

CUMULATIVE = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def any_value(value: Any) -> AnyValue:
    if isinstance(value, list | tuple):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=value)


def kvs(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items()]


@dataclass
class Engine:
    """One endpoint: its resource attributes, and its counters' state (start, values)."""

    name: str
    attributes: dict[str, Any]
    start_ns: int
    tokens: dict[tuple[str, str], float] = field(default_factory=dict)
    """(model, token type) -> cumulative value."""
    busy: dict[str, float] = field(default_factory=dict)
    """model -> cumulative busy seconds."""
    requests: int = 0
    """Finished requests so far: the latency histograms' counts grow with it."""
    waiting: int = 0

    def resource(self, time_ns: int, *, histograms: bool = True) -> metrics_pb2.ResourceMetrics:
        """The engine's resource with its counters at ``time_ns`` (and gauges and a histogram that
        accounting does not read, as an engine also sends them)."""
        rm = metrics_pb2.ResourceMetrics()
        rm.resource.attributes.extend(kvs({"gputally.inference.engine": self.name, **self.attributes}))
        scope = rm.scope_metrics.add()
        scope.scope.name = "gputally.probes.engines"
        if self.tokens:
            metric = scope.metrics.add(name="gputally.inference.tokens", unit="{token}")
            metric.sum.aggregation_temporality, metric.sum.is_monotonic = CUMULATIVE, True
            for (model, token_type), value in self.tokens.items():
                metric.sum.data_points.add(start_time_unix_nano=self.start_ns, time_unix_nano=time_ns, as_int=int(value),
                                           attributes=kvs({"gen_ai.request.model": model, "gen_ai.token.type": token_type}))
        if self.busy:
            metric = scope.metrics.add(name="gputally.inference.busy.time", unit="s")
            metric.sum.aggregation_temporality, metric.sum.is_monotonic = CUMULATIVE, True
            for model, value in self.busy.items():
                metric.sum.data_points.add(start_time_unix_nano=self.start_ns, time_unix_nano=time_ns, as_double=value,
                                           attributes=kvs({"gen_ai.request.model": model}))
        models = sorted({m for m, _ in self.tokens} | set(self.busy))
        for name, unit, value in (("gputally.inference.kv_cache.usage", "1", 0.25 + 0.05 * (self.waiting % 10)),
                                  ("gputally.inference.requests.waiting", "{request}", float(self.waiting)),
                                  ("gputally.inference.requests.running", "{request}", 4.0)):
            gauge = scope.metrics.add(name=name, unit=unit)
            for model in models:
                gauge.gauge.data_points.add(time_unix_nano=time_ns, as_double=value,
                                            attributes=kvs({"gen_ai.request.model": model}))
        if histograms:
            n = self.requests
            for name, bounds, scale in (("gen_ai.server.time_to_first_token", [0.05, 0.1, 0.5, 1.0], 0.1),
                                        ("gen_ai.server.time_per_output_token", [0.01, 0.025, 0.05, 0.1], 0.02)):
                histogram = scope.metrics.add(name=name, unit="s")
                histogram.histogram.aggregation_temporality = CUMULATIVE
                for model in models:
                    counts = [n, 3 * n, 4 * n, n, 0]
                    histogram.histogram.data_points.add(
                        start_time_unix_nano=self.start_ns, time_unix_nano=time_ns, count=sum(counts),
                        sum=scale * sum(counts), bucket_counts=counts, explicit_bounds=bounds,
                        attributes=kvs({"gen_ai.request.model": model}))
        up = scope.metrics.add(name="gputally.inference.up", unit="1")
        up.gauge.data_points.add(time_unix_nano=time_ns, as_int=1)
        return rm


def engine_request(engines: Sequence[Engine], time_ns: int) -> ExportMetricsServiceRequest:
    return ExportMetricsServiceRequest(resource_metrics=[e.resource(time_ns) for e in engines])


def with_engines(request: ExportMetricsServiceRequest, engines: Sequence[Engine]) -> ExportMetricsServiceRequest:
    """``request`` (a GPU cycle) with the engines' resources appended, at the cycle's time."""
    out = ExportMetricsServiceRequest.FromString(request.SerializeToString())
    time_ns = next(p.time_unix_nano for rm in out.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                   for p in getattr(m, m.WhichOneof("data")).data_points)
    out.resource_metrics.extend(e.resource(time_ns) for e in engines)
    return out


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value"))


def tokens_of(request: ExportMetricsServiceRequest) -> dict[tuple[str, str, str, str], float]:
    """(owner id, served model, engine, token type) -> the last value, from an emit (0s left out)."""
    out: dict[tuple[str, str, str, str], float] = {}
    for rm in request.resource_metrics:
        resource = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name != "gputally.usage.tokens":
                    continue
                for point in metric.sum.data_points:
                    if not point.as_double:
                        continue
                    token_type = next(kv.value.string_value for kv in point.attributes if kv.key == "gen_ai.token.type")
                    out[(resource["gputally.usage.owner.id"], resource["gen_ai.request.model"],
                         resource["gputally.inference.engine"], token_type)] = point.as_double
    return out


MODEL_COUNTERS = {
    "gputally.usage.model.allocated.time": "allocated",
    "gputally.usage.model.busy.time": "busy",
    "gputally.usage.model.energy": "energy",
    "gputally.usage.model.cost": "cost",
    "gputally.usage.model.busy.cost": "busy_cost",
}


def models_of(request: ExportMetricsServiceRequest) -> dict[tuple[str, str, str, str], dict[str, float]]:
    """(owner id, served model, engine, hw.id) -> counter -> the last value, from an emit."""
    out: dict[tuple[str, str, str, str], dict[str, float]] = {}
    for rm in request.resource_metrics:
        resource = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                name = MODEL_COUNTERS.get(metric.name)
                if name is None:
                    continue
                key = (resource["gputally.usage.owner.id"], resource["gen_ai.request.model"],
                       resource["gputally.inference.engine"], resource["hw.id"])
                out.setdefault(key, {})[name] = metric.sum.data_points[-1].as_double
    return out


def without_usage(request: ExportMetricsServiceRequest, names: Sequence[str]) -> ExportMetricsServiceRequest:
    """``request`` with the metrics ``names`` taken out of every resource."""
    out = ExportMetricsServiceRequest.FromString(request.SerializeToString())
    for rm in out.resource_metrics:
        for sm in rm.scope_metrics:
            keep = [m for m in sm.metrics if m.name not in names]
            del sm.metrics[:]
            sm.metrics.extend(keep)
    return out
