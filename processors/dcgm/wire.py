"""A data point's encoding, cut into its attribute entries and everything else.

Points of one GPU carry the same labels metric after metric, so what to do with a point is
decided once per distinct attribute encoding (a dict lookup after that) and the point is
rebuilt from bytes: its other fields as they were, then the attribute entries that stay.
Touching each attribute from Python instead costs several microseconds per point.
"""

from __future__ import annotations

from typing import Any

from gputally.otlp.wire import encode_varint

__all__ = ["attributes_tag", "split_attributes"]


def attributes_tag(point_class: type[Any]) -> int:
    """The tag (field number and wire type 2) of ``attributes`` in ``point_class``'s encoding."""
    number = point_class.DESCRIPTOR.fields_by_name["attributes"].number
    tag = (number << 3) | 2
    assert len(encode_varint(tag)) == 1, "attributes is a low-numbered field in every OTLP point"
    return tag


def split_attributes(raw: bytes, tag: int) -> tuple[list[bytes], list[bytes]]:
    """(the other fields, the attribute entries) of an encoded point, each field whole, in order.

    ``raw`` comes from ``SerializeToString`` of a parsed message, so it is well formed; a
    truncated field would raise ``IndexError``.
    """
    rest: list[bytes] = []
    entries: list[bytes] = []
    i, end = 0, len(raw)
    while i < end:
        start = i
        key = raw[i]
        i += 1
        if key & 0x80:  # a field number above 15: a multi-byte tag (never attributes)
            key, i = _rest_of_varint(raw, i, key)
        wire_type = key & 7
        if wire_type == 2:
            length = raw[i]
            i += 1
            if length & 0x80:
                length, i = _rest_of_varint(raw, i, length)
            i += length
        elif wire_type == 1:
            i += 8
        elif wire_type == 5:
            i += 4
        elif wire_type == 0:
            while raw[i] & 0x80:
                i += 1
            i += 1
        else:
            raise ValueError(f"unexpected wire type {wire_type} in a data point")
        if i > end:
            raise IndexError("truncated field in a data point")
        (entries if key == tag else rest).append(raw[start:i])
    return rest, entries


def _rest_of_varint(raw: bytes, i: int, first: int) -> tuple[int, int]:
    """(the value, the index after it) of a varint whose ``first`` byte, read already, had the
    continuation bit set; the one-byte case stays inline in the loop above."""
    value, shift = first & 0x7F, 7
    while True:
        byte = raw[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i
