"""``filter``: drop metrics, log records or spans by name or attribute (the Collector's legacy filter)."""

from gputally.otlp.batch import Signal
from gputally.pipeline.component import Factory

from .config import (
    AttributeMatch,
    FilterConfig,
    LogFilter,
    LogMatch,
    MetricFilter,
    MetricMatch,
    SpanFilter,
    SpanMatch,
)
from .processor import FilterProcessor, create

__all__ = [
    "AttributeMatch",
    "FilterConfig",
    "FilterProcessor",
    "LogFilter",
    "LogMatch",
    "MetricFilter",
    "MetricMatch",
    "SpanFilter",
    "SpanMatch",
    "factory",
]

factory: Factory[FilterConfig] = Factory(type="filter", config=FilterConfig, create=create, signals=frozenset(Signal))
"""Registered under the ``gputally.processors`` entry point ``filter``."""
