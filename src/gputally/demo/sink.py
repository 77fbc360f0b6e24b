"""The demo's backend: a loopback OTLP/HTTP endpoint that keeps the latest usage counters and
hands each usage event to a callback as it arrives (what a real backend would store).

The served models' accounts (``gputally.usage.tokens`` and ``gputally.usage.model.*``) are kept
apart from the per-owner counters, one series per (owner, served model, engine, token type or
GPU), as Prometheus keeps them: under the owner's key alone input and output tokens, and the
model accounts of two GPUs, would overwrite each other, and the chargeback table would see them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = ["SERVED", "TOKENS", "Event", "ServedKey", "Sink"]

TOKENS = "gputally.usage.tokens"
SERVED = frozenset({TOKENS, "gputally.usage.model.allocated.time", "gputally.usage.model.busy.time",
                    "gputally.usage.model.energy", "gputally.usage.model.cost", "gputally.usage.model.busy.cost"})
"""The served models' accounts (docs/accounts.md, "Usage accounts")."""
ServedKey = tuple[str, str, str, str, str]
"""(owner kind, owner id, served model ``gen_ai.request.model``, engine ``gputally.inference.engine``,
token type ``gen_ai.token.type`` for tokens, else the GPU's ``hw.id``)."""


def _value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind and kind != "bytes_value" else None


def _text(value: object) -> str:
    """A body as one line: ``key=value`` pairs for a map."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={_text(v)}" for k, v in value.items() if v not in (None, "", []))
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return "" if value is None else str(value)


def _number(point: Any) -> float:
    return float(point.as_double) if point.HasField("as_double") else float(point.as_int)


def _attrs(items: Iterable[KeyValue]) -> dict[str, object]:
    return {kv.key: _value(kv.value) for kv in items}


@dataclass(frozen=True)
class Event:
    """One usage log record: ``gputally.usage.idle``, ``.idle.end`` or ``.summary``."""

    name: str
    severity: str
    body: str
    attributes: dict[str, object]


@dataclass
class Sink:
    on_event: Callable[[Event], None]
    counters: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """(owner kind, owner id, metric name) -> the latest cumulative value."""
    events: list[Event] = field(default_factory=list)
    """What the callback has been handed (it appends)."""
    owners: dict[tuple[str, str], dict[str, object]] = field(default_factory=dict)
    """(owner kind, owner id) -> the resource attributes of its counters (the latest emit's win)."""
    gpus: dict[str, dict[str, float]] = field(default_factory=dict)
    """hw.id -> per-GPU usage counter (``gputally.usage.observed.time``...; ``.refused.*`` summed
    over reasons) -> its latest value."""
    readings: dict[str, list[float]] = field(default_factory=dict)
    """hw.id -> the GPU's energy counter (``hw.energy``, J) in each reading the probe sent, as it
    passed through serve: what the counters are held to."""
    stamps: dict[str, list[int]] = field(default_factory=dict)
    """hw.id -> each of those readings' time (ns): when the probe sent it."""
    served: dict[ServedKey, dict[str, float]] = field(default_factory=dict)
    """The served models' accounts: key -> metric name -> its latest cumulative value."""
    served_attributes: dict[ServedKey, dict[str, object]] = field(default_factory=dict)
    """key -> the resource and point attributes of its series (``hw.model``, the currency...)."""
    engine_reads: list[tuple[int, float]] = field(default_factory=list)
    """Each engine read the probe sent through serve: (time in ns, ``gputally.inference.up``)."""
    _served_at: dict[tuple[ServedKey, str], int] = field(default_factory=dict, init=False, repr=False)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/metrics", self._metrics)
        app.router.add_post("/v1/logs", self._logs)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        message = ExportMetricsServiceRequest.FromString(await request.read())
        for rm in message.resource_metrics:
            resource = _attrs(rm.resource.attributes)
            owner = (str(resource.get("gputally.usage.owner.kind", "")), str(resource.get("gputally.usage.owner.id", "")))
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    points = metric.sum.data_points if metric.HasField("sum") else metric.gauge.data_points
                    hw_id = str(resource.get("hw.id", ""))
                    if metric.name == "hw.energy" and hw_id and "process.pid" not in resource:
                        self.readings.setdefault(hw_id, []).extend(_number(p) for p in points)
                        self.stamps.setdefault(hw_id, []).extend(p.time_unix_nano for p in points)
                        continue
                    if metric.name == "gputally.inference.up":
                        self.engine_reads.extend((p.time_unix_nano, _number(p)) for p in points)
                        continue
                    if metric.name in SERVED:
                        self._keep_served(metric.name, resource, points)
                        continue
                    if not metric.name.startswith("gputally.usage."):
                        continue
                    if not owner[0] and hw_id:  # the GPU's own counters
                        latest: dict[str, float] = {}
                        for point in points:  # one per reason: the latest of each, summed
                            latest[repr(sorted(_attrs(point.attributes).items()))] = _number(point)
                        self.gpus.setdefault(hw_id, {})[metric.name] = sum(latest.values())
                        continue
                    for point in points:
                        attrs = {**resource, **_attrs(point.attributes)}
                        key = (str(attrs.get("gputally.usage.owner.kind", owner[0])),
                               str(attrs.get("gputally.usage.owner.id", owner[1])))
                        value = _number(point)
                        self.counters[(*key, metric.name)] = value
                        self.owners.setdefault(key, {}).update(attrs)  # metadata that came late, too
        return web.Response(content_type="application/x-protobuf", body=b"")

    def _keep_served(self, name: str, resource: dict[str, object], points: Iterable[Any]) -> None:
        """The latest point of each served-model series (by its time: a counter's first emit
        also carries a 0 at its start)."""
        for point in points:
            attrs = {**resource, **_attrs(point.attributes)}
            last = attrs.get("gen_ai.token.type") if name == TOKENS else attrs.get("hw.id")
            key = (str(attrs.get("gputally.usage.owner.kind", "")), str(attrs.get("gputally.usage.owner.id", "")),
                   str(attrs.get("gen_ai.request.model", "")), str(attrs.get("gputally.inference.engine", "")),
                   str(last or ""))
            if point.time_unix_nano >= self._served_at.get((key, name), -1):
                self._served_at[(key, name)] = point.time_unix_nano
                self.served.setdefault(key, {})[name] = _number(point)
            self.served_attributes.setdefault(key, {}).update(attrs)

    async def _logs(self, request: web.Request) -> web.Response:
        message = ExportLogsServiceRequest.FromString(await request.read())
        for rl in message.resource_logs:
            resource = _attrs(rl.resource.attributes)
            for sl in rl.scope_logs:
                for record in sl.log_records:
                    attrs = {**resource, **_attrs(record.attributes)}
                    name = record.event_name or str(attrs.get("event.name", ""))
                    if name.startswith("gputally.usage."):
                        value = _value(record.body)
                        body = str(value["message"]) if isinstance(value, dict) and "message" in value else _text(value)
                        self.on_event(Event(name, record.severity_text, body, attrs))
        return web.Response(content_type="application/x-protobuf", body=b"")
