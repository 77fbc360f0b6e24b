"""What a metrics request says about GPU usage: per GPU and sample time, its utilization,
energy counter, memory and allocation, and each of its processes' owner, share and memory.

The request is read through a *usage schema*: descriptors with OTLP's field numbers that
declare only what accounting needs (each resource as bytes, metric names, number points);
everything else is skipped by the C parser. What a resource's bytes imply (GPU or process,
which owner) is decided once and cached by those bytes, since a GPU sends the same resource
every cycle. The probes (``hw.*``, ``gputally.gpu.process.*``) and dcgm-exporter through the
``dcgm`` processor (``DCGM_FI_*``) are read alike, so both give the same counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gputally.otlp.shapes import Shapes

from . import engines
from .engines import EngineDecision, EngineReading
from .layout import Layout, Slot, Wants, build
from .owners import UNATTRIBUTED, Named, OwnerRules, Value, unattributed_reason

__all__ = ["DEVICE_KEYS", "DeviceReading", "EngineReading", "Observer", "ProcessReading", "Sample"]

DEVICE_KEYS = (
    "hw.id", "hw.model", "hw.parent", "host.name", "host.type", "k8s.node.name", "gputally.gpu.index",
    "cloud.provider", "cloud.region", "cloud.availability_zone",
)
"""GPU attributes copied onto its usage counters (where the GPU resource has them): which GPU,
and where it is (node, instance type, zone), for cost by model, zone or instance type."""

_PACKAGE = "gputally.usage.view"
_F = descriptor_pb2.FieldDescriptorProto
_MIB = float(1 << 20)
_DECISIONS_LIMIT = 16384


def _request_class() -> Any:
    fdp = descriptor_pb2.FileDescriptorProto(name="gputally_usage_view.proto", package=_PACKAGE, syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> Any:
        proto = fdp.message_type.add(name=name)
        for field_name, number, label, type_, type_name in fields:
            entry = proto.field.add(name=field_name, number=number, label=label, type=type_)
            if type_name:
                entry.type_name = f".{_PACKAGE}.{type_name}"
        return proto

    one, many = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    # opentelemetry/proto/metrics/v1/metrics.proto: NumberDataPoint, Gauge/Sum, Metric, ScopeMetrics, ResourceMetrics.
    message("Text", ("string_value", 1, one, _F.TYPE_STRING, None))
    message("Attribute", ("key", 1, one, _F.TYPE_STRING, None), ("value", 2, one, _F.TYPE_MESSAGE, "Text"))
    point = message(
        "Point",
        ("attributes", 7, many, _F.TYPE_MESSAGE, "Attribute"),
        ("start_time_unix_nano", 2, one, _F.TYPE_FIXED64, None),
        ("time_unix_nano", 3, one, _F.TYPE_FIXED64, None),
        ("as_double", 4, one, _F.TYPE_DOUBLE, None),
        ("as_int", 6, one, _F.TYPE_SFIXED64, None),
    )
    point.oneof_decl.add(name="value")
    point.field[3].oneof_index = 0
    point.field[4].oneof_index = 0
    message("Data", ("data_points", 1, many, _F.TYPE_MESSAGE, "Point"))
    message("Metric", ("name", 1, one, _F.TYPE_STRING, None), ("gauge", 5, one, _F.TYPE_MESSAGE, "Data"),
            ("sum", 7, one, _F.TYPE_MESSAGE, "Data"))
    message("Scope", ("metrics", 2, many, _F.TYPE_MESSAGE, "Metric"))
    message("Entry", ("resource", 1, one, _F.TYPE_BYTES, None), ("scope_metrics", 2, many, _F.TYPE_MESSAGE, "Scope"))
    message("Request", ("entries", 1, many, _F.TYPE_MESSAGE, "Entry"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.Request"))


_REQUEST = _request_class()

# metric name -> (role, scale, rank: lower wins when a GPU reports several sources of one role)
_DEVICE_METRICS: dict[str, tuple[str, float, int]] = {
    "hw.gpu.utilization": ("utilization", 1.0, 0),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization", 0.01, 1),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("utilization", 1.0, 2),
    "hw.energy": ("energy", 1.0, 0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy", 1e-3, 1),
    "hw.gpu.memory.usage": ("memory", 1.0, 0),
    "DCGM_FI_DEV_FB_USED": ("memory", _MIB, 1),
    "hw.gpu.memory.limit": ("limit", 1.0, 0),
    "DCGM_FI_DEV_FB_FREE": ("free", _MIB, 1),
}
_PROCESS_METRICS: dict[str, tuple[str, float, int]] = {
    "gputally.gpu.process.utilization": ("utilization", 1.0, 0),
    "gputally.gpu.process.memory.usage": ("memory", 1.0, 0),
}
_TASKED = frozenset({"hw.gpu.utilization", "gputally.gpu.process.utilization"})
"""Metrics with one point per engine (``hw.gpu.task``): only the general (SM) one counts."""


@dataclass(slots=True)
class DeviceReading:
    """What one GPU resource said at one sample time."""

    utilization: float | None = None
    energy_j: float | None = None
    memory: float | None = None
    limit: float | None = None
    allocation: tuple[Named, ...] = ()
    attributes: tuple[tuple[str, Value], ...] = ()


@dataclass(slots=True)
class ProcessReading:
    owner: Named
    utilization: float | None = None
    memory: float | None = None
    reason: str = ""
    """Why the owner is ``unattributed`` (`owners.REASONS`); empty for a named owner."""


@dataclass(slots=True)
class Sample:
    """One GPU at one sample time: its own reading and its processes' (from any request)."""

    device: DeviceReading | None = None
    processes: dict[str, ProcessReading] = field(default_factory=dict)
    arrived: float = 0.0
    """Monotonic time the first part of the sample arrived (for ``settle``)."""


T = TypeVar("T")

Observation = tuple[str, int, DeviceReading | None, dict[str, ProcessReading]]
"""``(hw_id, time_ns, device reading, {process key: process reading})``: what one resource (a
GPU's, or a process's) said at one time, or all of a GPU's resources in a request read through
a layout. The dict is new for each observation: the ledger keeps it."""


@dataclass(frozen=True, slots=True)
class _Decision:
    hw_id: str
    process: str | None
    """``pid@creation`` for a process resource; None for a GPU."""
    owner: Named
    """A process's owner (``unattributed`` when no rule names it; unused for a GPU)."""
    allocation: tuple[Named, ...]
    attributes: tuple[tuple[str, Value], ...]
    reason: str = ""
    """A process's: why it is ``unattributed`` (empty when a rule named it)."""


def _value(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    if kind in ("string_value", "int_value", "double_value", "bool_value"):
        return getattr(any_value, kind)
    return None


class Observer:
    """Turns requests into per-(GPU, sample time) readings. Holds its decision and layout caches."""

    def __init__(self, rules: OwnerRules, *, layout_budget: int = 32 << 20) -> None:
        self._rules = rules
        self._decisions: dict[bytes, _Decision | EngineDecision | None] = {}
        self._wants = Wants(decide=self._decide, wanted=_table, tasked=_TASKED, general=_general, tagged=_tagged)
        self.layouts: Shapes[Layout] = Shapes(self._layout, budget=layout_budget)
        self.engines: list[EngineReading] = []
        """Engine readings of the requests observed so far, in request order (filled as an
        observation iterator is consumed; see :meth:`take_engines`)."""

    def take_engines(self) -> list[EngineReading]:
        """The engine readings gathered since the last call."""
        taken, self.engines = self.engines, []
        return taken

    def observe(self, raw: bytes) -> Iterator[Observation]:
        """``(hw_id, time_ns, device reading, process readings)`` for every GPU or process
        resource with usage metrics (through a layout: for every GPU), once per point time.
        Engine resources' readings go to :attr:`engines` as the iterator is consumed."""
        layout = self.layouts.lookup(raw)
        if layout is None:
            return self._parsed(raw)
        return self._laid_out(layout, raw)

    def _parsed(self, raw: bytes) -> Iterator[Observation]:
        """The general way: one parse of the usage schema, every metric looked at."""
        request = _REQUEST.FromString(raw)
        for entry in request.entries:
            decision = self._decide(entry.resource)
            if decision is None:
                continue
            if isinstance(decision, EngineDecision):
                self._engine(decision, entry)
                continue
            table = _table(decision)
            values: dict[int, dict[str, tuple[int, float]]] = {}
            for scope in entry.scope_metrics:
                for metric in scope.metrics:
                    name = metric.name
                    spec = table.get(name)
                    if spec is None:
                        continue
                    role, scale, rank = spec
                    data = metric.gauge if metric.HasField("gauge") else metric.sum
                    tasked = name in _TASKED
                    for point in data.data_points:
                        if tasked and not _general(point.attributes):
                            continue
                        kind = point.WhichOneof("value")
                        if kind is None:
                            continue
                        _hold(values.setdefault(point.time_unix_nano, {}), role, rank,
                              float(getattr(point, kind)) * scale)
            for time_ns, roles in values.items():
                yield _observation(decision, time_ns, {role: value for role, (_, value) in roles.items()})

    def _engine(self, decision: EngineDecision, entry: Any) -> None:
        """An engine resource read the general way: its counter points, per point time."""
        by_time: dict[int, dict[engines.Tag, tuple[int, float]]] = {}
        for scope in entry.scope_metrics:
            for metric in scope.metrics:
                spec = engines.ENGINE_METRICS.get(metric.name)
                if spec is None:
                    continue
                role, scale, _ = spec
                for point in (metric.gauge if metric.HasField("gauge") else metric.sum).data_points:
                    kind = point.WhichOneof("value")
                    if kind is None:
                        continue
                    engines.hold(by_time.setdefault(point.time_unix_nano, {}), engines.tag_of(role, point.attributes),
                                 point.start_time_unix_nano, float(getattr(point, kind)) * scale)
        self.engines.extend(EngineReading(decision, t, points) for t, points in by_time.items() if points)

    def _laid_out(self, layout: Layout, raw: bytes) -> Iterator[Observation]:
        """A request of a known shape: its numbers read from their offsets."""
        values, times = layout.read(raw)
        gpus, entries, served = layout.plan
        if served:
            self._laid_out_engines(served, values, times, layout.read_starts(raw))
        if times and times.count(times[0]) == len(times) and not layout.untimed:
            time_ns = times[0]  # one sample time for the whole request, as a probe sends it
            for hw_id, device, processes in gpus:
                reading = None
                if device is not None:
                    decision, ui, us, ei, es, mi, ms, li, ls, fi, fs = device
                    memory = values[mi] * ms if mi >= 0 else None
                    reading = DeviceReading(
                        values[ui] * us if ui >= 0 else None, values[ei] * es if ei >= 0 else None, memory,
                        _limit(memory, values[li] * ls if li >= 0 else None, values[fi] * fs if fi >= 0 else None),
                        decision.allocation, decision.attributes)
                readings = {}
                for key, owner, ui, us, mi, ms, reason in processes:
                    readings[key] = ProcessReading(
                        owner, values[ui] * us if ui >= 0 else None, values[mi] * ms if mi >= 0 else None, reason)
                yield hw_id, time_ns, reading, readings
            return
        for decision, slots in entries:
            by_time: dict[int, dict[str, tuple[int, float]]] = {}
            for slot in slots:
                time_ns = times[slot.time] if slot.time >= 0 else 0
                _hold(by_time.setdefault(time_ns, {}), slot.role, slot.rank, values[slot.value] * slot.scale)
            for time_ns, roles in by_time.items():
                yield _observation(decision, time_ns, {role: value for role, (_, value) in roles.items()})

    def _laid_out_engines(self, served: tuple[tuple[EngineDecision, tuple[Slot, ...]], ...],
                          values: tuple[float | int, ...], times: tuple[int, ...], starts: tuple[int, ...]) -> None:
        """The engine resources of a request of a known shape (their series known from the
        layout: each point's attributes are part of its skeleton)."""
        found = self.engines
        hold = engines.hold
        for decision, slots in served:
            by_time: dict[int, dict[engines.Tag, tuple[int, float]]] = {}
            for slot in slots:
                time_ns = times[slot.time] if slot.time >= 0 else 0
                hold(by_time.setdefault(time_ns, {}), slot.tag, starts[slot.start] if slot.start >= 0 else 0,
                     values[slot.value] * slot.scale)
            found.extend(EngineReading(decision, t, points) for t, points in by_time.items() if points)

    def _layout(self, raw: bytes) -> Layout:
        layout = build(raw, self._wants)
        gpus = tuple(e for e in layout.entries if e[0].__class__ is not EngineDecision)
        served = tuple(e for e in layout.entries if e[0].__class__ is EngineDecision and e[1])
        layout.plan = (_plan(gpus), gpus, served)
        return layout

    def _decide(self, raw: bytes) -> _Decision | EngineDecision | None:
        try:
            return self._decisions[raw]
        except KeyError:
            pass
        attributes = {kv.key: _value(kv.value) for kv in Resource.FromString(raw).attributes}
        decision: _Decision | EngineDecision | None = engines.decide(attributes, self._rules)
        hw_id = attributes.get("hw.id")
        if decision is not None:
            pass
        elif isinstance(hw_id, str) and hw_id and attributes.get("hw.type", "gpu") == "gpu":
            pid = attributes.get("process.pid")
            if isinstance(pid, int):
                process = f"{pid}@{attributes.get('process.creation.time', '')}"
                named = self._rules.process_owner(attributes)
                reason = unattributed_reason(attributes) if named[0] is UNATTRIBUTED else ""
                decision = _Decision(hw_id, process, named, (), (), reason)
            else:
                device = tuple((k, attributes[k]) for k in DEVICE_KEYS if isinstance(attributes.get(k), str | int))
                decision = _Decision(hw_id, None, (UNATTRIBUTED, ()), self._rules.allocation(attributes), device)
        if len(self._decisions) >= _DECISIONS_LIMIT:
            self._decisions.clear()
        self._decisions[raw] = decision
        return decision


def _general(attributes: Any) -> bool:
    """No engine named, or the general (SM) one: not encoder or decoder time. Compared by
    value, not by bytes: encoders differ (a Collector in front writes the same attribute
    with other bytes than Python's protobuf)."""
    for kv in attributes:
        if kv.key == "hw.gpu.task":
            return kv.value.string_value == "general"
    return True


def _hold(roles: dict[str, tuple[int, T]], role: str, rank: int, value: T) -> None:
    """Keep ``value`` for ``role`` unless a source of lower rank already gave one (a GPU that
    reports both ``hw.*`` and ``DCGM_FI_*`` counts the first)."""
    held = roles.get(role)
    if held is None or rank < held[0]:
        roles[role] = (rank, value)


def _table(decision: Any) -> dict[str, tuple[str, float, int]]:
    """The metrics read for a resource: an engine's, a process's, or a GPU's."""
    if decision.__class__ is EngineDecision:
        return engines.ENGINE_METRICS
    return _PROCESS_METRICS if decision.process is not None else _DEVICE_METRICS


_POINT = _REQUEST.DESCRIPTOR.fields_by_name["entries"].message_type.fields_by_name["scope_metrics"].message_type \
    .fields_by_name["metrics"].message_type.fields_by_name["sum"].message_type.fields_by_name["data_points"].message_type
_POINT_CLASS = message_factory.GetMessageClass(_POINT)


def _tagged(decision: Any, name: str, point: bytes) -> engines.Tag | None:
    """The series of an engine's counter point (None for other resources' points), from the
    point's bytes read through the usage schema, as the general way reads them."""
    if decision.__class__ is not EngineDecision:
        return None
    parsed: Any = _POINT_CLASS.FromString(point)
    return engines.tag_of(engines.ENGINE_METRICS[name][0], parsed.attributes)


def _plan(entries: tuple[tuple[Any, tuple[Slot, ...]], ...]) -> tuple[Any, ...]:
    """Per GPU, in request order: ``(hw_id, device, processes)`` for reading an entry whose
    points share one time. ``device``: the GPU resource's decision, then value index and scale
    of utilization, energy, memory, limit and free (-1: none), or None; ``processes``: ``(key,
    owner, utilization index and scale, memory index and scale, unattributed reason)`` per process resource. Each
    role's point is the one the general read keeps (:func:`_hold`); a GPU or process named by
    two resources keeps the last, as the ledger does."""
    devices: dict[str, tuple[Any, ...] | None] = {}
    processes: dict[str, dict[str, tuple[Any, ...]]] = {}
    for decision, slots in entries:
        if not slots:
            continue
        found: dict[str, tuple[int, tuple[int, float]]] = {}
        for slot in slots:
            _hold(found, slot.role, slot.rank, (slot.value, slot.scale))
        roles = [n for role in _ROLES for n in (found[role][1] if role in found else (-1, 0.0))]
        devices.setdefault(decision.hw_id, None)
        if decision.process is None:
            devices[decision.hw_id] = (decision, *roles)
        else:
            ui, us, _, _, mi, ms = roles[:6]
            gpu = processes.setdefault(decision.hw_id, {})
            gpu.pop(decision.process, None)
            gpu[decision.process] = (decision.process, decision.owner, ui, us, mi, ms, decision.reason)
    return tuple((hw_id, device, tuple(processes.get(hw_id, {}).values())) for hw_id, device in devices.items())


_ROLES = ("utilization", "energy", "memory", "limit", "free")


def _observation(decision: _Decision, time_ns: int, roles: dict[str, float]) -> Observation:
    if decision.process is not None:
        return decision.hw_id, time_ns, None, {decision.process: ProcessReading(
            decision.owner, roles.get("utilization"), roles.get("memory"), decision.reason)}
    memory = roles.get("memory")
    limit = _limit(memory, roles.get("limit"), roles.get("free"))
    return decision.hw_id, time_ns, DeviceReading(
        roles.get("utilization"), roles.get("energy"), memory, limit, decision.allocation, decision.attributes), {}


def _limit(memory: float | None, limit: float | None, free: float | None) -> float | None:
    """The GPU's memory size: as reported, else used + free (dcgm-exporter reports no total)."""
    if limit is None and memory is not None and free is not None:
        return memory + free
    return limit
