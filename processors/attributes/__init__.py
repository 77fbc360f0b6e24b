"""``attributes``: insert, update, upsert or delete resource or item attributes."""

from gputally.otlp.batch import Signal
from gputally.pipeline.factory import ProcessorFactory

from .config import ActionConfig, AttributesConfig, AttributeValue
from .processor import AttributesProcessor, create

__all__ = ["ActionConfig", "AttributeValue", "AttributesConfig", "AttributesProcessor", "factory"]

factory: ProcessorFactory[AttributesConfig] = ProcessorFactory(
    type_name="attributes", config=AttributesConfig, create=create, signals=frozenset(Signal),
    mutates_data=True,  # inserts, updates and deletes attributes in place
)
"""Registered under the ``gputally.processors`` entry point ``attributes``."""
