"""``usage``: GPU time, busy and idle time, energy, memory and cost per owner (pod, job) and GPU."""

from gputally.otlp.batch import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import OwnerRule, PriceRule, SummaryConfig, UsageConfig
from .processor import UsageProcessor, UsageRuntime, create

__all__ = ["OwnerRule", "PriceRule", "SummaryConfig", "UsageConfig", "UsageProcessor", "UsageRuntime", "factory"]

factory: ProcessorFactory[UsageConfig] = ProcessorFactory(
    type_name="usage", config=UsageConfig, create=create, signals=frozenset({Signal.METRICS, Signal.LOGS}),
    mutates_data=False,  # only reads what it counts
)
"""Registered under the ``gputally.processors`` entry point ``usage``."""
