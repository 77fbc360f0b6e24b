"""The ``bridge`` receiver's factory: what the ``gputally.receivers`` entry point ``bridge`` names."""

from __future__ import annotations

from gputally.otlp.signals import Signal
from gputally.pipeline.factory import ReceiverFactory

from .config import BridgeReceiverConfig
from .receiver import create

__all__ = ["factory"]

factory: ReceiverFactory[BridgeReceiverConfig] = ReceiverFactory(
    type_name="bridge", config=BridgeReceiverConfig, create=create,
    stability={Signal.METRICS: "alpha", Signal.LOGS: "alpha", Signal.TRACES: "alpha"},
    inline=True,  # answers each call with its pipeline's output
)
"""Registered under the ``gputally.receivers`` entry point ``bridge``."""
