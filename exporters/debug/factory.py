"""The ``debug`` exporter's factory: what the ``gputally.exporters`` entry point ``debug`` names."""

from __future__ import annotations

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ExporterFactory

from .config import DebugConfig
from .exporter import create_exporter

__all__ = ["factory"]

factory: ExporterFactory[DebugConfig] = ExporterFactory(
    type_name="debug",
    config=DebugConfig,
    create=lambda config, context: create_exporter(config, context),
    stability={Signal.METRICS: "beta", Signal.LOGS: "beta", Signal.TRACES: "beta"},
)
