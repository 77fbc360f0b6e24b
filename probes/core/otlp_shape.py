"""Entities -> OTLP export requests: one Resource per GPU, per MIG device, per GPU process and
per inference-engine endpoint (whose latencies are histograms).

Identity and attribution live on the Resource (``hw.id``, ``process.pid``,
``process.linux.cgroup``...), so a processor at the gateway touches each entity once per
batch, not each of its points; points carry only what distinguishes them within the entity
(``hw.gpu.task``, ``hw.sensor_location``...). Every ResourceMetrics/ResourceLogs has one
scope, ``gputally.probes.nvml`` with gputally's version.

The same resources and point attribute sets recur every cycle, so :class:`OtlpEncoder` keeps
their encodings and merges the bytes in (``MergeFromString``), which is about twice as fast as
building each attribute again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gputally import __version__
from gputally.otlp.values import set_any_value, set_attributes
from gputally.probes.core.model import Attributes, AttrValue, Entity, Kind, LogEntry

__all__ = ["SCOPE_NAME", "OtlpEncoder", "logs_request", "metrics_request"]

SCOPE_NAME = "gputally.probes.nvml"
SCOPE_VERSION = __version__

_INT64_MAX = 2**63 - 1
_CUMULATIVE = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def _scope(target: Any, name: str) -> None:
    target.scope.name = name
    target.scope.version = SCOPE_VERSION


class OtlpEncoder:
    """Builds the probe's export requests, reusing the encodings of recurring attribute sets."""

    def __init__(self, *, scope_name: str = SCOPE_NAME, max_cached: int = 4096) -> None:
        """``scope_name``: the instrumentation scope, which names the probe
        (``gputally.probes.nvml``, ``gputally.probes.amd``...)."""
        self._scope_name = scope_name
        self._max_cached = max_cached
        self._resources: dict[tuple[tuple[str, AttrValue], ...], bytes] = {}
        self._point_attributes: dict[Attributes, bytes] = {}
        self._histogram_attributes: dict[Attributes, bytes] = {}

    def _resource(self, attributes: Mapping[str, AttrValue]) -> bytes:
        key = tuple(attributes.items())
        blob = self._resources.get(key)
        if blob is None:
            resource = Resource()
            set_attributes(resource.attributes, key)
            blob = resource.SerializeToString()
            if len(self._resources) >= self._max_cached:
                self._resources.clear()  # processes came and went: start again
            self._resources[key] = blob
        return blob

    def _point(self, attributes: Attributes) -> bytes:
        return self._attributes_blob(self._point_attributes, metrics_pb2.NumberDataPoint, attributes)

    def _histogram_point(self, attributes: Attributes) -> bytes:
        """As :meth:`_point`; a histogram point keeps its attributes under another field number."""
        return self._attributes_blob(self._histogram_attributes, metrics_pb2.HistogramDataPoint, attributes)

    def _attributes_blob(self, cache: dict[Attributes, bytes], kind: Any, attributes: Attributes) -> bytes:
        """A point of ``kind`` holding only ``attributes``, encoded once and kept in ``cache``."""
        blob = cache.get(attributes)
        if blob is None:
            point = kind()
            set_attributes(point.attributes, attributes)
            blob = point.SerializeToString()
            if len(cache) >= self._max_cached:
                cache.clear()
            cache[attributes] = blob
        return blob

    def metrics(self, entities: Iterable[Entity], time_ns: int) -> ExportMetricsServiceRequest:
        """One ResourceMetrics per entity with points; one Metric per name, one point per attribute set."""
        request = ExportMetricsServiceRequest()
        for entity in entities:
            if not entity.points and not entity.histograms:
                continue
            resource_metrics = request.resource_metrics.add()
            resource_metrics.resource.MergeFromString(self._resource(entity.attributes))
            scope_metrics = resource_metrics.scope_metrics.add()
            _scope(scope_metrics, self._scope_name)
            metrics: dict[str, Any] = {}
            for point in entity.points:
                definition = point.metric
                points = metrics.get(definition.name)
                if points is None:
                    metric = scope_metrics.metrics.add()
                    metric.name, metric.unit = definition.name, definition.unit
                    metric.description = definition.description
                    if definition.kind is Kind.GAUGE:
                        points = metric.gauge.data_points
                    else:
                        metric.sum.aggregation_temporality = _CUMULATIVE
                        metric.sum.is_monotonic = definition.kind is Kind.COUNTER
                        points = metric.sum.data_points
                    metrics[definition.name] = points
                data_point = points.add()
                if point.attributes:
                    data_point.MergeFromString(self._point(point.attributes))
                data_point.time_unix_nano = time_ns
                if point.start_ns is not None:
                    data_point.start_time_unix_nano = point.start_ns
                value = point.value
                if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _INT64_MAX:
                    data_point.as_int = value
                else:
                    data_point.as_double = float(value)
            self._histograms(entity, scope_metrics, metrics, time_ns)
        return request

    def _histograms(self, entity: Entity, scope_metrics: Any, metrics: dict[str, Any], time_ns: int) -> None:
        """An entity's histograms: cumulative explicit-bucket, one point per attribute set."""
        for histogram in entity.histograms:
            definition = histogram.metric
            points = metrics.get(definition.name)
            if points is None:
                metric = scope_metrics.metrics.add()
                metric.name, metric.unit = definition.name, definition.unit
                metric.description = definition.description
                metric.histogram.aggregation_temporality = _CUMULATIVE
                points = metric.histogram.data_points
                metrics[definition.name] = points
            data_point = points.add()
            if histogram.attributes:
                data_point.MergeFromString(self._histogram_point(histogram.attributes))
            data_point.time_unix_nano = time_ns
            if histogram.start_ns is not None:
                data_point.start_time_unix_nano = histogram.start_ns
            data_point.count = histogram.count
            data_point.sum = histogram.sum
            data_point.explicit_bounds.extend(histogram.bounds)
            data_point.bucket_counts.extend(histogram.counts)

    def logs(self, entries: Iterable[LogEntry], observed_ns: int) -> ExportLogsServiceRequest:
        """Log records grouped under their entity's Resource."""
        request = ExportLogsServiceRequest()
        by_entity: dict[str, Any] = {}
        for entry in entries:
            scope_logs = by_entity.get(entry.entity.key)
            if scope_logs is None:
                resource_logs = request.resource_logs.add()
                resource_logs.resource.MergeFromString(self._resource(entry.entity.attributes))
                scope_logs = resource_logs.scope_logs.add()
                _scope(scope_logs, self._scope_name)
                by_entity[entry.entity.key] = scope_logs
            record = scope_logs.log_records.add()
            record.time_unix_nano = entry.time_ns
            record.observed_time_unix_nano = observed_ns
            record.severity_number = int(entry.severity)
            record.severity_text = entry.severity.name
            record.event_name = entry.event_name
            set_any_value(record.body, entry.body)
            set_attributes(record.attributes, entry.attributes.items())
        return request


def metrics_request(entities: Iterable[Entity], time_ns: int) -> ExportMetricsServiceRequest:
    """:meth:`OtlpEncoder.metrics` without a cache (tests, one-off use)."""
    return OtlpEncoder().metrics(entities, time_ns)


def logs_request(entries: Iterable[LogEntry], observed_ns: int) -> ExportLogsServiceRequest:
    """:meth:`OtlpEncoder.logs` without a cache."""
    return OtlpEncoder().logs(entries, observed_ns)
