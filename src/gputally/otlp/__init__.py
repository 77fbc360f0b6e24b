"""OTLP message helpers: the batch that flows through pipelines, the per-signal table, and cheap point counting."""

from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal, SignalSpec

__all__ = ["SIGNALS", "Batch", "Signal", "SignalSpec"]
