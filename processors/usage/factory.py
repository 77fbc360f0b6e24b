"""The ``usage`` factory: what the ``gputally.processors`` entry point ``usage`` names."""

from __future__ import annotations

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import UsageConfig
from .processor import create

__all__ = ["factory"]

factory: ProcessorFactory[UsageConfig] = ProcessorFactory(
    type_name="usage", config=UsageConfig, create=create, signals=frozenset({Signal.METRICS, Signal.LOGS}),
    stability={Signal.METRICS: "alpha", Signal.LOGS: "alpha"},
    annotates=True,  # changes nothing in the batch: a bridge may answer with a patch
    mutates_data=False,  # only reads what it counts
)
"""Registered under the ``gputally.processors`` entry point ``usage``."""
