"""The ``slurm`` factory: what the ``gputally.processors`` entry point ``slurm`` names."""

from __future__ import annotations

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import SlurmConfig
from .processor import create

__all__ = ["factory"]

factory: ProcessorFactory[SlurmConfig] = ProcessorFactory(
    type_name="slurm", config=SlurmConfig, create=create, signals=frozenset(Signal),
    stability={Signal.METRICS: "alpha", Signal.LOGS: "alpha", Signal.TRACES: "alpha"},
    annotates=True,  # adds attributes to resources, nothing else
    mutates_data=True,  # adds attributes in place
)
"""Registered under the ``gputally.processors`` entry point ``slurm``."""
