"""Unknown enum names in OTLP/JSON are errors, not zeros.

protobuf's JSON parser, told to ignore unknown fields (OTLP requires it), also turns an enum
name it does not know (``"aggregationTemporality": "NOPE"``) into 0, silently changing what
the data means. OTLP/JSON writes enums as integers; names are tolerated, but only real ones.
A cheap scan of the raw body looks for an enum field written as a string; only then is the
body walked, and an unknown name is an :class:`~gputally.errors.InvalidRequest` (400).
"""

from __future__ import annotations

import json
import re
from typing import Any

from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from gputally.errors import InvalidRequest

__all__ = ["check_enum_names"]


def _names(enum: Any) -> frozenset[str]:
    return frozenset(enum.keys())


_ENUMS: dict[str, frozenset[str]] = {
    "aggregationTemporality": _names(metrics_pb2.AggregationTemporality),
    "aggregation_temporality": _names(metrics_pb2.AggregationTemporality),
    "severityNumber": _names(logs_pb2.SeverityNumber),
    "severity_number": _names(logs_pb2.SeverityNumber),
    "kind": _names(trace_pb2.Span.SpanKind),
    "code": _names(trace_pb2.Status.StatusCode),
}
_AS_STRING = re.compile(rb'"(' + b"|".join(k.encode() for k in _ENUMS) + rb')"\s*:\s*"')


def check_enum_names(body: bytes) -> None:
    """Raise InvalidRequest when an OTLP enum field holds a name that enum does not have."""
    if _AS_STRING.search(body) is None:
        return  # integers only (the OTLP/JSON form): nothing to check
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return  # the decoder reports it
    _walk(data, "")


def _walk(node: Any, where: str) -> None:
    stack = [(node, where)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                allowed = _ENUMS.get(key)
                if allowed is not None and isinstance(item, str) and item not in allowed:
                    raise InvalidRequest(f"{path}.{key}: {item[:64]!r} is not a value of this enum")
                stack.append((item, f"{path}.{key}" if path else key))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{index}]") for index, item in enumerate(value))
