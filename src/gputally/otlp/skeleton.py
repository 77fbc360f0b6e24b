"""A metrics request's *skeleton*: its bytes with every data point's fixed-width numbers blanked.

A node sends the same request every cycle but for its numbers: in OTLP every data point's
time and value are fixed-width fields (``fixed64``, ``double``, ``sfixed64``), so from one
cycle to the next only those bytes change. Two requests with the same skeleton have the same
resources, metrics, attributes and encodings. Work that depends only on those can be done
once per request shape and reused: the ``usage`` processor reads its numbers at known offsets,
a constant attribute is appended to every point by patching the numbers into a template.

:class:`MetricsWalk` walks a request's wire format once and finds the blanks (proving on the
way that protobuf's own reading could not differ: a field written twice, a group, a bad
length raise :class:`Malformed`); :class:`Skeleton` checks a later request against them,
exactly, every byte but the blanked ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Malformed", "MetricsWalk", "Skeleton", "number_spans", "shape_key", "varint", "words"]

# Field numbers: opentelemetry/proto/collector/metrics/v1/metrics_service.proto and metrics/v1/metrics.proto.
_REQUEST_RESOURCE_METRICS = 1
_RM_RESOURCE, _RM_SCOPE_METRICS = 1, 2
_SM_METRICS = 2
_METRIC_NAME = 1
_GAUGE, _SUM, _HISTOGRAM, _EXPONENTIAL_HISTOGRAM, _SUMMARY = 5, 7, 9, 10, 11
_DATA_POINTS = 1
_NDP_START, _NDP_TIME, _NDP_DOUBLE, _NDP_INT = 2, 3, 4, 6
_HDP_PACKED = frozenset({6, 7})  # bucket_counts (fixed64), explicit_bounds (double): packed, fixed-width
_SUMMARY_QUANTILES = 6

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_WORD = np.dtype("<u8")


class Malformed(ValueError):
    """The bytes are not a request whose skeleton can be proven."""


def varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``buf[pos:end]`` and the position after it."""
    result = shift = 0
    while True:
        if pos >= end:
            raise Malformed("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise Malformed("varint too long")


def fields(buf: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, wire type, value start, value end)`` of each field in ``buf[pos:end]``."""
    while pos < end:
        key, pos = varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Malformed("field number 0")
        if wire == _VARINT:
            start = pos
            _, pos = varint(buf, pos, end)
        elif wire == _I64:
            start, pos = pos, pos + 8
        elif wire == _LEN:
            length, start = varint(buf, pos, end)
            pos = start + length
        elif wire == _I32:
            start, pos = pos, pos + 4
        else:
            raise Malformed(f"wire type {wire}")
        if pos > end:
            raise Malformed("field runs past its message")
        yield number, wire, start, pos


def shape_key(raw: bytes) -> tuple[int, int]:
    """Length and first resource, when the request starts with one (as every encoder writes it):
    no number that changes from cycle to cycle is in it. Requests of one shape share a key."""
    first = b""
    try:
        if raw[:1] == b"\x0a":
            size, pos = varint(raw, 1, len(raw))
            end = min(pos + size, len(raw))  # the first ResourceMetrics: its resource, if it starts with one
            if raw[pos:pos + 1] == b"\x0a" and pos < end:
                length, pos = varint(raw, pos + 1, end)
                first = raw[pos:min(pos + length, end)]
    except Malformed:
        pass
    return len(raw), hash(first)


def words(raw: bytes) -> np.ndarray:
    """``raw``'s whole 8-byte words, without a copy (the bytes left over are a skeleton's tail)."""
    return np.frombuffer(raw, dtype=_WORD, count=len(raw) // 8)


@dataclass(frozen=True, slots=True)
class Skeleton:
    """A request's bytes with its numbers blanked, and the mask that blanks them.

    Checked with numpy, eight bytes per operation: one AND and one compare of all of a
    request's words cost a few microseconds where CPython's own ways (a big integer built from
    the bytes, or a slice per number) cost several times that and allocate as much again.
    """

    mask: np.ndarray
    """All ones but for the blanked bits, over the request's whole words."""
    words: bytes
    """The request's whole words, masked."""
    tail_mask: int
    tail: int
    """The last ``len % 8`` bytes (as an integer), masked."""

    @classmethod
    def of(cls, raw: bytes, blanks: list[tuple[int, int]]) -> Skeleton:
        mask = bytearray(b"\xff" * len(raw))
        for start, end in blanks:
            mask[start:end] = bytes(end - start)
        whole = len(raw) - len(raw) % 8
        word_mask = words(bytes(mask)).copy()
        tail_mask = int.from_bytes(mask[whole:], "little")
        return cls(mask=word_mask, words=np.bitwise_and(words(raw), word_mask).tobytes(),
                   tail_mask=tail_mask, tail=int.from_bytes(raw[whole:], "little") & tail_mask)

    def matches(self, raw: bytes, raw_words: np.ndarray) -> bool:
        """Whether ``raw`` (of the skeleton's length; ``raw_words``: its :func:`words`) has
        exactly these bytes wherever nothing was blanked."""
        return (np.bitwise_and(raw_words, self.mask).tobytes() == self.words
                and int.from_bytes(raw[len(self.words):], "little") & self.tail_mask == self.tail)


def _once(seen: set[int], number: int) -> None:
    """A singular field written twice is merged or overridden by protobuf: not proven here."""
    if number in seen:
        raise Malformed(f"field {number} written twice")
    seen.add(number)


def _expect(wire: int, want: int) -> None:
    if wire != want:
        raise Malformed(f"wire type {wire} where {want} belongs")


class MetricsWalk:
    """One walk over a metrics request's wire format: :attr:`blanks` gets the span of every
    data point's fixed-width numbers. Subclasses hear of each resource (:meth:`resource`,
    whose result comes back with its points) and each gauge or sum point (:meth:`number_point`)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.blanks: list[tuple[int, int]] = []

    def walk(self) -> None:
        raw = self.raw
        for number, wire, start, end in fields(raw, 0, len(raw)):
            if number == _REQUEST_RESOURCE_METRICS:
                _expect(wire, _LEN)
                self._resource_metrics(start, end)

    def resource(self, encoded: bytes) -> Any:
        """Called once per resource, before its points, with its encoding."""
        return None

    def resource_done(self, context: Any) -> None:
        """Called after the resource's points."""

    def number_point(self, context: Any, name: str, pos: int, end: int,
                     time_at: int, value_at: int, value_code: str) -> None:
        """A gauge or sum point at ``raw[pos:end]`` of metric ``name``: where its time and its
        value sit (-1: absent), and its value's ``struct`` code (``d`` or ``q``)."""

    def _resource_metrics(self, pos: int, end: int) -> None:
        encoded = b""
        seen: set[int] = set()
        scopes: list[tuple[int, int]] = []
        for number, wire, start, stop in fields(self.raw, pos, end):
            if number == _RM_RESOURCE:
                _expect(wire, _LEN)
                _once(seen, number)
                encoded = self.raw[start:stop]
            elif number == _RM_SCOPE_METRICS:
                _expect(wire, _LEN)
                scopes.append((start, stop))
        context = self.resource(encoded)
        for start, stop in scopes:
            for number, wire, m_start, m_stop in fields(self.raw, start, stop):
                if number == _SM_METRICS:
                    _expect(wire, _LEN)
                    self._metric(m_start, m_stop, context)
        self.resource_done(context)

    def _metric(self, pos: int, end: int, context: Any) -> None:
        name = ""
        data: tuple[int, int, int] | None = None
        seen: set[int] = set()
        for number, wire, start, stop in fields(self.raw, pos, end):
            if number == _METRIC_NAME:
                _expect(wire, _LEN)
                _once(seen, number)
                name = self.raw[start:stop].decode("utf-8", "surrogateescape")
            elif number in (_GAUGE, _SUM, _HISTOGRAM, _EXPONENTIAL_HISTOGRAM, _SUMMARY):
                _expect(wire, _LEN)
                if data is not None:
                    raise Malformed("a metric with two data fields")
                data = (number, start, stop)
        if data is None:
            return
        kind, start, stop = data
        for number, wire, p_start, p_stop in fields(self.raw, start, stop):
            if number != _DATA_POINTS:
                continue
            _expect(wire, _LEN)
            if kind in (_GAUGE, _SUM):
                self._number_point(p_start, p_stop, name, context)
            elif kind == _SUMMARY:
                self._blank_fixed(p_start, p_stop, nested=_SUMMARY_QUANTILES)
            else:  # histograms: fixed-width fields and packed arrays blanked; varints stay (and miss if they change)
                self._blank_fixed(p_start, p_stop, packed=_HDP_PACKED)

    def _number_point(self, pos: int, end: int, name: str, context: Any) -> None:
        seen: set[int] = set()
        time_at = value_at = -1
        value_code = ""
        for number, wire, start, stop in fields(self.raw, pos, end):
            if number in (_NDP_START, _NDP_TIME, _NDP_DOUBLE, _NDP_INT):
                _expect(wire, _I64)
                _once(seen, number if number in (_NDP_START, _NDP_TIME) else _NDP_DOUBLE)  # one oneof value
                self.blanks.append((start, stop))
                if number == _NDP_TIME:
                    time_at = start
                elif number != _NDP_START:
                    value_at, value_code = start, ("d" if number == _NDP_DOUBLE else "q")
            elif wire in (_I64, _I32):
                self.blanks.append((start, stop))  # a field newer than this reader: its numbers may change
        self.number_point(context, name, pos, end, time_at, value_at, value_code)

    def _blank_fixed(self, pos: int, end: int, *, packed: frozenset[int] = frozenset(), nested: int = 0) -> None:
        for number, wire, start, stop in fields(self.raw, pos, end):
            if wire in (_I64, _I32) or (wire == _LEN and number in packed):
                self.blanks.append((start, stop))
            elif wire == _LEN and number == nested:
                self._blank_fixed(start, stop)


def number_spans(raw: bytes) -> list[tuple[int, int]]:
    """Where every data point's fixed-width numbers sit in ``raw`` (a plain walk's blanks);
    raises :class:`Malformed` as the walk does."""
    walk = MetricsWalk(raw)
    walk.walk()
    return walk.blanks
