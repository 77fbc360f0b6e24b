"""``attributes``: insert, update, upsert or delete resource or item attributes."""

from .config import ActionConfig, AttributesConfig, AttributeValue
from .factory import factory
from .processor import AttributesProcessor

__all__ = ["ActionConfig", "AttributeValue", "AttributesConfig", "AttributesProcessor", "factory"]
