"""A plan: the steps that turn one exposition's values into the contract's points.

:func:`~gputally.probes.engines.translate.plan` writes a plan from an exposition's shape (its
families' names, types and labels; a sample is known by its place among the families'
samples); :meth:`Plan.run` applies it to a read's values, in that order. The steps are the mapping's, in its order, with every check
and error where the mapping meets it: a value that is NaN, negative or not cumulative is
judged on each run, an error the shape makes certain is a :class:`Raise` step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import sub

from gputally.probes.core.model import Attributes, MetricDef, Point
from gputally.probes.engines.exposition import ExpositionError
from gputally.probes.engines.model import HistogramPoint

__all__ = ["AddHistogram", "Buckets", "Check", "Key", "LabelKey", "Part", "Plan", "Raise", "Series", "Step",
           "SummaryPart", "Value"]

LabelKey = tuple[tuple[str, str], ...]
Key = tuple[MetricDef, Attributes]


@dataclass
class _Scalar:
    value: float = 0.0
    n: int = 0
    start_ns: int | None = None
    unstarted: bool = False


@dataclass
class _Histogram:
    bounds: tuple[float, ...]
    counts: list[int]
    count: int
    sum: float
    start_ns: int | None
    unstarted: bool = False


@dataclass
class _Sums:
    """What one run adds up, by contract point (its slot in :attr:`Plan.keys`), in the order
    the points first get a value."""

    scalars: dict[int, _Scalar] = field(default_factory=dict)
    histograms: dict[int, _Histogram] = field(default_factory=dict)

    def scalar(self, slot: int, value: float, start: int | None) -> None:
        entry = self.scalars.get(slot)
        if entry is None:
            entry = self.scalars[slot] = _Scalar()
        entry.value += value
        entry.n += 1
        _add_start(entry, start)


def _add_start(entry: _Scalar | _Histogram, start: int | None) -> None:
    """A point of several series starts with the earliest of them, and has no start where one
    of them has none (the caller's CounterStarts then gives it one)."""
    if start is None:
        entry.unstarted = True
    elif entry.start_ns is None or start < entry.start_ns:
        entry.start_ns = start


_LATEST_START_S = 2**63 / 1e9


def _start(values: Sequence[float], index: int | None) -> int | None:
    """The start time a ``_created`` sample gives (seconds since the epoch), if a usable one:
    positive and within an int64 of nanoseconds (past 2262 it is an engine's garbage, and
    ``int()`` of its product would overflow)."""
    if index is None:
        return None
    seconds = values[index]
    if not 0 < seconds < _LATEST_START_S:
        return None
    return int(seconds * 1e9)


@dataclass(frozen=True, slots=True)
class Buckets:
    """One histogram series' buckets, by bound (unscaled, the last +Inf where it has one)."""

    bounds: tuple[float, ...]
    order: tuple[int, ...]
    """Value indices in the bounds' order (tied bounds in the order their lines came)."""
    tied: bool
    """Two buckets have one bound: those are ordered by count on each run, as sorting
    (bound, count) pairs does."""

    def counts(self, values: Sequence[float]) -> list[float]:
        counts = list(map(values.__getitem__, self.order))
        if self.tied:
            counts = [c for _, c in sorted(zip(self.bounds, counts))]
        return counts


@dataclass(frozen=True, slots=True)
class Series:
    labels: LabelKey
    buckets: Buckets
    sum: int | None
    """The ``_sum`` sample's index; none: 0."""


@dataclass(frozen=True, slots=True)
class Check:
    """A histogram family's series are whole: a +Inf bucket, and counts that are finite, not
    negative and never decreasing."""

    family: str
    series: tuple[Series, ...]

    def run(self, values: Sequence[float], sums: _Sums) -> None:
        for one in self.series:
            if not one.buckets.bounds or one.buckets.bounds[-1] != math.inf:
                raise ExpositionError(f"histogram {self.family}{dict(one.labels)} has no +Inf bucket")
            counts = one.buckets.counts(values)
            if not (all(map(math.isfinite, counts)) and counts[0] >= 0 and counts == sorted(counts)):
                raise ExpositionError(f"histogram {self.family}{dict(one.labels)} has bucket counts that are not cumulative")


@dataclass(frozen=True, slots=True)
class Raise:
    """An error the structure makes certain, where the mapping meets it."""

    message: str

    def run(self, values: Sequence[float], sums: _Sums) -> None:
        raise ExpositionError(self.message)


@dataclass(frozen=True, slots=True)
class Value:
    """One sample of a counter or gauge family, unless it is NaN (no observation yet) or a
    counter's is negative. ``error``: the series names no model, raised only if it counts."""

    slot: int
    index: int
    scale: float
    counter: bool
    start: int | None
    error: str | None

    def run(self, values: Sequence[float], sums: _Sums) -> None:
        value = values[self.index] * self.scale
        if not math.isfinite(value) or (self.counter and value < 0):
            return
        if self.error is not None:
            raise ExpositionError(self.error)
        sums.scalar(self.slot, value, _start(values, self.start) if self.counter else None)


@dataclass(frozen=True, slots=True)
class Part:
    """A histogram series' ``_sum`` (or its +Inf count) as a counter."""

    slot: int
    series: Series
    count: bool
    scale: float
    start: int | None

    def run(self, values: Sequence[float], sums: _Sums) -> None:
        if self.count:
            value = self.series.buckets.counts(values)[-1]
        else:
            value = values[self.series.sum] if self.series.sum is not None else 0.0
        sums.scalar(self.slot, value * self.scale, _start(values, self.start))


@dataclass(frozen=True, slots=True)
class SummaryPart:
    """A summary series' ``_sum`` or ``_count`` as a counter, where both are finite."""

    slot: int
    sum: int | None
    count: int | None
    part: str
    scale: float
    start: int | None
    error: str | None

    def run(self, values: Sequence[float], sums: _Sums) -> None:
        total = values[self.sum] if self.sum is not None else 0.0
        count = values[self.count] if self.count is not None else 0.0
        if not (math.isfinite(total) and math.isfinite(count)):
            return
        if self.error is not None:
            raise ExpositionError(self.error)
        sums.scalar(self.slot, (total if self.part == "sum" else count) * self.scale, _start(values, self.start))


@dataclass(frozen=True, slots=True)
class AddHistogram:
    slot: int
    bounds: tuple[float, ...]
    """Scaled, without +Inf (OTLP's explicit bounds)."""
    series: Series
    scale: float
    start: int | None

    def run(self, values: Sequence[float], sums: _Sums) -> None:
        cumulative = list(map(round, self.series.buckets.counts(values)))
        counts = [cumulative[0], *map(sub, cumulative[1:], cumulative[:-1])]
        total = values[self.series.sum] if self.series.sum is not None else 0.0
        total = total * self.scale if math.isfinite(total) else 0.0
        start = _start(values, self.start)
        entry = sums.histograms.get(self.slot)
        if entry is None:
            sums.histograms[self.slot] = _Histogram(self.bounds, counts, cumulative[-1], total, start, start is None)
            return
        entry.counts = [a + b for a, b in zip(entry.counts, counts)]
        entry.count += cumulative[-1]
        entry.sum += total
        _add_start(entry, start)


Step = Check | Raise | Value | Part | SummaryPart | AddHistogram


@dataclass(frozen=True)
class Plan:
    """What one exposition's shape maps to: steps over the values, in the mapping's order."""

    steps: tuple[Step, ...]
    keys: tuple[Key, ...]
    """The contract points the steps add to, by slot."""
    averaged: tuple[bool, ...]
    """By slot: the point's series are averaged, not added."""

    def run(self, values: Sequence[float]) -> tuple[list[Point], list[HistogramPoint]]:
        """The points of one read whose sample values are ``values``; raises :class:`ExpositionError`."""
        sums = _Sums()
        for step in self.steps:
            step.run(values, sums)
        keys = self.keys
        points = []
        for slot, acc in sums.scalars.items():
            metric, attributes = keys[slot]
            points.append(Point(metric, _number(metric, acc.value / acc.n if self.averaged[slot] else acc.value),
                                attributes, None if acc.unstarted else acc.start_ns))
        hists = []
        for slot, h in sums.histograms.items():
            metric, attributes = keys[slot]
            hists.append(HistogramPoint(metric, h.bounds, tuple(h.counts), h.count, h.sum, attributes,
                                        None if h.unstarted else h.start_ns))
        return points, hists


def _number(metric: MetricDef, value: float) -> float | int:
    """Counts of things (``{token}``, ``{request}``) as integers, as OTLP's ``as_int``."""
    if metric.unit.startswith("{") and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value
