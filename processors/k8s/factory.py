"""The ``k8s`` factory: what the ``gputally.processors`` entry point ``k8s`` names."""

from __future__ import annotations

from gputally.otlp.batch import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import K8sConfig
from .processor import create

__all__ = ["factory"]

factory: ProcessorFactory[K8sConfig] = ProcessorFactory(
    type_name="k8s", config=K8sConfig, create=create, signals=frozenset(Signal),
    stability={Signal.METRICS: "alpha", Signal.LOGS: "alpha", Signal.TRACES: "alpha"},
    annotates=True,  # adds attributes to resources, nothing else
    mutates_data=False,  # builds a new batch with the attributes added
)
"""Registered under the ``gputally.processors`` entry point ``k8s``."""
