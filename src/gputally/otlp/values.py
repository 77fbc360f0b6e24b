"""Python values -> OTLP ``AnyValue`` and attribute lists (the one converter probes and processors share)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["set_any_value", "set_attributes"]

_INT64_MAX = 2**63 - 1


def set_any_value(target: AnyValue, value: Any) -> None:
    """Fill ``target`` from a str, bool, int, float, mapping (kvlist) or list/tuple (array).
    ``None`` leaves it empty; an int beyond int64 becomes a double; anything else its ``str``."""
    if value is None:
        return
    if isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        if -_INT64_MAX - 1 <= value <= _INT64_MAX:
            target.int_value = value
        else:
            target.double_value = float(value)
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, Mapping):
        target.kvlist_value.SetInParent()
        for key, item in value.items():
            kv = target.kvlist_value.values.add()
            kv.key = str(key)
            set_any_value(kv.value, item)
    elif isinstance(value, list | tuple):
        target.array_value.SetInParent()
        for item in value:
            set_any_value(target.array_value.values.add(), item)
    else:
        target.string_value = str(value)


def set_attributes(target: Any, attributes: Iterable[tuple[str, Any]]) -> None:
    """Append ``(key, value)`` pairs to a repeated ``KeyValue`` field."""
    for key, value in attributes:
        kv = target.add()
        kv.key = key
        set_any_value(kv.value, value)
