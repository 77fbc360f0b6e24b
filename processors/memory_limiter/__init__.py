"""``memory_limiter``: refuse data while the process is short of memory (the Collector's memory limiter)."""

from gputally.otlp.batch import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import MemoryLimiterConfig
from .memory import cgroup_limit, total_memory
from .processor import Limits, MemoryLimiter, create

__all__ = ["Limits", "MemoryLimiter", "MemoryLimiterConfig", "cgroup_limit", "factory", "total_memory"]

factory: ProcessorFactory[MemoryLimiterConfig] = ProcessorFactory(
    type_name="memory_limiter", config=MemoryLimiterConfig, create=create, signals=frozenset(Signal),
    mutates_data=False,  # only refuses
)
"""Registered under the ``gputally.processors`` entry point ``memory_limiter``."""
