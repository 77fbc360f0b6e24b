"""The ``otlphttp`` exporter's factory: what the ``gputally.exporters`` entry point ``otlphttp`` names."""

from __future__ import annotations

import os

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ExporterFactory

from .config import OTLPHttpConfig
from .exporter import create_exporter

__all__ = ["factory"]

factory: ExporterFactory[OTLPHttpConfig] = ExporterFactory(
    type_name="otlphttp",
    config=OTLPHttpConfig,
    create=lambda config, context: create_exporter(config, context, environ=os.environ),
    durable=lambda config: config.sending_queue.durable,
    stability={Signal.METRICS: "beta", Signal.LOGS: "beta", Signal.TRACES: "beta"},
)
