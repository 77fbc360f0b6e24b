"""What OTLP spells differently per signal, in one table: message classes, gRPC method, HTTP
path and the field names from a request down to its records.

Every transport, exporter and processor reads these names from here, so the three signals
cannot drift apart in one place and agree in another.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["SIGNALS", "Signal", "SignalSpec"]


class Signal(enum.StrEnum):
    METRICS = "metrics"
    LOGS = "logs"
    TRACES = "traces"


@dataclass(frozen=True, slots=True)
class SignalSpec:
    """One signal's names in the OTLP protocol (collector/*/v1/*_service.proto)."""

    signal: Signal
    request: type[Any]
    """``Export*ServiceRequest``."""
    response: type[Any]
    """``Export*ServiceResponse``."""
    service: str
    """The gRPC service's full name (health checking reports it; the method lives under it)."""
    http_path: str
    """The OTLP/HTTP path the receiver serves and the exporter appends to a base URL."""
    resource_field: str
    """The request's repeated field of resource entries (``resource_metrics``)."""
    scope_field: str
    """A resource entry's repeated field of scope entries (``scope_metrics``)."""
    record_field: str
    """A scope entry's repeated field of records (``metrics``, ``log_records``, ``spans``)."""
    rejected_field: str
    """The counter in the response's ``partial_success`` (``rejected_data_points``)."""

    @property
    def grpc_method(self) -> str:
        """The path a gRPC client calls: ``/<service>/Export``."""
        return f"/{self.service}/Export"


SIGNALS: MappingProxyType[Signal, SignalSpec] = MappingProxyType({
    Signal.METRICS: SignalSpec(
        signal=Signal.METRICS,
        request=ExportMetricsServiceRequest,
        response=ExportMetricsServiceResponse,
        service="opentelemetry.proto.collector.metrics.v1.MetricsService",
        http_path="/v1/metrics",
        resource_field="resource_metrics",
        scope_field="scope_metrics",
        record_field="metrics",
        rejected_field="rejected_data_points",
    ),
    Signal.LOGS: SignalSpec(
        signal=Signal.LOGS,
        request=ExportLogsServiceRequest,
        response=ExportLogsServiceResponse,
        service="opentelemetry.proto.collector.logs.v1.LogsService",
        http_path="/v1/logs",
        resource_field="resource_logs",
        scope_field="scope_logs",
        record_field="log_records",
        rejected_field="rejected_log_records",
    ),
    Signal.TRACES: SignalSpec(
        signal=Signal.TRACES,
        request=ExportTraceServiceRequest,
        response=ExportTraceServiceResponse,
        service="opentelemetry.proto.collector.trace.v1.TraceService",
        http_path="/v1/traces",
        resource_field="resource_spans",
        scope_field="scope_spans",
        record_field="spans",
        rejected_field="rejected_spans",
    ),
})
"""Every signal's :class:`SignalSpec`."""
