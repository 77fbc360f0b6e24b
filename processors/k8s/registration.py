"""The ``k8s`` factory: what the ``gputally.processors`` entry point ``k8s`` names."""

from __future__ import annotations

from gputally.otlp.batch import Signal
from gputally.pipeline.component import Factory

from .config import K8sConfig
from .processor import create

__all__ = ["factory"]

factory: Factory[K8sConfig] = Factory(type="k8s", config=K8sConfig, create=create, signals=frozenset(Signal))
"""Registered under the ``gputally.processors`` entry point ``k8s``."""
