"""Count data points, log records and spans in a serialized OTLP request, in C speed.

Walking a parsed request in Python costs about 0.9 us per metric (230 us for a GPU node's
request), more than parsing it. Instead, the raw bytes are parsed with *census schemas*:
descriptors that reuse OTLP's field numbers but declare the container levels (resource,
scope, metric) as singular messages. Protobuf merges repeated occurrences of a singular
message field, and concatenates the repeated fields inside, so after one C-level parse the
leaf lists hold every data point of the request. Fields the census does not declare are
skipped as unknown. Cost: about 30 us for a 20 KB request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2

from gputally.otlp.schema import SchemaFile

__all__ = ["Census", "census_logs", "census_metrics", "census_traces", "metric_count"]

_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_BYTES = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES

# OTLP field numbers (opentelemetry/proto/metrics/v1/metrics.proto).
_METRIC_DATA_FIELDS = {"gauge": 5, "sum": 7, "histogram": 9, "exponential_histogram": 10, "summary": 11}


def _build_classes() -> dict[str, Any]:
    schema = SchemaFile("gputally_census.proto", "gputally.census")

    def merged(name: str, field: str, number: int, child: str) -> None:
        schema.message(name, (field, number, _OPTIONAL, _MESSAGE, child))

    # Metrics: points per data kind, plus the names of named metrics.
    schema.message("Data", ("data_points", 1, _REPEATED, _BYTES, None))
    schema.message(
        "Metric",
        *((kind, n, _OPTIONAL, _MESSAGE, "Data") for kind, n in _METRIC_DATA_FIELDS.items()),
        ("name", 1, _REPEATED, _BYTES, None),
    )
    merged("ScopeMetrics", "metrics", 2, "Metric")
    merged("ResourceMetrics", "scope_metrics", 2, "ScopeMetrics")
    merged("MetricsRequest", "resource_metrics", 1, "ResourceMetrics")
    # Metrics again, counting metric messages (to find nameless ones).
    schema.message("MetricList", ("metrics", 2, _REPEATED, _BYTES, None))
    merged("ResourceMetricList", "scope_metrics", 2, "MetricList")
    merged("MetricListRequest", "resource_metrics", 1, "ResourceMetricList")
    # Logs and traces: records / spans sit at the same depth.
    schema.message("ScopeLogs", ("log_records", 2, _REPEATED, _BYTES, None))
    merged("ResourceLogs", "scope_logs", 2, "ScopeLogs")
    merged("LogsRequest", "resource_logs", 1, "ResourceLogs")
    schema.message("ScopeSpans", ("spans", 2, _REPEATED, _BYTES, None))
    merged("ResourceSpans", "scope_spans", 2, "ScopeSpans")
    merged("TracesRequest", "resource_spans", 1, "ResourceSpans")
    return schema.classes("MetricsRequest", "MetricListRequest", "LogsRequest", "TracesRequest")


_CLASSES = _build_classes()
_METRICS = _CLASSES["MetricsRequest"]
_METRIC_LIST = _CLASSES["MetricListRequest"]
_LOGS = _CLASSES["LogsRequest"]
_TRACES = _CLASSES["TracesRequest"]


@dataclass(frozen=True, slots=True)
class Census:
    """What a request holds: ``items`` (points, records or spans); ``nameless_metrics``."""

    items: int
    nameless_metrics: int = 0


def census_metrics(raw: bytes) -> Census:
    """Count data points and nameless metrics. Raises ``google.protobuf.message.DecodeError``."""
    metric = _METRICS.FromString(raw).resource_metrics.scope_metrics.metrics
    points = sum(len(getattr(metric, kind).data_points) for kind in _METRIC_DATA_FIELDS)
    return Census(points, metric_count(raw) - len(metric.name))


def metric_count(raw: bytes) -> int:
    """How many metric messages a metrics request holds (named or not)."""
    return len(_METRIC_LIST.FromString(raw).resource_metrics.scope_metrics.metrics)


def census_logs(raw: bytes) -> Census:
    return Census(len(_LOGS.FromString(raw).resource_logs.scope_logs.log_records))


def census_traces(raw: bytes) -> Census:
    return Census(len(_TRACES.FromString(raw).resource_spans.scope_spans.spans))
