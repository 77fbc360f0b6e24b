"""``batch``: join requests into fewer, larger ones by size or time (the Collector's batch processor)."""

from gputally.otlp.batch import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import BatchConfig
from .processor import BatchProcessor, create

__all__ = ["BatchConfig", "BatchProcessor", "factory"]

factory: ProcessorFactory[BatchConfig] = ProcessorFactory(
    type_name="batch", config=BatchConfig, create=create, signals=frozenset(Signal),
    mutates_data=False,  # joins received bytes into new batches
)
"""Registered under the ``gputally.processors`` entry point ``batch``."""
