"""``dcgm``: one resource per GPU for metrics scraped from NVIDIA's dcgm-exporter."""

from gputally.otlp.batch import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import DcgmConfig, LabelsConfig
from .processor import DcgmProcessor, create

__all__ = ["DcgmConfig", "DcgmProcessor", "LabelsConfig", "factory"]

factory: ProcessorFactory[DcgmConfig] = ProcessorFactory(
    type_name="dcgm", config=DcgmConfig, create=create, signals=frozenset({Signal.METRICS}),
    mutates_data=True,  # moves points between resources in place
)
"""Registered under the ``gputally.processors`` entry point ``dcgm``."""
