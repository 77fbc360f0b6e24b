"""``attributes``: insert, update, upsert or delete resource or item attributes."""

from gputally.otlp.batch import Signal
from gputally.pipeline.component import Factory

from .config import ActionConfig, AttributesConfig, AttributeValue
from .processor import AttributesProcessor, create

__all__ = ["ActionConfig", "AttributeValue", "AttributesConfig", "AttributesProcessor", "factory"]

factory: Factory[AttributesConfig] = Factory(
    type="attributes", config=AttributesConfig, create=create, signals=frozenset(Signal)
)
"""Registered under the ``gputally.processors`` entry point ``attributes``."""
