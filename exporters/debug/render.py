"""Text for the ``debug`` exporter, in the spirit of the Collector's debug exporter.

``basic``: one line per batch (time, exporter, pipeline, counts). ``normal``: that line, then a
line per resource and one compact line per data point, log record and span, with its value,
attributes and time. ``detailed``: every field, readable (ISO times, hex trace and span IDs,
typed attribute values), one block per resource, so a large batch is written a resource at a
time rather than as one string.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Literal

from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal

__all__ = ["Verbosity", "iso", "render_chunks", "value_text"]

Verbosity = Literal["basic", "normal", "detailed"]

_NOUN = {Signal.METRICS: ("data point", "data points"), Signal.LOGS: ("log record", "log records"),
         Signal.TRACES: ("span", "spans")}
_TYPED = {"string_value": "Str", "bool_value": "Bool", "int_value": "Int", "double_value": "Double",
          "array_value": "Slice", "kvlist_value": "Map", "bytes_value": "Bytes"}


def iso(ns: int) -> str:
    """``2026-12-01T02:47:28.123Z`` for nanoseconds since the epoch; ``-`` for 0 (unset)."""
    if not ns:
        return "-"
    moment = datetime.fromtimestamp(ns / 1e9, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def value_text(any_value: Any) -> str:
    """An OTLP AnyValue as a person writes it: text, numbers, ``[a, b]``, ``{k=v}``, hex bytes."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return ""
    if kind == "array_value":
        return "[" + ", ".join(value_text(v) for v in any_value.array_value.values) + "]"
    if kind == "kvlist_value":
        return "{" + ", ".join(f"{kv.key}={value_text(kv.value)}" for kv in any_value.kvlist_value.values) + "}"
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    if kind == "double_value":
        return f"{any_value.double_value:.6g}"
    if kind == "string_value":
        return any_value.string_value.replace("\n", "\\n")  # one line stays one line
    return str(getattr(any_value, kind))


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def _attributes(attributes: Iterable[Any]) -> str:
    pairs = [f"{kv.key}={value_text(kv.value)}" for kv in attributes]
    return "{" + ", ".join(pairs) + "}" if pairs else ""


def _typed(attributes: Iterable[Any], indent: str = "     ") -> Iterator[str]:
    for kv in attributes:
        kind = kv.value.WhichOneof("value")
        yield f"{indent}-> {kv.key}: {_TYPED.get(kind or '', 'Empty')}({value_text(kv.value)})"


def _number(point: Any) -> str:
    kind = point.WhichOneof("value")
    value = getattr(point, kind) if kind else 0
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _point_value(kind: str, point: Any) -> str:
    if kind in ("gauge", "sum"):
        return _number(point)
    if kind == "summary":
        return f"count={point.count} sum={point.sum:.6g}"
    return f"count={point.count} sum={point.sum:.6g}" + (
        f" min={point.min:.6g} max={point.max:.6g}" if point.HasField("min") and point.HasField("max") else "")


def _points(metric: Any) -> tuple[str, list[Any]]:
    kind = metric.WhichOneof("data") or "empty"
    return kind, list(getattr(metric, kind).data_points) if kind != "empty" else []


# --- normal -----------------------------------------------------------------------------------

def _normal_metric(metric: Any) -> Iterator[str]:
    kind, points = _points(metric)
    unit = f" {metric.unit}" if metric.unit not in ("", "1") else ""
    for point in points:
        yield (f"  {metric.name}{_attributes(point.attributes)} {_point_value(kind, point)}{unit}"
               f" {iso(point.time_unix_nano)}")
    if not points:
        yield f"  {metric.name} ({kind}, no data points)"


def _normal_log(record: Any) -> Iterator[str]:
    severity = record.severity_text or (str(record.severity_number) if record.severity_number else "-")
    name = f" {record.event_name}" if getattr(record, "event_name", "") else ""
    attrs = _attributes(record.attributes)
    when = iso(record.time_unix_nano or record.observed_time_unix_nano)
    yield f"  {when} {severity}{name} {_short(value_text(record.body))}" + (f" {attrs}" if attrs else "")


def _normal_span(span: Any) -> Iterator[str]:
    millis = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
    attrs = _attributes(span.attributes)
    yield (f"  {span.name} trace_id={span.trace_id.hex()} span_id={span.span_id.hex()} duration={millis:.3f}ms"
           f" {iso(span.start_time_unix_nano)}" + (f" {attrs}" if attrs else ""))


_NORMAL = {Signal.METRICS: _normal_metric, Signal.LOGS: _normal_log, Signal.TRACES: _normal_span}


def _normal(batch: Batch) -> Iterator[str]:
    signal = batch.signal
    spec = SIGNALS[signal]
    for resource in getattr(batch.message, spec.resource_field):
        lines = [f"resource {_attributes(resource.resource.attributes) or '{}'}"]
        for holder in getattr(resource, spec.scope_field):
            for item in getattr(holder, spec.record_field):
                lines.extend(_NORMAL[signal](item))
        yield "\n".join(lines) + "\n"


# --- detailed ---------------------------------------------------------------------------------

def _detailed_metric(n: int, metric: Any) -> Iterator[str]:
    kind, points = _points(metric)
    yield f"Metric #{n}"
    yield "Descriptor:"
    yield f"     -> Name: {metric.name}"
    yield f"     -> Description: {metric.description}"
    yield f"     -> Unit: {metric.unit}"
    yield f"     -> DataType: {kind}"
    if kind in ("sum", "histogram", "exponential_histogram"):
        data = getattr(metric, kind)
        temporality = {1: "delta", 2: "cumulative"}.get(data.aggregation_temporality, "unspecified")
        yield f"     -> AggregationTemporality: {temporality}"
    if kind == "sum":
        yield f"     -> IsMonotonic: {str(metric.sum.is_monotonic).lower()}"
    for m, point in enumerate(points):
        yield f"DataPoint #{m}"
        if len(point.attributes):
            yield "Data point attributes:"
            yield from _typed(point.attributes)
        yield f"StartTimestamp: {iso(point.start_time_unix_nano)}"
        yield f"Timestamp: {iso(point.time_unix_nano)}"
        yield f"Value: {_point_value(kind, point)}"
        if kind == "histogram":
            yield f"ExplicitBounds: {list(point.explicit_bounds)}"
            yield f"BucketCounts: {list(point.bucket_counts)}"


def _detailed_log(n: int, record: Any) -> Iterator[str]:
    yield f"LogRecord #{n}"
    yield f"ObservedTimestamp: {iso(record.observed_time_unix_nano)}"
    yield f"Timestamp: {iso(record.time_unix_nano)}"
    yield f"SeverityText: {record.severity_text}"
    yield f"SeverityNumber: {record.severity_number}"
    if getattr(record, "event_name", ""):
        yield f"EventName: {record.event_name}"
    yield f"Body: {value_text(record.body)}"
    if len(record.attributes):
        yield "Attributes:"
        yield from _typed(record.attributes)
    yield f"Trace ID: {record.trace_id.hex()}"
    yield f"Span ID: {record.span_id.hex()}"


def _detailed_span(n: int, span: Any) -> Iterator[str]:
    yield f"Span #{n}"
    yield f"    Trace ID       : {span.trace_id.hex()}"
    yield f"    Parent ID      : {span.parent_span_id.hex()}"
    yield f"    ID             : {span.span_id.hex()}"
    yield f"    Name           : {span.name}"
    yield f"    Kind           : {span.kind}"
    yield f"    Start time     : {iso(span.start_time_unix_nano)}"
    yield f"    End time       : {iso(span.end_time_unix_nano)}"
    yield f"    Status code    : {span.status.code}"
    yield f"    Status message : {span.status.message}"
    if len(span.attributes):
        yield "Attributes:"
        yield from _typed(span.attributes)


_DETAILED = {Signal.METRICS: _detailed_metric, Signal.LOGS: _detailed_log, Signal.TRACES: _detailed_span}
_TITLE = {Signal.METRICS: "Metrics", Signal.LOGS: "Logs", Signal.TRACES: "Spans"}


def _detailed(batch: Batch) -> Iterator[str]:
    signal = batch.signal
    title = _TITLE[signal]
    spec = SIGNALS[signal]
    for r, resource in enumerate(getattr(batch.message, spec.resource_field)):
        lines = [f"Resource{title} #{r}", f"Resource SchemaURL: {resource.schema_url}"]
        if len(resource.resource.attributes):
            lines.append("Resource attributes:")
            lines.extend(_typed(resource.resource.attributes))
        for s, holder in enumerate(getattr(resource, spec.scope_field)):
            lines.append(f"Scope{title} #{s}")
            lines.append(f"Scope{title} SchemaURL: {holder.schema_url}")
            lines.append(f"InstrumentationScope {holder.scope.name} {holder.scope.version}".rstrip())
            for n, item in enumerate(getattr(holder, spec.record_field)):
                lines.extend(_DETAILED[signal](n, item))
        yield "\n".join(lines) + "\n"


def render_chunks(
    batch: Batch, verbosity: Verbosity, *, exporter: str = "debug", pipeline: str = "", now_ns: int | None = None
) -> Iterator[str]:
    """The text for ``batch``: the summary line, then (``normal``, ``detailed``) one chunk per
    resource, each to be written on its own."""
    resources = len(getattr(batch.message, SIGNALS[batch.signal].resource_field))
    one, many = _NOUN[batch.signal]
    where = f" pipeline={pipeline}" if pipeline else ""
    yield (f"{iso(now_ns if now_ns is not None else time.time_ns())} {exporter}{where} {batch.signal}: "
           f"{resources} resource{'' if resources == 1 else 's'}, {batch.items} {one if batch.items == 1 else many}\n")
    if verbosity == "normal":
        yield from _normal(batch)
    elif verbosity == "detailed":
        yield from _detailed(batch)
