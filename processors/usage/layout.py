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
The walk, the skeleton and the cache of shapes are :mod:`gputally.otlp.skeleton` and
:mod:`gputally.otlp.shapes`; this module adds what usage reads on the walk.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint

from gputally.otlp.skeleton import Malformed, MetricsWalk, Skeleton, fields, words

__all__ = ["Layout", "Malformed", "Slot", "Wants", "build"]


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
    start: int = -1
    """Index into the layout's unpacked start times (a tagged point's); -1: none read (0)."""
    tag: Any = None
    """What ``Wants.tagged`` made of the point (its series), for an engine's counter point."""


@dataclass(slots=True)
class Layout:
    """One request shape: its skeleton, and the offsets of the numbers usage reads."""

    skeleton: Skeleton
    values: struct.Struct
    times: struct.Struct
    entries: tuple[tuple[Any, tuple[Slot, ...]], ...]
    """(decision, wanted points) per resource the caller wants, in request order."""
    size: int
    starts: struct.Struct = struct.Struct("<")
    """The start times of tagged points (kept apart: a request's point times stay one time)."""
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

    def read_starts(self, raw: bytes) -> tuple[int, ...]:
        """The start times of the tagged points of a request that :meth:`matches`."""
        return self.starts.unpack_from(raw)

    @property
    def footprint(self) -> int:
        """Bytes held (the skeleton's mask and words dominate)."""
        return 2 * self.size + 64 * sum(len(slots) for _, slots in self.entries) + 512


@dataclass(frozen=True, slots=True)
class Wants:
    """What a layout reads: ``decide`` names each resource (None: not wanted), ``wanted`` gives
    a decision's metric table (name -> role, scale, rank), points of ``tasked`` metrics count
    only when ``general`` says so (given the point's attributes); ``tagged`` (decision, metric
    name, the point's bytes) names the series of a point whose start time is read too (an
    engine's counters), None for the others."""

    decide: Callable[[bytes], object | None]
    wanted: Callable[[object], dict[str, tuple[str, float, int]]]
    tasked: frozenset[str]
    general: Callable[[Any], bool]
    tagged: Callable[[object, str, bytes], Any] | None = None


class _Builder(MetricsWalk):
    """The walk, and what usage wants of each resource's points on the way."""

    def __init__(self, raw: bytes, wants: Wants) -> None:
        super().__init__(raw)
        self.wants = wants
        self.value_format: list[tuple[int, str]] = []
        self.time_offsets: list[int] = []
        self.start_offsets: list[int] = []
        self.entries: list[tuple[Any, tuple[Slot, ...]]] = []

    def build(self) -> Layout:
        self.walk()
        return Layout(
            skeleton=Skeleton.of(self.raw, self.blanks),
            values=_struct(self.value_format),
            times=_struct([(offset, "Q") for offset in self.time_offsets]),
            entries=tuple(self.entries),
            size=len(self.raw),
            starts=_struct([(offset, "Q") for offset in self.start_offsets]),
            untimed=any(slot.time < 0 for _, slots in self.entries for slot in slots),
        )

    def resource(self, encoded: bytes) -> Any:
        decision = self.wants.decide(encoded)
        return decision, self.wants.wanted(decision) if decision is not None else {}, []

    def resource_done(self, context: Any) -> None:
        decision, _, slots = context
        if decision is not None:
            self.entries.append((decision, tuple(slots)))

    def number_point(self, context: Any, name: str, pos: int, end: int,
                     time_at: int, value_at: int, value_code: str) -> None:
        _, table, slots = context
        spec = table.get(name)
        if spec is None or value_at < 0:
            return
        if name in self.wants.tasked and not self.wants.general(NumberDataPoint.FromString(self.raw[pos:end]).attributes):
            return
        role, scale, rank = spec
        tag = start = None
        if self.wants.tagged is not None:
            tag = self.wants.tagged(context[0], name, self.raw[pos:end])
            if tag is not None:
                start = _start_of(self.raw, pos, end)
                if start is not None:
                    self.start_offsets.append(start)
        if time_at >= 0:
            self.time_offsets.append(time_at)
        self.value_format.append((value_at, value_code))
        slots.append(Slot(role, scale, rank, len(self.value_format) - 1, len(self.time_offsets) - 1 if time_at >= 0 else -1,
                          len(self.start_offsets) - 1 if start is not None else -1, tag))


def _start_of(raw: bytes, pos: int, end: int) -> int | None:
    """Where a number point's start time sits (the walk has proven it is written at most once)."""
    for number, _, start, _ in fields(raw, pos, end):
        if number == 2:  # NumberDataPoint.start_time_unix_nano
            return start
    return None


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
