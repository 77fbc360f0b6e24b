"""Protobuf wire-format pieces for code that edits encodings without decoding them."""

from __future__ import annotations

__all__ = ["encode_varint"]


def encode_varint(n: int) -> bytes:
    """Base-128 varint of a non-negative int (a length prefix or a tag)."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
