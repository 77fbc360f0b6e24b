"""Check a received request the way a full parse would, and count it, in one C-level parse.

A receiver must refuse bytes that are not an OTLP request (INVALID_ARGUMENT, HTTP 400), and
that needs a parse: wire structure, UTF-8 in strings, every nested message. But the parsed
tree is wanted only by a stage that reads it, and walking it from Python to count points
costs more than the parse. So intake parses with *checked census* schemas: OTLP's own
messages, in a pool of their own, except that the levels above the records (resource entry,
scope entry and, for metrics, the metric) are singular, so every occurrence merges into one
message and the repeated fields inside concatenate. Every field is still declared with its
real type, so the parse refuses what the real one refuses, and afterwards the leaf lists hold
every data point, log record or span of the request. ``Metric.name`` becomes repeated to
count the named metrics, and the ``data`` oneof is dropped so that a sum merged after a
gauge does not clear the gauge's points.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from gputally.otlp.census import Census, metric_count
from gputally.otlp.signals import SIGNALS, Signal

__all__ = ["checked_census"]

_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_METRIC_KINDS = ("gauge", "sum", "histogram", "exponential_histogram", "summary")


def _file(module: Any) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


def _message(proto: descriptor_pb2.FileDescriptorProto, name: str) -> descriptor_pb2.DescriptorProto:
    return next(m for m in proto.message_type if m.name == name)


def _merge_field(message: descriptor_pb2.DescriptorProto, field_name: str) -> None:
    """Make a repeated message field singular, so its occurrences merge into one."""
    next(f for f in message.field if f.name == field_name).label = _OPTIONAL


def _build_requests() -> dict[Signal, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file(common_pb2))
    pool.Add(_file(resource_pb2))
    layouts = {
        Signal.METRICS: (metrics_pb2, "ResourceMetrics", "ScopeMetrics"),
        Signal.LOGS: (logs_pb2, "ResourceLogs", "ScopeLogs"),
        Signal.TRACES: (trace_pb2, "ResourceSpans", "ScopeSpans"),
    }
    requests = {}
    for signal, (module, resource_name, scope_name) in layouts.items():
        spec = SIGNALS[signal]
        proto = _file(module)
        _merge_field(_message(proto, resource_name), spec.scope_field)
        if signal is Signal.METRICS:
            _merge_field(_message(proto, scope_name), spec.record_field)
            metric = _message(proto, "Metric")
            for field in metric.field:
                field.ClearField("oneof_index")
                if field.name == "name":
                    field.label = _REPEATED
            metric.ClearField("oneof_decl")
        request = proto.message_type.add(name="CheckedRequest")
        request.field.add(name=spec.resource_field, number=1, label=_OPTIONAL,
                          type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                          type_name=f".{proto.package}.{resource_name}")
        pool.Add(proto)
        requests[signal] = message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{proto.package}.CheckedRequest"))
    return requests


_REQUESTS = _build_requests()


def checked_census(signal: Signal, raw: bytes) -> Census:
    """Count what ``raw`` holds, refusing it as the real parse would.

    Raises ``google.protobuf.message.DecodeError`` on bytes that are not a request of ``signal``.
    """
    spec = SIGNALS[signal]
    scope = getattr(getattr(_REQUESTS[signal].FromString(raw), spec.resource_field), spec.scope_field)
    if signal is not Signal.METRICS:
        return Census(len(getattr(scope, spec.record_field)))
    metric = scope.metrics
    points = sum(len(getattr(metric, kind).data_points) for kind in _METRIC_KINDS)
    # A name sent explicitly empty counts as named here (as in the census); any mismatch,
    # including more names than metrics, has Batch.decode look at the parsed metrics.
    return Census(points, metric_count(raw) - len(metric.name))
