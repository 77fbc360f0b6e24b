"""``dcgm``: one resource per GPU for metrics scraped from NVIDIA's dcgm-exporter."""

from gputally.otlp.batch import Signal
from gputally.pipeline.component import Factory

from .config import DcgmConfig, LabelsConfig
from .processor import DcgmProcessor, create

__all__ = ["DcgmConfig", "DcgmProcessor", "LabelsConfig", "factory"]

factory: Factory[DcgmConfig] = Factory(
    type="dcgm", config=DcgmConfig, create=create, signals=frozenset({Signal.METRICS})
)
"""Registered under the ``gputally.processors`` entry point ``dcgm``."""
