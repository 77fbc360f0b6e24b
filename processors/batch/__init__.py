"""``batch``: join requests into fewer, larger ones by size or time (the Collector's batch processor)."""

from .config import BatchConfig
from .factory import factory
from .processor import BatchProcessor

__all__ = ["BatchConfig", "BatchProcessor", "factory"]
