"""OTLP/JSON encoding, which differs from protobuf's canonical JSON in a few ways.

The OTLP specification asks for lowerCamelCase keys, enums as integers, and trace and span
IDs as hex strings (protobuf's JSON would write base64, as it still does for other bytes).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

__all__ = ["decode", "encode"]

# Field names of trace/span IDs anywhere in OTLP (spans, links, log records, exemplars).
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def _hex_ids(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for value in node:
            _hex_ids(value)


def encode(message: Message) -> bytes:
    """The OTLP/JSON encoding of an export request."""
    data = json_format.MessageToDict(message, use_integers_for_enums=True)
    _hex_ids(data)
    return json.dumps(data, separators=(",", ":")).encode()


def decode(body: bytes, message: Message) -> Message:
    """Fill ``message`` (an Export*ServiceResponse) from an OTLP/JSON body; unknown keys are ignored.

    Responses carry no IDs, so protobuf's JSON parser reads them as they are.
    """
    json_format.Parse(body, message, ignore_unknown_fields=True)
    return message
