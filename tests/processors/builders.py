"""Small builders for OTLP requests and readers of what processors made of them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext
from gputally.telemetry import SelfTelemetry

Attrs = Mapping[str, Any]

METRIC_KINDS = ("gauge", "sum", "histogram", "exponential_histogram", "summary")


def context(component_id: str) -> ComponentContext:
    return ComponentContext(id=component_id, telemetry=SelfTelemetry())


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    return AnyValue(string_value=value)


def key_values(attrs: Attrs) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attrs.items()]


def from_any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [from_any_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def attributes(message: Any) -> dict[str, Any]:
    """An item's attributes as a dict; fails on a duplicated key, which OTLP forbids."""
    out: dict[str, Any] = {}
    for kv in message.attributes:
        assert kv.key not in out, f"duplicate attribute {kv.key!r}"
        out[kv.key] = from_any_value(kv.value)
    return out


# --- metrics -------------------------------------------------------------------------


def metric(kind: str, name: str, points: Sequence[Attrs]) -> m.Metric:
    """A metric of ``kind`` with one data point per attribute set."""
    out = m.Metric(name=name)
    data = getattr(out, kind)
    for i, attrs in enumerate(points):
        point = data.data_points.add(attributes=key_values(attrs), time_unix_nano=1_000 + i)
        if kind in ("gauge", "sum"):
            point.as_double = float(i)
        elif kind == "histogram":
            point.count, point.sum = 2, 3.0
            point.bucket_counts.extend([1, 1])
            point.explicit_bounds.append(1.0)
        elif kind == "exponential_histogram":
            point.count, point.scale = 1, 2
            point.positive.bucket_counts.append(1)
        else:
            point.count, point.sum = 1, 2.0
    return out


def all_kinds(points: Sequence[Attrs], prefix: str = "m") -> list[m.Metric]:
    """One metric of every data kind, each with the given points."""
    return [metric(kind, f"{prefix}.{kind}", points) for kind in METRIC_KINDS]


def resource_metrics(resource: Attrs, metrics: Sequence[m.Metric], *, scopes: int = 1) -> m.ResourceMetrics:
    """A resource whose metrics are dealt round-robin into ``scopes`` scopes."""
    out = m.ResourceMetrics(resource=Resource(attributes=key_values(resource)))
    scope_list = [out.scope_metrics.add() for _ in range(scopes)]
    for i, scope in enumerate(scope_list):
        scope.scope.name = f"scope{i}"
    for i, item in enumerate(metrics):
        scope_list[i % scopes].metrics.append(item)
    return out


def metrics_batch(*resources: m.ResourceMetrics) -> Batch:
    """A batch as the receiver makes it: decoded from the encoding, with its bytes cached."""
    raw = ExportMetricsServiceRequest(resource_metrics=resources).SerializeToString()
    return Batch.decode(Signal.METRICS, raw)


def data_points(batch: Batch) -> Iterator[Any]:
    for rm in batch.message.resource_metrics:
        for sm in rm.scope_metrics:
            for item in sm.metrics:
                kind = item.WhichOneof("data")
                if kind:
                    yield from getattr(item, kind).data_points


def metric_names(batch: Batch) -> list[str]:
    return [item.name for rm in batch.message.resource_metrics for sm in rm.scope_metrics for item in sm.metrics]


# --- logs and spans ------------------------------------------------------------------


def resource_logs(resource: Attrs, records: Sequence[Attrs], *, scopes: int = 1) -> ResourceLogs:
    out = ResourceLogs(resource=Resource(attributes=key_values(resource)))
    scope_list = [out.scope_logs.add() for _ in range(scopes)]
    for i, attrs in enumerate(records):
        scope_list[i % scopes].log_records.append(
            LogRecord(time_unix_nano=1_000 + i, body=AnyValue(string_value=f"record {i}"), attributes=key_values(attrs))
        )
    return out


def logs_batch(*resources: ResourceLogs) -> Batch:
    return Batch.decode(Signal.LOGS, ExportLogsServiceRequest(resource_logs=resources).SerializeToString())


def log_records(batch: Batch) -> Iterator[LogRecord]:
    for rl in batch.message.resource_logs:
        for sl in rl.scope_logs:
            yield from sl.log_records


def resource_spans(resource: Attrs, spans: Sequence[tuple[str, Attrs]], *, scopes: int = 1) -> ResourceSpans:
    """A resource with spans given as (name, attributes)."""
    out = ResourceSpans(resource=Resource(attributes=key_values(resource)))
    scope_list = [out.scope_spans.add() for _ in range(scopes)]
    for i, (name, attrs) in enumerate(spans):
        scope_list[i % scopes].spans.append(
            Span(
                trace_id=bytes([1] * 16),
                span_id=bytes([1] * 7 + [i % 256]),
                name=name,
                start_time_unix_nano=1_000,
                end_time_unix_nano=2_000,
                attributes=key_values(attrs),
            )
        )
    return out


def traces_batch(*resources: ResourceSpans) -> Batch:
    return Batch.decode(Signal.TRACES, ExportTraceServiceRequest(resource_spans=resources).SerializeToString())


def spans(batch: Batch) -> Iterator[Span]:
    for rs in batch.message.resource_spans:
        for ss in rs.scope_spans:
            yield from ss.spans


def items(batch: Batch) -> Iterator[Any]:
    """Data points, log records or spans, in order."""
    if batch.signal is Signal.METRICS:
        return data_points(batch)
    if batch.signal is Signal.LOGS:
        return log_records(batch)
    return spans(batch)


def resources(batch: Batch) -> list[Any]:
    field = {Signal.METRICS: "resource_metrics", Signal.LOGS: "resource_logs", Signal.TRACES: "resource_spans"}
    return [entry.resource for entry in getattr(batch.message, field[batch.signal])]


def reencoded(batch: Batch) -> Batch:
    """What the next stage would see: the batch's bytes decoded afresh."""
    return Batch.decode(batch.signal, batch.serialize())
