"""``filter``: drop metrics, log records or spans by name or attribute (the Collector's legacy filter)."""

from gputally.otlp.batch import Signal
from gputally.pipeline.factory import ProcessorFactory

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

factory: ProcessorFactory[FilterConfig] = ProcessorFactory(
    type_name="filter", config=FilterConfig, create=create, signals=frozenset(Signal),
    mutates_data=True,  # removes items in place
)
"""Registered under the ``gputally.processors`` entry point ``filter``."""
