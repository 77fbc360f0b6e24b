"""``batch``: join requests into fewer, larger ones by size or time (the Collector's batch processor)."""

from gputally.otlp.batch import Signal
from gputally.pipeline.component import Factory

from .config import BatchConfig
from .processor import BatchProcessor, create

__all__ = ["BatchConfig", "BatchProcessor", "factory"]

factory: Factory[BatchConfig] = Factory(type="batch", config=BatchConfig, create=create, signals=frozenset(Signal))
"""Registered under the ``gputally.processors`` entry point ``batch``."""
