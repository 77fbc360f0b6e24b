"""The ``otlp`` receiver's factory: what the ``gputally.receivers`` entry point ``otlp`` names."""

from __future__ import annotations

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ReceiverFactory

from .config import OTLPReceiverConfig
from .receiver import create

__all__ = ["factory"]

factory: ReceiverFactory[OTLPReceiverConfig] = ReceiverFactory(
    type_name="otlp", config=OTLPReceiverConfig, create=create,
    stability={Signal.METRICS: "beta", Signal.LOGS: "beta", Signal.TRACES: "beta"},
)
"""Registered under the ``gputally.receivers`` entry point ``otlp``."""
