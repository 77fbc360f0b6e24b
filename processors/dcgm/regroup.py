"""Moving dcgm-exporter's points from their scrape target's resource to one resource per GPU.

Pure protobuf work on a decoded ``ExportMetricsServiceRequest``; the processor decides when to
call it. Each moved point is copied once, from its encoding (see :mod:`.wire`); each metric is
re-created in a GPU resource from its shell (every field but the points), encoded once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    ExponentialHistogramDataPoint,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    SummaryDataPoint,
)

from gputally.otlp.wire import encode_varint

from .config import LabelsConfig
from .wire import attributes_tag, split_attributes

__all__ = ["CONSTANTS", "ROLE_KEYS", "Regrouper"]

ROLE_KEYS: dict[str, str] = {
    "uuid": "hw.id",
    "index": "gputally.gpu.index",
    "device": "hw.name",
    "model": "hw.model",
    "pci_bus_id": "gputally.gpu.pci.bus_id",
    "driver_version": "hw.driver_version",
    "hostname": "host.name",
}
"""Config role -> the resource attribute its label becomes (the probes' keys, so that ``k8s``
and ``slurm`` treat a dcgm GPU as they treat a probed one)."""

CONSTANTS: tuple[tuple[str, str], ...] = (("hw.type", "gpu"), ("hw.vendor", "NVIDIA"))
"""Set on every GPU resource (where absent): dcgm-exporter only ever reports NVIDIA GPUs."""

_HW_ID = ROLE_KEYS["uuid"]
_TAGS = {
    "gauge": attributes_tag(NumberDataPoint),
    "sum": attributes_tag(NumberDataPoint),
    "histogram": attributes_tag(HistogramDataPoint),
    "exponential_histogram": attributes_tag(ExponentialHistogramDataPoint),
    "summary": attributes_tag(SummaryDataPoint),
}
_UNSEEN = object()

Value = str | int
Additions = tuple[tuple[str, Value], ...]


def _needle(key: str) -> bytes:
    """The encoding of ``KeyValue.key`` (field 1, length-delimited) for ``key``."""
    raw = key.encode()
    return b"\x0a" + encode_varint(len(raw)) + raw


def _any_value(value: Value) -> AnyValue:
    return AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)


def _same(existing: AnyValue, value: Value) -> bool:
    if isinstance(value, int):
        return existing.WhichOneof("value") == "int_value" and existing.int_value == value
    return existing.WhichOneof("value") == "string_value" and existing.string_value == value


def _is_repeated(descriptor: Any) -> bool:
    try:
        return bool(descriptor.is_repeated)  # protobuf >= 6 (``label`` is gone in 7)
    except AttributeError:
        return bool(descriptor.label == descriptor.LABEL_REPEATED)


def _copy_shell(source: Any, target: Any, skip: str) -> None:
    """Copy every set field of ``source`` into ``target`` but ``skip`` (one level deep), so a
    field a newer OTLP adds (as ``Metric.metadata`` was) is carried along too."""
    for descriptor, value in source.ListFields():
        name = descriptor.name
        if name == skip:
            continue
        if _is_repeated(descriptor):
            getattr(target, name).extend(value)
        elif descriptor.message_type is None:
            setattr(target, name, value)
        else:
            getattr(target, name).CopyFrom(value)


def _metric_shell(metric: Metric, kind: str) -> Metric:
    """``metric`` without its points: name, unit, description, metadata, temporality, monotonicity."""
    shell = Metric()
    _copy_shell(metric, shell, skip=kind)
    data = getattr(shell, kind)
    data.SetInParent()  # a gauge's only field is its points: the kind must still be set
    _copy_shell(getattr(metric, kind), data, skip="data_points")
    return shell


@dataclass(frozen=True, slots=True)
class _Move:
    """Where points with one attribute encoding go, and what they keep."""

    additions: Additions
    """What their GPU resource adds to the source resource (also the group's identity)."""
    kept: bytes
    """The attribute entries that stay on the point, encoded."""


@dataclass(slots=True)
class _Group:
    """One GPU resource being filled from one source resource."""

    resource_metrics: ResourceMetrics
    scopes: dict[int, ScopeMetrics] = field(default_factory=dict)
    metrics: dict[tuple[int, int], Any] = field(default_factory=dict)
    """(scope index, metric index) in the source -> the shell's data (``metric.gauge`` ...)."""

    def data(self, scope_index: int, source_scope: ScopeMetrics, metric_index: int, shell: bytes, kind: str) -> Any:
        """The data (``metric.gauge`` ...) of this group's copy of a source metric, made on first use."""
        found = self.metrics.get((scope_index, metric_index))
        if found is not None:
            return found
        scope = self.scopes.get(scope_index)
        if scope is None:
            scope = self.resource_metrics.scope_metrics.add()
            _copy_shell(source_scope, scope, skip="metrics")
            self.scopes[scope_index] = scope
        metric = scope.metrics.add()
        metric.MergeFromString(shell)
        data = self.metrics[(scope_index, metric_index)] = getattr(metric, kind)
        return data


class Regrouper:
    """Moves every point that names a GPU to that GPU's resource. One per processor; it keeps
    nothing from one request to the next."""

    def __init__(self, labels: LabelsConfig) -> None:
        roles = labels.model_dump()
        self.uuid_label: str = labels.uuid
        # label -> (resource key, whether the value is an int); dict order = role order
        self._labels: dict[str, tuple[str, bool]] = {
            label: (ROLE_KEYS[role], role == "index") for role, label in roles.items() if label is not None
        }
        self.needle = _needle(labels.uuid)
        """Bytes every request holding a UUID label contains (a cheap first test)."""

    def regroup(self, request: Any, on_change: Callable[[], Any]) -> int:
        """Move the points of ``request`` in place; returns how many moved.

        ``on_change`` is called once, before the first change (the processor drops the
        batch's cached encoding there); when no point moves, nothing is called or changed.
        """
        changed = False

        def change() -> None:
            nonlocal changed
            if not changed:
                changed = True
                on_change()

        moved = 0
        emptied: list[int] = []
        for index in range(len(request.resource_metrics)):  # GPU resources are appended: not visited
            done, now_empty = self._resource(request, request.resource_metrics[index], change)
            moved += done
            if now_empty:
                emptied.append(index)
        for index in reversed(emptied):
            del request.resource_metrics[index]
        return moved

    def _resource(self, request: Any, source: ResourceMetrics, on_change: Callable[[], Any]) -> tuple[int, bool]:
        """Move the points of one resource; returns (points moved, whether ``source`` is now empty)."""
        base = {kv.key: kv.value for kv in source.resource.attributes}
        if _HW_ID in base and base[_HW_ID].WhichOneof("value") != "string_value":
            return 0, False
        moves: dict[bytes, _Move | None] = {}  # by attribute encoding; None: the point stays
        groups: dict[Additions, _Group] = {}
        moved = 0
        emptied_scopes: list[int] = []
        for scope_index, scope in enumerate(source.scope_metrics):
            emptied_metrics: list[int] = []
            for metric_index, metric in enumerate(scope.metrics):
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                tag = _TAGS[kind]
                points = getattr(metric, kind).data_points
                leaving: list[int] = []
                shell: bytes | None = None  # the metric without points, encoded once for every GPU
                for point_index, point in enumerate(points):
                    rest, entries = split_attributes(point.SerializeToString(), tag)
                    key = b"".join(entries)
                    move = moves.get(key, _UNSEEN)
                    if move is _UNSEEN:
                        move = moves[key] = self._plan(point, base, entries)
                    if move is None:
                        continue
                    assert isinstance(move, _Move)
                    group = groups.get(move.additions)
                    if group is None:
                        on_change()
                        group = groups[move.additions] = self._new_group(request, source, base, move.additions)
                    if shell is None:
                        shell = _metric_shell(metric, kind).SerializeToString()
                    target = group.data(scope_index, scope, metric_index, shell, kind).data_points.add()
                    target.MergeFromString(b"".join(rest) + move.kept)
                    leaving.append(point_index)
                if not leaving:
                    continue
                moved += len(leaving)
                if len(leaving) == len(points):
                    del points[:]
                    emptied_metrics.append(metric_index)
                else:
                    for point_index in reversed(leaving):
                        del points[point_index]
            for metric_index in reversed(emptied_metrics):
                del scope.metrics[metric_index]
            if emptied_metrics and not scope.metrics:
                emptied_scopes.append(scope_index)
        for scope_index in reversed(emptied_scopes):
            del source.scope_metrics[scope_index]
        return moved, bool(emptied_scopes) and not source.scope_metrics

    def _plan(self, point: Any, base: dict[str, AnyValue], entries: list[bytes]) -> _Move | None:
        """Where ``point`` (and every point with its attributes, ``entries`` encoded) goes:
        ``None`` when it stays where it is.

        A label leaves the point only when the GPU resource holds its value: a key the
        source resource already has with another value keeps it, and the label stays.
        """
        labels = self._labels
        found: dict[str, tuple[int, AnyValue]] = {}
        for attribute_index, kv in enumerate(point.attributes):
            if kv.key in labels:
                found[kv.key] = (attribute_index, kv.value)
        uuid = found.get(self.uuid_label)
        if uuid is None or uuid[1].WhichOneof("value") != "string_value" or not uuid[1].string_value:
            return None
        existing_id = base.get(_HW_ID)
        if existing_id is not None and existing_id.string_value != uuid[1].string_value:
            return None  # the resource is another GPU's: this point is not ours to move
        assert len(entries) == len(point.attributes)
        additions: list[tuple[str, Value]] = []
        drop: set[int] = set()
        for label, (key, integer) in labels.items():
            entry = found.get(label)
            if entry is None:
                continue
            attribute_index, raw = entry
            value = _value(raw, integer)
            if value is None:
                continue
            existing = base.get(key)
            if existing is None:
                additions.append((key, value))
                drop.add(attribute_index)
            elif _same(existing, value):
                drop.add(attribute_index)
        kept = b"".join(entry for index, entry in enumerate(entries) if index not in drop)
        return _Move(tuple(additions), kept)

    @staticmethod
    def _new_group(request: Any, source: ResourceMetrics, base: dict[str, AnyValue], additions: Additions) -> _Group:
        target = request.resource_metrics.add()
        _copy_shell(source, target, skip="scope_metrics")
        attributes = target.resource.attributes
        for key, value in additions:
            attributes.append(KeyValue(key=key, value=_any_value(value)))
        for key, value in CONSTANTS:
            if key not in base:
                attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
        return _Group(target)


def _value(raw: AnyValue, integer: bool) -> Value | None:
    """A label's value as its resource attribute takes it; ``None``: it cannot (it stays on the point)."""
    kind = raw.WhichOneof("value")
    if integer:
        if kind == "int_value":
            return int(raw.int_value)
        if kind == "string_value" and raw.string_value.isascii() and raw.string_value.isdigit():
            return int(raw.string_value)
        return None
    if kind == "string_value" and raw.string_value:
        return str(raw.string_value)
    return None
