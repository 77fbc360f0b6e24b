"""The ``debug`` exporter: prints what would be exported."""

from .config import DebugConfig
from .exporter import DebugExporter, create_exporter
from .factory import factory

__all__ = ["DebugConfig", "DebugExporter", "create_exporter", "factory"]
