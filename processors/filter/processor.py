"""The ``filter`` processor at run time.

Decisions are made per resource first: a resource that fails ``include``'s resource
conditions, or meets an ``exclude`` that has only resource conditions, goes whole without
looking at its items. Items (metrics, log records, spans) are read only when an item-level
condition applies. A batch from which nothing is dropped is not touched, so it keeps its
received encoding.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal
from gputally.pipeline.component import ComponentContext, FailurePolicy, Processor

from .config import (
    AttributeMatch,
    FilterConfig,
    LogFilter,
    LogMatch,
    MatchType,
    MetricFilter,
    MetricMatch,
    SpanFilter,
    SpanMatch,
)

__all__ = ["FilterProcessor", "create"]

_REGEXP_CACHE_LIMIT = 4096
_SERVICE_NAME = "service.name"


def _typed(value: Any) -> tuple[str, Any]:
    """An AnyValue or config literal as (kind, value), so that 1, 1.0, True and "1" differ."""
    if isinstance(value, bool):
        return ("bool_value", value)
    if isinstance(value, int):
        return ("int_value", value)
    if isinstance(value, float):
        return ("double_value", value)
    if isinstance(value, str):
        return ("string_value", value)
    kind = value.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return (kind, getattr(value, kind))
    return (kind or "", None)  # arrays, maps, bytes, empty: equal to no literal


class _Names:
    """Matches a string against exact values or any of several patterns."""

    def __init__(self, match_type: MatchType, values: list[str]) -> None:
        self._exact = frozenset(values) if match_type == "strict" else None
        self._patterns = [re.compile(v) for v in values] if match_type == "regexp" else []
        # Names repeat in every request, so regexp answers are remembered (bounded).
        self._answers: dict[str, bool] = {}

    def __call__(self, text: str) -> bool:
        if self._exact is not None:
            return text in self._exact
        answer = self._answers.get(text)
        if answer is None:
            answer = any(p.search(text) for p in self._patterns)
            if len(self._answers) >= _REGEXP_CACHE_LIMIT:
                self._answers.clear()
            self._answers[text] = answer
        return answer


class _Attributes:
    """All-of attribute conditions, checked against a key -> AnyValue mapping."""

    def __init__(self, match_type: MatchType, conditions: list[AttributeMatch]) -> None:
        self._conditions: list[tuple[str, tuple[str, Any] | re.Pattern[str] | None]] = []
        for condition in conditions:
            expected: tuple[str, Any] | re.Pattern[str] | None = None
            if condition.value is not None:
                if match_type == "regexp":
                    assert isinstance(condition.value, str)  # the config checked it
                    expected = re.compile(condition.value)
                else:
                    expected = _typed(condition.value)
            self._conditions.append((condition.key, expected))

    def __call__(self, values: Mapping[str, Any]) -> bool:
        for key, expected in self._conditions:
            value = values.get(key)
            if value is None:
                return False
            if expected is None:
                continue
            if isinstance(expected, re.Pattern):
                if value.WhichOneof("value") != "string_value" or not expected.search(value.string_value):
                    return False
            elif _typed(value) != expected:
                return False
        return True


def _values(attributes: Any) -> dict[str, Any]:
    return {kv.key: kv.value for kv in attributes}


class _Matcher:
    """One compiled ``include`` or ``exclude`` block, split into resource and item conditions."""

    def __init__(self, match: MetricMatch | LogMatch | SpanMatch) -> None:
        kind = match.match_type
        self.resource_attributes: _Attributes | None = None
        self.services: _Names | None = None
        self.names: _Names | None = None
        self.item_attributes: _Attributes | None = None
        if isinstance(match, MetricMatch):
            resource, names, items = match.resource_attributes, match.metric_names, []
        elif isinstance(match, LogMatch):
            resource, names, items = match.resource_attributes, [], match.record_attributes
        else:
            resource, names, items = match.resources, match.span_names, match.attributes
            if match.services:
                self.services = _Names(kind, match.services)
        if resource:
            self.resource_attributes = _Attributes(kind, resource)
        if names:
            self.names = _Names(kind, names)
        if items:
            self.item_attributes = _Attributes(kind, items)
        self.reads_resource = self.resource_attributes is not None or self.services is not None
        self.reads_items = self.names is not None or self.item_attributes is not None

    def resource_matches(self, values: Mapping[str, Any]) -> bool:
        if self.resource_attributes is not None and not self.resource_attributes(values):
            return False
        if self.services is not None:
            service = values.get(_SERVICE_NAME)
            if service is None or service.WhichOneof("value") != "string_value":
                return False
            return self.services(service.string_value)
        return True

    def item_matches(self, item: Any) -> bool:
        if self.names is not None and not self.names(item.name):
            return False
        return self.item_attributes is None or self.item_attributes(_values(item.attributes))


class FilterProcessor(Processor):
    """Drops metrics, log records or spans: keeps ``include`` matches, then drops ``exclude`` matches."""

    def __init__(self, config: FilterConfig, *, signal: Signal) -> None:
        self.signal = signal
        # Never pass data on unfiltered: what was meant to be dropped would leak.
        self.on_failure = FailurePolicy(config.on_failure)
        self._spec = SIGNALS[signal]
        sections: dict[Signal, MetricFilter | LogFilter | SpanFilter] = {
            Signal.METRICS: config.metrics,
            Signal.LOGS: config.logs,
            Signal.TRACES: config.spans,
        }
        section = sections[signal]
        self._include = _Matcher(section.include) if section.include is not None else None
        self._exclude = _Matcher(section.exclude) if section.exclude is not None else None
        self._reads_resource = any(m is not None and m.reads_resource for m in (self._include, self._exclude))

    async def process(self, batch: Batch) -> Batch | None:
        if self._include is None and self._exclude is None:
            return batch
        if not self._filter(batch):
            return batch
        batch.recount()
        return batch if batch.items else None

    def _item_matchers(self, resource: Any) -> tuple[_Matcher | None, _Matcher | None] | None:
        """Which blocks still need each item's look, or None when the whole resource goes."""
        values = _values(resource.attributes) if self._reads_resource else {}
        include, exclude = self._include, self._exclude
        if include is not None:
            if not include.resource_matches(values):
                return None
            include = include if include.reads_items else None
        if exclude is not None:
            if not exclude.resource_matches(values):
                exclude = None
            elif not exclude.reads_items:
                return None
        return include, exclude

    def _filter(self, batch: Batch) -> bool:
        """Drop what does not pass; True when anything was dropped."""
        spec = self._spec
        changed = False
        entries = getattr(batch.message, spec.resource_field)
        for r in reversed(range(len(entries))):
            entry = entries[r]
            matchers = self._item_matchers(entry.resource)
            if matchers is None:
                if not changed:
                    batch.mutable()
                    changed = True
                del entries[r]
                continue
            include, exclude = matchers
            if include is None and exclude is None:
                continue
            scopes = getattr(entry, spec.scope_field)
            emptied = False
            for s in reversed(range(len(scopes))):
                items = getattr(scopes[s], spec.record_field)
                drop = [
                    i
                    for i, item in enumerate(items)
                    if (include is not None and not include.item_matches(item))
                    or (exclude is not None and exclude.item_matches(item))
                ]
                if not drop:
                    continue
                if not changed:
                    batch.mutable()
                    changed = True
                if len(drop) == len(items):
                    del scopes[s]
                    emptied = True
                else:
                    for i in reversed(drop):
                        del items[i]
            if emptied and not scopes:
                del entries[r]
        return changed


def create(config: FilterConfig, context: ComponentContext, signal: Signal) -> FilterProcessor:
    """Factory hook: one processor per pipeline."""
    del context  # nothing from the service is needed
    return FilterProcessor(config, signal=signal)
