"""Build small OTLP metrics requests for a test Prometheus, with opentelemetry-proto classes.

    request(resource({"hw.id": "GPU-1", "host.name": "n1"},
                     counter("hw.errors", "{error}", [point(1, {"error.type": "xid"})])))

Points default to now; a cumulative sum's start time defaults to an hour before its point.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

__all__ = ["Point", "counter", "gauge", "point", "request", "resource", "updowncounter"]

Attrs = Mapping[str, str | int | float | bool]


@dataclass(frozen=True)
class Point:
    value: float
    attributes: Attrs = field(default_factory=dict)
    time: float | None = None
    """Seconds since the epoch; None: now."""
    start: float | None = None
    """A sum's start time in seconds; None: an hour before ``time``."""


def point(value: float, attributes: Attrs | None = None, *, at: float | None = None, start: float | None = None) -> Point:
    return Point(value, attributes or {}, at, start)


def _kvs(attributes: Attrs) -> list[KeyValue]:
    out = []
    for key, value in attributes.items():
        if isinstance(value, bool):
            any_value = AnyValue(bool_value=value)
        elif isinstance(value, int):
            any_value = AnyValue(int_value=value)
        elif isinstance(value, float):
            any_value = AnyValue(double_value=value)
        else:
            any_value = AnyValue(string_value=str(value))
        out.append(KeyValue(key=key, value=any_value))
    return out


def _points(points: Iterable[Point], with_start: bool) -> list[NumberDataPoint]:
    out = []
    for p in points:
        at = time.time() if p.time is None else p.time
        dp = NumberDataPoint(as_double=float(p.value), time_unix_nano=int(at * 1e9), attributes=_kvs(p.attributes))
        if with_start:
            dp.start_time_unix_nano = int(((at - 3600) if p.start is None else p.start) * 1e9)
        out.append(dp)
    return out


def gauge(name: str, unit: str, points: Iterable[Point]) -> Metric:
    return Metric(name=name, unit=unit, gauge=Gauge(data_points=_points(points, with_start=False)))


def _sum(name: str, unit: str, points: Iterable[Point], monotonic: bool) -> Metric:
    cumulative = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    data = Sum(data_points=_points(points, with_start=True), is_monotonic=monotonic, aggregation_temporality=cumulative)
    return Metric(name=name, unit=unit, sum=data)


def counter(name: str, unit: str, points: Iterable[Point]) -> Metric:
    """A cumulative monotonic sum."""
    return _sum(name, unit, points, monotonic=True)


def updowncounter(name: str, unit: str, points: Iterable[Point]) -> Metric:
    """A cumulative non-monotonic sum."""
    return _sum(name, unit, points, monotonic=False)


def resource(attributes: Attrs, *metrics: Metric, scope: str = "gputally.tests") -> ResourceMetrics:
    return ResourceMetrics(
        resource=Resource(attributes=_kvs(attributes)),
        scope_metrics=[ScopeMetrics(scope=InstrumentationScope(name=scope), metrics=list(metrics))],
    )


def request(*resources: ResourceMetrics) -> bytes:
    """The serialized ExportMetricsServiceRequest."""
    return ExportMetricsServiceRequest(resource_metrics=list(resources)).SerializeToString()
