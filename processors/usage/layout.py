"""Where a request's usage numbers sit, found once per request shape and reused.

A probe sends the same request every cycle but for its numbers: in OTLP every data point's
time and value are fixed-width fields (``fixed64``, ``double``, ``sfixed64``), so from one
cycle to the next only those bytes change. A :class:`Layout` is built from one request by
walking its wire format: the offsets of the numbers usage reads, and a *skeleton*: the
request's bytes with every fixed-width number of every data point blanked out. A later
request with the same skeleton (checked exactly: numpy masks and compares all its bytes, eight
at a time) has the same resources, metrics, attributes and encodings, so its numbers are read
straight from their offsets with one ``struct`` call, with no parse at all.

Anything a layout can't prove the same (another length, a new process, a varint that
changed, a field written twice) misses, and the caller reads that request the general way.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint

__all__ = ["Layout", "Malformed", "Skeleton", "Slot", "Wants", "build", "varint", "words"]

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


class Malformed(ValueError):
    """The bytes are not a request this reader can prove a layout for."""


@dataclass(frozen=True, slots=True)
class Slot:
    """One wanted number point: which role it plays, and where its value and time are read."""

    role: str
    scale: float
    rank: int
    value: int
    """Index into the layout's unpacked values."""
    time: int
    """Index into the layout's unpacked times; -1: the point carries no time (0)."""


_WORD = np.dtype("<u8")


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


@dataclass(slots=True)
class Layout:
    """One request shape: its skeleton, and the offsets of the numbers usage reads."""

    skeleton: Skeleton
    values: struct.Struct
    times: struct.Struct
    entries: tuple[tuple[Any, tuple[Slot, ...]], ...]
    """(decision, wanted points) per resource the caller wants, in request order."""
    size: int
    untimed: bool = False
    """Some wanted point carries no time: always read point by point."""
    plan: Any = None
    """What the reader made of ``entries`` when the layout was built, kept with it."""
    hits: int = 0

    def matches(self, raw: bytes) -> bool:
        """Whether ``raw`` has exactly this skeleton (every byte but the blanked numbers)."""
        return len(raw) == self.size and self.skeleton.matches(raw, words(raw))

    def read(self, raw: bytes) -> tuple[tuple[float | int, ...], tuple[int, ...]]:
        """The wanted values and times of a request that :meth:`matches`."""
        return self.values.unpack_from(raw), self.times.unpack_from(raw)

    @property
    def footprint(self) -> int:
        """Bytes held (the skeleton's mask and words dominate)."""
        return 2 * self.size + 64 * sum(len(slots) for _, slots in self.entries) + 512


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


def _fields(buf: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
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


def _once(seen: set[int], number: int) -> None:
    """A singular field written twice is merged or overridden by protobuf: not proven here."""
    if number in seen:
        raise Malformed(f"field {number} written twice")
    seen.add(number)


@dataclass(frozen=True, slots=True)
class Wants:
    """What a layout reads: ``decide`` names each resource (None: not wanted), ``wanted`` gives
    a decision's metric table (name -> role, scale, rank), points of ``tasked`` metrics count
    only when ``general`` says so (given the point's attributes)."""

    decide: Callable[[bytes], object | None]
    wanted: Callable[[object], dict[str, tuple[str, float, int]]]
    tasked: frozenset[str]
    general: Callable[[Any], bool]


class _Builder:
    def __init__(self, raw: bytes, wants: Wants) -> None:
        self.raw = raw
        self.wants = wants
        self.blanks: list[tuple[int, int]] = []
        self.value_format: list[tuple[int, str]] = []
        self.time_offsets: list[int] = []
        self.entries: list[tuple[Any, tuple[Slot, ...]]] = []

    def build(self) -> Layout:
        raw = self.raw
        for number, wire, start, end in _fields(raw, 0, len(raw)):
            if number == _REQUEST_RESOURCE_METRICS:
                self._expect(wire, _LEN)
                self._resource_metrics(start, end)
        return Layout(
            skeleton=Skeleton.of(raw, self.blanks),
            values=_struct(self.value_format),
            times=_struct([(offset, "Q") for offset in self.time_offsets]),
            entries=tuple(self.entries),
            size=len(raw),
            untimed=any(slot.time < 0 for _, slots in self.entries for slot in slots),
        )

    @staticmethod
    def _expect(wire: int, want: int) -> None:
        if wire != want:
            raise Malformed(f"wire type {wire} where {want} belongs")

    def _resource_metrics(self, pos: int, end: int) -> None:
        resource = b""
        seen: set[int] = set()
        scopes: list[tuple[int, int]] = []
        for number, wire, start, stop in _fields(self.raw, pos, end):
            if number == _RM_RESOURCE:
                self._expect(wire, _LEN)
                _once(seen, number)
                resource = self.raw[start:stop]
            elif number == _RM_SCOPE_METRICS:
                self._expect(wire, _LEN)
                scopes.append((start, stop))
        decision = self.wants.decide(resource)
        table = self.wants.wanted(decision) if decision is not None else {}
        slots: list[Slot] = []
        for start, stop in scopes:
            for number, wire, m_start, m_stop in _fields(self.raw, start, stop):
                if number == _SM_METRICS:
                    self._expect(wire, _LEN)
                    self._metric(m_start, m_stop, table, slots)
        if decision is not None:
            self.entries.append((decision, tuple(slots)))

    def _metric(self, pos: int, end: int, table: dict[str, tuple[str, float, int]], slots: list[Slot]) -> None:
        name = ""
        data: tuple[int, int, int] | None = None
        seen: set[int] = set()
        for number, wire, start, stop in _fields(self.raw, pos, end):
            if number == _METRIC_NAME:
                self._expect(wire, _LEN)
                _once(seen, number)
                name = self.raw[start:stop].decode("utf-8", "surrogateescape")
            elif number in (_GAUGE, _SUM, _HISTOGRAM, _EXPONENTIAL_HISTOGRAM, _SUMMARY):
                self._expect(wire, _LEN)
                if data is not None:
                    raise Malformed("a metric with two data fields")
                data = (number, start, stop)
        if data is None:
            return
        kind, start, stop = data
        spec = table.get(name) if kind in (_GAUGE, _SUM) else None
        for number, wire, p_start, p_stop in _fields(self.raw, start, stop):
            if number != _DATA_POINTS:
                continue
            self._expect(wire, _LEN)
            if kind in (_GAUGE, _SUM):
                self._number_point(p_start, p_stop, spec, name in self.wants.tasked, slots)
            elif kind == _SUMMARY:
                self._blank_fixed(p_start, p_stop, nested=_SUMMARY_QUANTILES)
            else:  # histograms: fixed-width fields and packed arrays blanked; varints stay (and miss if they change)
                self._blank_fixed(p_start, p_stop, packed=_HDP_PACKED)

    def _number_point(
        self, pos: int, end: int, spec: tuple[str, float, int] | None, tasked: bool, slots: list[Slot]
    ) -> None:
        seen: set[int] = set()
        time_at = value_at = -1
        value_code = ""
        for number, wire, start, stop in _fields(self.raw, pos, end):
            if number in (_NDP_START, _NDP_TIME, _NDP_DOUBLE, _NDP_INT):
                self._expect(wire, _I64)
                _once(seen, number if number in (_NDP_START, _NDP_TIME) else _NDP_DOUBLE)  # one oneof value
                self.blanks.append((start, stop))
                if number == _NDP_TIME:
                    time_at = start
                elif number != _NDP_START:
                    value_at, value_code = start, ("d" if number == _NDP_DOUBLE else "q")
            elif wire in (_I64, _I32):
                self.blanks.append((start, stop))  # a field newer than this reader: its numbers may change
        if spec is None or value_at < 0:
            return
        if tasked and not self.wants.general(NumberDataPoint.FromString(self.raw[pos:end]).attributes):
            return
        role, scale, rank = spec
        if time_at >= 0:
            self.time_offsets.append(time_at)
        self.value_format.append((value_at, value_code))
        slots.append(Slot(role, scale, rank, len(self.value_format) - 1, len(self.time_offsets) - 1 if time_at >= 0 else -1))

    def _blank_fixed(self, pos: int, end: int, *, packed: frozenset[int] = frozenset(), nested: int = 0) -> None:
        for number, wire, start, stop in _fields(self.raw, pos, end):
            if wire in (_I64, _I32) or (wire == _LEN and number in packed):
                self.blanks.append((start, stop))
            elif wire == _LEN and number == nested:
                self._blank_fixed(start, stop)


def _struct(fields: list[tuple[int, str]]) -> struct.Struct:
    """One little-endian struct reading ``fields`` (offset, code) in offset order, skipping the rest."""
    parts: list[str] = []
    at = 0
    for offset, code in fields:
        if offset < at:
            raise Malformed("overlapping numbers")
        if offset > at:
            parts.append(f"{offset - at}x")
        parts.append(code)
        at = offset + 8
    return struct.Struct("<" + "".join(parts))


def build(raw: bytes, wants: Wants) -> Layout:
    """The layout of ``raw``. Raises :class:`Malformed` where protobuf's own reading could differ."""
    return _Builder(raw, wants).build()
