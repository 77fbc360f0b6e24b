"""OTLP/JSON (receiver requests, otlphttp exporter bodies): protobuf JSON with OTLP's differences.

OTLP/JSON differs from protobuf's canonical JSON in that ``traceId``, ``spanId`` and
``parentSpanId`` are hex strings (not base64), and enums are written as integers. Receivers
must ignore unknown fields. This module converts the ID fields around
``google.protobuf.json_format`` so the rest of gputally only ever sees protobuf messages.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

from gputally.errors import InvalidRequest

__all__ = ["decode", "encode"]

# Both spellings: json_format accepts the proto field names as well as lowerCamelCase.
M = TypeVar("M", bound=Message)

_ID_SIZES = {
    "traceId": 16,
    "trace_id": 16,
    "spanId": 8,
    "span_id": 8,
    "parentSpanId": 8,
    "parent_span_id": 8,
}


def decode(body: bytes, message: M) -> M:
    """Fill ``message`` from an OTLP/JSON body; anything undecodable raises InvalidRequest."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"request body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("an OTLP/JSON request must be a JSON object")
    _convert_ids(data, _hex_to_base64)
    try:
        json_format.ParseDict(data, message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise InvalidRequest(f"invalid OTLP/JSON: {exc}") from exc
    return message


def encode(message: Message) -> bytes:
    """The OTLP/JSON encoding of ``message``: lowerCamelCase keys, integer enums, hex IDs."""
    data = json_format.MessageToDict(message, use_integers_for_enums=True)
    _convert_ids(data, _base64_to_hex)
    return json.dumps(data, separators=(",", ":")).encode()


def _convert_ids(node: Any, convert: Callable[[str, str], str]) -> None:
    """Rewrite every ID field in place, wherever it sits in the request.

    Walking everything (rather than listing the paths to spans, links, log records and
    exemplars) is safe because OTLP has no map fields: every JSON object key is a field name,
    and user-chosen names such as attribute keys are values (``{"key": "traceId", ...}``).
    The one cost: an ID-named key inside an unknown field is checked as hex too.
    """
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str):
                if key in _ID_SIZES:
                    node[key] = convert(key, value)
            elif isinstance(value, (dict, list)):
                _convert_ids(value, convert)
    elif isinstance(node, list):
        for item in node:
            if isinstance(item, (dict, list)):
                _convert_ids(item, convert)


def _hex_to_base64(key: str, value: str) -> str:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise InvalidRequest(f"{key}: {value!r} is not a hex string") from None
    if raw and len(raw) != _ID_SIZES[key]:
        raise InvalidRequest(f"{key}: {value!r} is not {_ID_SIZES[key]} bytes of hex")
    return base64.b64encode(raw).decode()


def _base64_to_hex(key: str, value: str) -> str:
    return base64.b64decode(value).hex()
