"""The ``batch`` factory: what the ``gputally.processors`` entry point ``batch`` names."""

from __future__ import annotations

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import BatchConfig
from .processor import create

__all__ = ["factory"]

factory: ProcessorFactory[BatchConfig] = ProcessorFactory(
    type_name="batch", config=BatchConfig, create=create, signals=frozenset(Signal),
    stability={Signal.METRICS: "alpha", Signal.LOGS: "alpha", Signal.TRACES: "alpha"},
    holds_data=True,  # joins requests and releases them on its timer
    mutates_data=False,  # joins received bytes into new batches
)
"""Registered under the ``gputally.processors`` entry point ``batch``."""
