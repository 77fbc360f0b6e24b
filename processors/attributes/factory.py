"""The ``attributes`` factory: what the ``gputally.processors`` entry point ``attributes`` names."""

from __future__ import annotations

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import AttributesConfig
from .processor import create

__all__ = ["factory"]

factory: ProcessorFactory[AttributesConfig] = ProcessorFactory(
    type_name="attributes", config=AttributesConfig, create=create, signals=frozenset(Signal),
    stability={Signal.METRICS: "alpha", Signal.LOGS: "alpha", Signal.TRACES: "alpha"},
    annotates=lambda config: all(action.context == "resource" for action in config.actions),  # resources only
    mutates_data=True,  # inserts, updates and deletes attributes in place
)
"""Registered under the ``gputally.processors`` entry point ``attributes``."""
