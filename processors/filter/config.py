"""Config of the ``filter`` processor, shaped like the Collector's legacy (non-OTTL) filter.

Each signal has an optional ``include`` and ``exclude`` block. Within one block every
property that is set must match (names match when any listed name does; attribute lists
match when all listed attributes do). ``match_type: regexp`` patterns use Python's ``re``
with search semantics, as the Collector's unanchored RE2 match: write ``^...$`` to anchor.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gputally.config.types import Strict

__all__ = [
    "AttributeMatch",
    "FilterConfig",
    "LogFilter",
    "LogMatch",
    "MatchType",
    "MetricFilter",
    "MetricMatch",
    "SpanFilter",
    "SpanMatch",
]

MatchType = Literal["strict", "regexp"]
AttributeValue = StrictStr | StrictBool | StrictInt | StrictFloat


class AttributeMatch(Strict):
    """One attribute condition: ``{key, value}``."""

    key: str = Field(min_length=1)
    """Attribute key; it must be present."""
    value: AttributeValue | None = None
    """strict: the value, of the same type (``1`` does not match ``1.0`` or ``"1"``);
    regexp: a pattern searched in string values (other types never match).
    Omitted: any value matches."""


def _check_patterns(values: list[str], info: ValidationInfo) -> list[str]:
    if info.data.get("match_type") == "regexp":
        _compile_all(values)
    return values


def _compile_all(patterns: list[str]) -> None:
    problems = []
    for index, pattern in enumerate(patterns):
        try:
            re.compile(pattern)
        except re.error as exc:
            problems.append(f"[{index}] {pattern!r}: {exc}")
    if problems:
        raise ValueError("invalid regular expression " + "; ".join(problems))


def _check_attributes(values: list[AttributeMatch], info: ValidationInfo) -> list[AttributeMatch]:
    if info.data.get("match_type") == "regexp":
        bad = [i for i, a in enumerate(values) if a.value is not None and not isinstance(a.value, str)]
        if bad:
            raise ValueError(f"with match_type regexp, values must be strings (pattern); not at {bad}")
        _compile_all([a.value for a in values if isinstance(a.value, str)])
    return values


class _Match(Strict):
    match_type: MatchType
    """``strict`` (equality) or ``regexp``."""

    @model_validator(mode="after")
    def _not_empty(self) -> _Match:
        names = [name for name in type(self).model_fields if name != "match_type"]
        if not any(getattr(self, name) for name in names):
            raise ValueError(f"set at least one of {', '.join(names)}")
        return self


class MetricMatch(_Match):
    """Metric properties; a metric matches when all properties that are set match."""

    metric_names: list[str] = Field(default_factory=list)
    """Metric names (or patterns); any one matching is enough."""
    resource_attributes: list[AttributeMatch] = Field(default_factory=list)
    """Attributes the metric's resource must all have."""

    _names = field_validator("metric_names")(_check_patterns)
    _resource = field_validator("resource_attributes")(_check_attributes)


class LogMatch(_Match):
    """Log record properties; a record matches when all properties that are set match."""

    resource_attributes: list[AttributeMatch] = Field(default_factory=list)
    """Attributes the record's resource must all have."""
    record_attributes: list[AttributeMatch] = Field(default_factory=list)
    """Attributes the log record must all have."""

    _resource = field_validator("resource_attributes")(_check_attributes)
    _record = field_validator("record_attributes")(_check_attributes)


class SpanMatch(_Match):
    """Span properties; a span matches when all properties that are set match."""

    services: list[str] = Field(default_factory=list)
    """Values of the resource attribute ``service.name``; any one matching is enough."""
    span_names: list[str] = Field(default_factory=list)
    """Span names (or patterns); any one matching is enough."""
    attributes: list[AttributeMatch] = Field(default_factory=list)
    """Attributes the span must all have."""
    resources: list[AttributeMatch] = Field(default_factory=list)
    """Attributes the span's resource must all have."""

    _services = field_validator("services")(_check_patterns)
    _names = field_validator("span_names")(_check_patterns)
    _attributes = field_validator("attributes")(_check_attributes)
    _resources = field_validator("resources")(_check_attributes)


class MetricFilter(Strict):
    """``metrics:``: keep only ``include`` matches (when set), then drop ``exclude`` matches."""

    include: MetricMatch | None = None
    exclude: MetricMatch | None = None


class LogFilter(Strict):
    """``logs:``: keep only ``include`` matches (when set), then drop ``exclude`` matches."""

    include: LogMatch | None = None
    exclude: LogMatch | None = None


class SpanFilter(Strict):
    """``spans:``: keep only ``include`` matches (when set), then drop ``exclude`` matches."""

    include: SpanMatch | None = None
    exclude: SpanMatch | None = None


class FilterConfig(Strict):
    """``processors: filter:``. A signal without a section passes unchanged."""

    metrics: MetricFilter = MetricFilter()
    """Filters metrics (whole metrics, with all their data points)."""
    logs: LogFilter = LogFilter()
    """Filters log records."""
    spans: SpanFilter = SpanFilter()
    """Filters spans."""
    on_failure: Literal["refuse", "drop"] = "refuse"
    """When the filter itself fails on a batch (a bug): ``refuse`` answers the sender with an
    internal error (HTTP 500, gRPC INTERNAL; not retried), ``drop`` drops the batch and
    acknowledges it. Either way nothing that was meant to be filtered is passed on, and the
    items are counted in ``gputally_processor_failed_items_total``."""
