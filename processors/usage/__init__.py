"""``usage``: GPU time, busy and idle time, energy, memory and cost per owner (pod, job) and GPU."""

from gputally.otlp.batch import Signal
from gputally.pipeline.component import Factory

from .config import OwnerRule, PriceRule, SummaryConfig, UsageConfig
from .processor import UsageProcessor, UsageRuntime, create

__all__ = ["OwnerRule", "PriceRule", "SummaryConfig", "UsageConfig", "UsageProcessor", "UsageRuntime", "factory"]

factory: Factory[UsageConfig] = Factory(
    type="usage", config=UsageConfig, create=create, signals=frozenset({Signal.METRICS, Signal.LOGS})
)
"""Registered under the ``gputally.processors`` entry point ``usage``."""
