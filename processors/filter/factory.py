"""The ``filter`` factory: what the ``gputally.processors`` entry point ``filter`` names."""

from __future__ import annotations

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import FilterConfig
from .processor import create

__all__ = ["factory"]

factory: ProcessorFactory[FilterConfig] = ProcessorFactory(
    type_name="filter", config=FilterConfig, create=create, signals=frozenset(Signal),
    stability={Signal.METRICS: "alpha", Signal.LOGS: "alpha", Signal.TRACES: "alpha"},
    mutates_data=True,  # removes items in place
)
"""Registered under the ``gputally.processors`` entry point ``filter``."""
