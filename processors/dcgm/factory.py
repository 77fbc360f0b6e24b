"""The ``dcgm`` factory: what the ``gputally.processors`` entry point ``dcgm`` names."""

from __future__ import annotations

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import DcgmConfig
from .processor import create

__all__ = ["factory"]

factory: ProcessorFactory[DcgmConfig] = ProcessorFactory(
    type_name="dcgm", config=DcgmConfig, create=create, signals=frozenset({Signal.METRICS}),
    stability={Signal.METRICS: "alpha"},
    mutates_data=True,  # moves points between resources in place
)
"""Registered under the ``gputally.processors`` entry point ``dcgm``."""
