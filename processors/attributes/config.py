"""Config of the ``attributes`` processor: insert, update, upsert or delete attributes.

Keys follow the OpenTelemetry Collector's attributes processor (``actions`` with ``key``,
``value``, ``from_attribute``, ``action``); ``context`` picks the attribute set, so one
processor also does what the Collector's resource processor does.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator, model_validator

from gputally.config.types import Strict

__all__ = ["ActionConfig", "AttributeValue", "AttributesConfig"]

AttributeValue = StrictStr | StrictBool | StrictInt | StrictFloat
"""A literal attribute value; maps to OTLP AnyValue string, bool, int (int64) or double."""

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class ActionConfig(Strict):
    """One entry of ``actions``. Entries run in the order written."""

    key: str = Field(min_length=1)
    """The attribute to change."""
    action: Literal["insert", "update", "upsert", "delete"]
    """``insert`` sets the key only where it is absent, ``update`` only where it is present,
    ``upsert`` sets it everywhere, ``delete`` removes it."""
    value: AttributeValue | None = None
    """Value to set: a string, integer, float or boolean. Not together with ``from_attribute``."""
    from_attribute: str | None = Field(default=None, min_length=1)
    """Copy the value of this attribute of the same item instead; items without it are left alone."""
    context: Literal["point", "resource"] = "point"
    """``point``: data point, log record or span attributes (as the Collector's attributes
    processor); ``resource``: resource attributes (as the Collector's resource processor)."""

    @field_validator("value")
    @classmethod
    def _int64(cls, value: AttributeValue | None) -> AttributeValue | None:
        if isinstance(value, int) and not isinstance(value, bool) and not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError("integer values must fit in a signed 64-bit integer (OTLP int_value)")
        return value

    @model_validator(mode="after")
    def _source(self) -> ActionConfig:
        has_value, has_source = self.value is not None, self.from_attribute is not None
        if self.action == "delete":
            if has_value or has_source:
                raise ValueError("action 'delete' takes neither 'value' nor 'from_attribute'")
        elif has_value == has_source:
            raise ValueError(
                f"action {self.action!r} needs exactly one of 'value' and 'from_attribute'"
                + (" (both are set)" if has_value else "")
            )
        return self


class AttributesConfig(Strict):
    """``processors: attributes:``."""

    actions: list[ActionConfig] = Field(min_length=1)
    """What to do, in order. At least one action."""
