"""``memory_limiter``: refuse data while the process is short of memory (the Collector's memory limiter)."""

from gputally.otlp.batch import Signal
from gputally.pipeline.component import Factory

from .config import MemoryLimiterConfig
from .memory import cgroup_limit, total_memory
from .processor import Limits, MemoryLimiter, create

__all__ = ["Limits", "MemoryLimiter", "MemoryLimiterConfig", "cgroup_limit", "factory", "total_memory"]

factory: Factory[MemoryLimiterConfig] = Factory(
    type="memory_limiter", config=MemoryLimiterConfig, create=create, signals=frozenset(Signal)
)
"""Registered under the ``gputally.processors`` entry point ``memory_limiter``."""
