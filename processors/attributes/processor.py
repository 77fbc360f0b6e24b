"""The ``attributes`` processor at run time.

Touching attributes from Python is what costs (each attribute wrapper ~0.4-1.2 us), so the
work per item is planned once per batch from what the bytes can prove:

* A key's encoding (``0x0a <len> <key>``) must occur in the serialized form of any message
  that holds it. When it does not occur in the request (for point attributes) or in the
  resource's own encoding (for resource attributes), the key is known to be absent and no
  item is searched for it.
* Setting an absent key is a merge of a KeyValue pre-serialized at construction
  (``MergeFromString`` appends to the repeated ``attributes`` field), several merges in a row
  fuse into one blob.

So the common enrichment (``insert``/``upsert`` of a key the sender does not set) is a
splice (:mod:`gputally.otlp.splice`): the blob is appended to the encoding of each resource,
or of each data point, log record or span, and the request is never decoded or encoded
whole. Only where the key may be present are the item's attributes searched: a resource is
then decoded alone, items in the decoded request. A key whose bytes appear by coincidence
(say as a string value) merely takes the slower, exact path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    ExponentialHistogramDataPoint,
    HistogramDataPoint,
    NumberDataPoint,
    SummaryDataPoint,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal
from gputally.otlp.splice import append_to_records, split
from gputally.otlp.templates import Templates
from gputally.otlp.wire import encode_varint
from gputally.pipeline.component import ComponentContext, Processor

from .config import ActionConfig, AttributesConfig, AttributeValue

__all__ = ["AttributesProcessor", "create"]

# What a planned item may know about a key before its step runs.
_ABSENT, _MAYBE, _PRESENT = 0, 1, 2

_METRIC_POINTS: dict[str, type[Any]] = {
    "gauge": NumberDataPoint,
    "sum": NumberDataPoint,
    "histogram": HistogramDataPoint,
    "exponential_histogram": ExponentialHistogramDataPoint,
    "summary": SummaryDataPoint,
}
_POINT_CLASSES: dict[Signal, tuple[type[Any], ...]] = {
    Signal.METRICS: (NumberDataPoint, HistogramDataPoint, ExponentialHistogramDataPoint, SummaryDataPoint),
    Signal.LOGS: (LogRecord,),
    Signal.TRACES: (Span,),
}
_PLAN_CACHE_LIMIT = 1024
_TEMPLATE_SETS = 4
"""Sets of point blobs with templates, each within its own 8 MiB (about 40 node request shapes of 26 KB: ~200 KiB each)."""

Step = Callable[[Any], None]
"""One planned change, applied to a message that has an ``attributes`` field."""


def _needle(key: str) -> bytes:
    """The encoding of ``KeyValue.key`` (field 1, length-delimited) for ``key``."""
    raw = key.encode()
    return b"\x0a" + encode_varint(len(raw)) + raw


def _any_value(value: AttributeValue) -> AnyValue:
    """The OTLP AnyValue for a config literal (bool is checked before int: it is an int in Python)."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=value)


def _find(attributes: Any, key: str) -> int:
    for index, kv in enumerate(attributes):
        if kv.key == key:
            return index
    return -1


def _merge(blob: bytes, item: Any) -> None:
    item.MergeFromString(blob)


def _insert(key: str, blob: bytes, item: Any) -> None:
    if _find(item.attributes, key) < 0:
        item.MergeFromString(blob)


def _update(key: str, value: AnyValue, item: Any) -> None:
    attributes = item.attributes
    index = _find(attributes, key)
    if index >= 0:
        attributes[index].value.CopyFrom(value)


def _upsert(key: str, value: AnyValue, blob: bytes, item: Any) -> None:
    attributes = item.attributes
    index = _find(attributes, key)
    if index >= 0:
        attributes[index].value.CopyFrom(value)
    else:
        item.MergeFromString(blob)


def _delete(key: str, item: Any) -> None:
    attributes = item.attributes
    index = _find(attributes, key)
    if index >= 0:
        del attributes[index]


def _copy(source: str, key: str, action: str, search: bool, item: Any) -> None:
    attributes = item.attributes
    found = _find(attributes, source)
    if found < 0:
        return
    index = _find(attributes, key) if search else -1
    if index >= 0:
        if action != "insert":
            attributes[index].value.CopyFrom(attributes[found].value)
    elif action != "update":
        attributes.add(key=key).value.CopyFrom(attributes[found].value)


@dataclass(frozen=True, slots=True)
class _Rule:
    """One action, with its KeyValue pre-serialized for every class it may be merged into."""

    action: str
    key: str
    value: AnyValue | None
    source: str | None
    blobs: Mapping[type[Any], bytes]

    @classmethod
    def build(cls, config: ActionConfig, classes: Iterable[type[Any]]) -> _Rule:
        value = _any_value(config.value) if config.value is not None else None
        blobs = {}
        if value is not None:
            kv = KeyValue(key=config.key, value=value)
            blobs = {klass: klass(attributes=[kv]).SerializeToString() for klass in classes}
        return cls(config.action, config.key, value, config.from_attribute, blobs)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What to do to each item of one class, given what is known of its keys.

    ``blob`` is set when the whole plan is one merge (the fast loop); ``steps`` is empty
    when there is nothing to do at all.
    """

    steps: tuple[Step, ...]
    blob: bytes | None


def _compile(rules: Iterable[_Rule], klass: type[Any], present: Mapping[str, bool]) -> _Plan:
    """Plan ``rules`` for items of ``klass`` whose keys are absent unless ``present`` says maybe."""
    state = {key: _MAYBE if maybe else _ABSENT for key, maybe in present.items()}
    steps: list[Step] = []
    pending = bytearray()  # merges not yet emitted, fused into one blob

    def emit(step: Step) -> None:
        if pending:
            steps.append(partial(_merge, bytes(pending)))
            pending.clear()
        steps.append(step)

    for rule in rules:
        known = state[rule.key]
        if rule.source is not None:
            source = state[rule.source]
            if (
                source == _ABSENT
                or (rule.action == "insert" and known == _PRESENT)
                or (rule.action == "update" and known == _ABSENT)
            ):
                continue
            emit(partial(_copy, rule.source, rule.key, rule.action, known != _ABSENT))
            if rule.action != "update" and known != _PRESENT:
                state[rule.key] = _PRESENT if source == _PRESENT else _MAYBE
        elif rule.action == "delete":
            if known != _ABSENT:
                emit(partial(_delete, rule.key))
                state[rule.key] = _ABSENT
        elif rule.action == "update":
            if known != _ABSENT:
                assert rule.value is not None
                emit(partial(_update, rule.key, rule.value))
        elif known == _ABSENT:  # insert or upsert of a key known to be absent: a plain merge
            pending += rule.blobs[klass]
            state[rule.key] = _PRESENT
        elif rule.action == "insert":
            if known == _MAYBE:
                emit(partial(_insert, rule.key, rule.blobs[klass]))
                state[rule.key] = _PRESENT
        else:  # upsert of a key that may be there
            assert rule.value is not None
            emit(partial(_upsert, rule.key, rule.value, rule.blobs[klass]))
            state[rule.key] = _PRESENT
    if pending and not steps:
        blob = bytes(pending)
        return _Plan((partial(_merge, blob),), blob)
    if pending:
        steps.append(partial(_merge, bytes(pending)))
    return _Plan(tuple(steps), None)


class _Planner:
    """The rules of one context, with a plan per (item class, keys that may be present)."""

    def __init__(self, rules: list[_Rule]) -> None:
        self.rules = rules
        keys = {rule.key for rule in rules} | {rule.source for rule in rules if rule.source}
        self._needles = {key: _needle(key) for key in sorted(keys)}
        self._plans: dict[tuple[type[Any], tuple[bool, ...]], _Plan] = {}

    def presence(self, encoded: bytes) -> tuple[bool, ...]:
        """Per key, whether it may be in ``encoded`` (False: certainly absent)."""
        return tuple(needle in encoded for needle in self._needles.values())

    def plan(self, klass: type[Any], present: tuple[bool, ...]) -> _Plan:
        """The plan for items of ``klass`` that may hold only the keys ``present`` marks."""
        cache_key = (klass, present)
        plan = self._plans.get(cache_key)
        if plan is None:
            if len(self._plans) >= _PLAN_CACHE_LIMIT:
                self._plans.clear()
            plan = _compile(self.rules, klass, dict(zip(self._needles, present, strict=True)))
            self._plans[cache_key] = plan
        return plan


def _run(items: Iterable[Any], plan: _Plan) -> None:
    blob = plan.blob
    if blob is not None:
        for item in items:
            item.MergeFromString(blob)
        return
    steps = plan.steps
    for item in items:
        for step in steps:
            step(item)


class AttributesProcessor(Processor):
    """Inserts, updates, upserts or deletes resource or item attributes, in config order."""

    def __init__(self, config: AttributesConfig, *, signal: Signal) -> None:
        self.signal = signal
        self._spec = SIGNALS[signal]
        point_rules = [_Rule.build(a, _POINT_CLASSES[signal]) for a in config.actions if a.context == "point"]
        resource_rules = [_Rule.build(a, (Resource,)) for a in config.actions if a.context == "resource"]
        self._points = _Planner(point_rules) if point_rules else None
        self._resources = _Planner(resource_rules) if resource_rules else None
        self._point_templates: dict[tuple[tuple[str | None, bytes], ...], Templates] = {}
        """Metrics point templates by the blobs they append (one set, unless a key's presence varies)."""
        self._resource_templates = Templates(self._rewrite_resources) \
            if self._resources is not None and signal is Signal.METRICS else None
        """The resource actions depend on each resource's bytes alone: a metrics request's
        rewrite is a template's after its shape's second sighting."""

    async def process(self, batch: Batch) -> Batch | None:
        # Resource and point attributes are separate sets, so the two contexts are
        # independent and the request's bytes, taken before any change, stay valid for points.
        if self._points is not None:
            self._change_points(batch, self._points)
        if self._resources is not None:
            self._change_resources(batch)
        return batch

    def _append(self, raw: bytes, blobs: dict[str | None, bytes]) -> bytes:
        """``blobs`` appended to every point: through the templates of these blobs (a node's
        requests differ only in their numbers), the general splice for a fifth set of blobs."""
        key = tuple(blobs.items())  # built in one order, from the planner's point kinds
        templates = self._point_templates.get(key)
        if templates is None:
            if len(self._point_templates) >= _TEMPLATE_SETS:
                return append_to_records(self.signal, raw, blobs)
            templates = self._point_templates[key] = Templates(
                lambda request: append_to_records(Signal.METRICS, request, blobs))
        return templates(raw)

    def _change_resources(self, batch: Batch) -> None:
        raw = batch.serialize()
        templates = self._resource_templates
        changed = templates(raw) if templates is not None else self._rewrite_resources(raw)
        if changed is not raw:
            batch.rewrite(changed)

    def _rewrite_resources(self, raw: bytes) -> bytes:
        """``raw`` with the resource actions applied (``raw`` itself when none applies).

        Spliced: each resource's encoding is extended (or, where a step must read its
        attributes, decoded and encoded alone); the rest of the request stays as it came."""
        assert self._resources is not None
        planner = self._resources
        request = split(raw)
        changed = False
        for entry in request.entries:
            encoded = entry.resource
            plan = planner.plan(Resource, planner.presence(encoded))
            if not plan.steps:
                continue
            if plan.blob is not None:
                entry.resource = encoded + plan.blob
            else:
                resource = Resource.FromString(encoded)
                for step in plan.steps:
                    step(resource)
                entry.resource = resource.SerializeToString()
            changed = True
        return bytes(request.SerializeToString()) if changed else raw

    def _change_points(self, batch: Batch, planner: _Planner) -> None:
        raw = batch.serialize()
        present = planner.presence(raw)
        if self.signal is Signal.METRICS:
            plans = {kind: planner.plan(klass, present) for kind, klass in _METRIC_POINTS.items()}
            if not any(plan.steps for plan in plans.values()):
                return
            if all(plan.blob is not None or not plan.steps for plan in plans.values()):
                # Only merges: appended to each point's encoding, the request never decoded.
                blobs: dict[str | None, bytes] = {kind: plan.blob for kind, plan in plans.items() if plan.blob}
                batch.rewrite(self._append(raw, blobs))
                return
            for resource_metrics in batch.mutable().resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        if kind is not None:
                            _run(getattr(metric, kind).data_points, plans[kind])
            return
        plan = planner.plan(_POINT_CLASSES[self.signal][0], present)
        if not plan.steps:
            return
        if plan.blob is not None:
            batch.rewrite(append_to_records(self.signal, raw, {None: plan.blob}))
            return
        spec = self._spec
        for resource_entry in getattr(batch.mutable(), spec.resource_field):
            for scope_entry in getattr(resource_entry, spec.scope_field):
                _run(getattr(scope_entry, spec.record_field), plan)


def create(config: AttributesConfig, context: ComponentContext, signal: Signal) -> AttributesProcessor:
    """Factory hook: one processor per pipeline."""
    del context  # nothing from the service is needed
    return AttributesProcessor(config, signal=signal)
