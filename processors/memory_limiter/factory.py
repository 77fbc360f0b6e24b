"""The ``memory_limiter`` factory: what the ``gputally.processors`` entry point ``memory_limiter`` names."""

from __future__ import annotations

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import MemoryLimiterConfig
from .processor import create

__all__ = ["factory"]

factory: ProcessorFactory[MemoryLimiterConfig] = ProcessorFactory(
    type_name="memory_limiter", config=MemoryLimiterConfig, create=create, signals=frozenset(Signal),
    stability={Signal.METRICS: "alpha", Signal.LOGS: "alpha", Signal.TRACES: "alpha"},
    annotates=True,  # changes nothing: a bridge may answer with a patch
    mutates_data=False,  # only refuses
)
"""Registered under the ``gputally.processors`` entry point ``memory_limiter``."""
