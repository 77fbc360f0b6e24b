"""``filter``: drop metrics, log records or spans by name or attribute (the Collector's legacy filter)."""

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
from .factory import factory
from .processor import FilterProcessor

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
