"""``usage``: GPU time, busy and idle time, energy, memory and cost per owner (pod, job) and GPU."""

from .config import OwnerRule, PriceRule, SummaryConfig, UsageConfig
from .factory import factory
from .processor import UsageProcessor, UsageRuntime

__all__ = ["OwnerRule", "PriceRule", "SummaryConfig", "UsageConfig", "UsageProcessor", "UsageRuntime", "factory"]
