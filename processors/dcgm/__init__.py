"""``dcgm``: one resource per GPU for metrics scraped from NVIDIA's dcgm-exporter."""

from .config import DcgmConfig, LabelsConfig
from .factory import factory
from .processor import DcgmProcessor

__all__ = ["DcgmConfig", "DcgmProcessor", "LabelsConfig", "factory"]
