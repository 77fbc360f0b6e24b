"""``memory_limiter``: refuse data while the process is short of memory (the Collector's memory limiter)."""

from .config import MemoryLimiterConfig
from .factory import factory
from .memory import cgroup_limit, total_memory
from .processor import Limits, MemoryLimiter

__all__ = ["Limits", "MemoryLimiter", "MemoryLimiterConfig", "cgroup_limit", "factory", "total_memory"]
