"""The ledger as OTLP: one resource per (owner, GPU) with the usage counters, one per GPU with
its observed time, and the events as log records on the owner's resource.

| metric | unit | type | what |
|---|---|---|---|
| ``gputally.usage.allocated.time`` | s | counter | time the GPU was allocated to the owner (1/N of it when N hold it) |
| ``gputally.usage.busy.time`` | s | counter | utilization x time, the owner's share of it |
| ``gputally.usage.idle.time`` | s | counter | allocated time with the owner's utilization below ``idle_below`` |
| ``gputally.usage.energy`` | J | counter | the owner's share of the GPU's energy counter |
| ``gputally.usage.cost`` | {cost} | counter | allocated hours x price + kWh x energy price (point attribute ``gputally.usage.currency``) |
| ``gputally.usage.memory.peak`` | By | gauge | most GPU memory the owner's processes held on the GPU |
| ``gputally.usage.observed.time`` | s | counter | per GPU: time integrated (the owners' allocated time adds up to it) |
| ``gputally.usage.unobserved.time`` | s | counter | per GPU: gaps longer than ``max_gap``, not integrated |
| ``gputally.usage.unattributed.time`` | s | counter | per GPU and ``gputally.usage.unattributed.reason``: busy time of processes no rule named |
| ``gputally.usage.refused.time`` | s | counter | per GPU and ``gputally.usage.refused.reason``: busy time its readings claimed above wall time |
| ``gputally.usage.refused.energy`` | J | counter | per GPU and reason: energy its readings claimed that no GPU can have used |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gputally import __version__
from gputally.otlp.values import set_any_value, set_attributes

from .ledger import Account, Device, Event, Ledger
from .owners import REASONS, Owner

__all__ = ["SCOPE", "MetricsEmitter", "logs_request"]

SCOPE = "gputally.processors.usage"
CURRENCY = "gputally.usage.currency"
REASON = "gputally.usage.unattributed.reason"
REFUSED_REASON = "gputally.usage.refused.reason"
_CUMULATIVE = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_SEVERITY = {"INFO": 9, "WARN": 13}

_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("gputally.usage.allocated.time", "s", "allocated"),
    ("gputally.usage.busy.time", "s", "busy"),
    ("gputally.usage.idle.time", "s", "idle"),
    ("gputally.usage.energy", "J", "energy"),
)
"""(name, unit, Account field). No descriptions: they would repeat on every (owner, GPU)
resource; the table above (and the README) is where the counters are described."""


def _resource(attributes: tuple[tuple[str, Any], ...]) -> bytes:
    resource = Resource()
    set_attributes(resource.attributes, attributes)
    return bytes(resource.SerializeToString())


def _sum(scope: Any, name: str, unit: str, start: int, now: int, value: float, *, zero: bool = False) -> Any:
    """A counter metric with one cumulative point; with ``zero``, first a 0 at the start time
    (see `MetricsEmitter`)."""
    metric = scope.metrics.add(name=name, unit=unit)
    metric.sum.aggregation_temporality = _CUMULATIVE
    metric.sum.is_monotonic = True
    if zero and start < now:
        metric.sum.data_points.add(start_time_unix_nano=start, time_unix_nano=start, as_double=0.0)
    metric.sum.data_points.add(start_time_unix_nano=start, time_unix_nano=now, as_double=value)
    return metric


class MetricsEmitter:
    """Builds the counters' requests, at most ``max_resources`` resources each (a backend's
    message limit is typically 4 MiB; 1,000 resources are about 0.8 MiB). Resource encodings are
    kept while their attributes stay the same: between two emits, almost all of them do.

    Two things keep a backend's per-series deltas whole (Prometheus' ``increase()``, or the
    report's own arithmetic, never count a series' first sample):

    * a counter's first emit also carries a 0 at its start time, so what it counted before that
      first emit is an increase like any other (``announced`` on the account remembers it,
      across restarts with ``storage``);
    * when an owner's attributes change (its metadata arrived after its first emit), the counters
      go out once more under the old attributes, with the current values, before the new series
      begins: the old series ends where the new one starts."""

    def __init__(self, *, max_resources: int = 1000) -> None:
        self._max = max_resources
        self._resources: dict[tuple[Owner | None, str], tuple[tuple[tuple[str, Any], ...], bytes]] = {}

    def requests(self, ledger: Ledger, now_ns: int) -> list[ExportMetricsServiceRequest]:
        """Every account's counters and every GPU's observed time, stamped ``now_ns``."""
        out: list[ExportMetricsServiceRequest] = []
        request = ExportMetricsServiceRequest()
        currency = ledger.config.currency
        seen: dict[tuple[Owner | None, str], tuple[tuple[tuple[str, Any], ...], bytes]] = {}
        for hw_id in sorted(ledger.devices):
            device = ledger.devices[hw_id]
            if device.last_ns is None:
                continue
            if len(request.resource_metrics) + len(device.accounts) + 1 > self._max and request.resource_metrics:
                out.append(request)
                request = ExportMetricsServiceRequest()
            for scope in self._scopes(request, seen, ledger, None, hw_id, device):
                zero = not device.announced
                _sum(scope, "gputally.usage.observed.time", "s", device.start_ns, now_ns, device.observed, zero=zero)
                _sum(scope, "gputally.usage.unobserved.time", "s", device.start_ns, now_ns, device.unobserved,
                     zero=zero)
                _unattributed(scope, device, now_ns, zero=zero)
                if device.refused:
                    _refused(scope, device, now_ns)
            device.announced = True
            for owner in sorted(device.accounts, key=lambda o: (o.kind, o.id)):
                account = device.accounts[owner]
                for scope in self._scopes(request, seen, ledger, owner, hw_id, device):
                    self._account(scope, ledger, device, account, now_ns, currency)
                account.announced = True
        if request.resource_metrics:
            out.append(request)
        self._resources = seen  # encodings of accounts that are gone go with them
        return out

    def _scopes(self, request: ExportMetricsServiceRequest, seen: dict[Any, Any], ledger: Ledger,
                owner: Owner | None, hw_id: str, device: Device) -> list[Any]:
        """A scope to fill under the resource's attributes, after one under its previous
        attributes when they changed since the last emit."""
        attributes = ledger.resource_of(owner, device)
        cached = self._resources.get((owner, hw_id))
        blobs = []
        if cached is None or cached[0] != attributes:
            if cached is not None:
                blobs.append(cached[1])  # the old series' last value
            cached = (attributes, _resource(attributes))
        seen[(owner, hw_id)] = cached
        blobs.append(cached[1])
        scopes = []
        for blob in blobs:
            rm = request.resource_metrics.add()
            rm.resource.MergeFromString(blob)
            scope = rm.scope_metrics.add()
            scope.scope.name, scope.scope.version = SCOPE, __version__
            scopes.append(scope)
        return scopes

    @staticmethod
    def _account(scope: Any, ledger: Ledger, device: Device, account: Account, now_ns: int, currency: str) -> None:
        start, zero = account.start_ns, not account.announced
        for name, unit, field in _COUNTERS:
            _sum(scope, name, unit, start, now_ns, getattr(account, field), zero=zero)
        cost = _sum(scope, "gputally.usage.cost", "{cost}", start, now_ns, ledger.cost(device, account), zero=zero)
        for point in cost.sum.data_points:
            set_attributes(point.attributes, [(CURRENCY, currency)])
        peak = scope.metrics.add(name="gputally.usage.memory.peak", unit="By")
        peak.gauge.data_points.add(time_unix_nano=now_ns, as_double=account.peak_memory)


def _unattributed(scope: Any, device: Device, now_ns: int, *, zero: bool) -> None:
    """The GPU's unattributed busy time, one point per reason (each from the GPU's start, so a
    reason first seen late is an increase like any other)."""
    metric = scope.metrics.add(name="gputally.usage.unattributed.time", unit="s")
    metric.sum.aggregation_temporality = _CUMULATIVE
    metric.sum.is_monotonic = True
    start = device.start_ns
    for reason in REASONS:
        points = []
        if zero and start < now_ns:
            points.append(metric.sum.data_points.add(start_time_unix_nano=start, time_unix_nano=start, as_double=0.0))
        points.append(metric.sum.data_points.add(start_time_unix_nano=start, time_unix_nano=now_ns,
                                                 as_double=device.unattributed.get(reason, 0.0)))
        for point in points:
            set_attributes(point.attributes, [(REASON, reason)])


def _refused(scope: Any, device: Device, now_ns: int) -> None:
    """What the GPU's readings claimed and no GPU can have done, one point per reason that
    happened on it (a reason's first point comes with a 0 at the GPU's start time)."""
    start = device.start_ns
    for name, unit, field in (("gputally.usage.refused.time", "s", "time"), ("gputally.usage.refused.energy", "J", "energy")):
        metric = scope.metrics.add(name=name, unit=unit)
        metric.sum.aggregation_temporality = _CUMULATIVE
        metric.sum.is_monotonic = True
        for reason in sorted(device.refused):
            refused = device.refused[reason]
            points = []
            if not refused.announced and start < now_ns:
                points.append(metric.sum.data_points.add(start_time_unix_nano=start, time_unix_nano=start, as_double=0.0))
            points.append(metric.sum.data_points.add(start_time_unix_nano=start, time_unix_nano=now_ns,
                                                     as_double=getattr(refused, field)))
            for point in points:
                set_attributes(point.attributes, [(REFUSED_REASON, reason)])
    for refused in device.refused.values():
        refused.announced = True


def logs_request(events: Sequence[Event], observed_ns: int) -> ExportLogsServiceRequest:
    """The events as log records, grouped under the (owner, GPU) resource they concern."""
    request = ExportLogsServiceRequest()
    scopes: dict[tuple[tuple[str, Any], ...], Any] = {}
    for event in events:
        key = event.resource
        scope = scopes.get(key)
        if scope is None:
            rl = request.resource_logs.add()
            rl.resource.MergeFromString(_resource(event.resource))
            scope = scopes[key] = rl.scope_logs.add()
            scope.scope.name, scope.scope.version = SCOPE, __version__
        record = scope.log_records.add(
            time_unix_nano=event.time_ns, observed_time_unix_nano=observed_ns,
            severity_number=_SEVERITY[event.severity], severity_text=event.severity, event_name=event.name,
        )
        set_any_value(record.body, event.body)
    return request
