"""Parsed families + an engine's mapping -> the contract's points and histograms.

Series that land on the same contract point (vLLM's data-parallel ``engine`` ranks, or
llama.cpp's prompt tokens plus its cached prompt tokens, both "input") are added, or
averaged where the rule says so (a fraction). A counter's or histogram's start time is the
engine's own ``_created`` sample where it writes one, so a restart shows as a new start time;
where it writes none the start is left to the caller's
:class:`~gputally.probes.core.counters.CounterStarts`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gputally.probes.core.model import Attributes, AttrValue, Kind, MetricDef, Point
from gputally.probes.engines.catalog import MODEL
from gputally.probes.engines.exposition import ExpositionError
from gputally.probes.engines.mappings.base import EngineMapping, Rule
from gputally.probes.engines.model import HistogramPoint
from gputally.probes.engines.textformat import Family

__all__ = ["needs_model", "translate"]

LabelKey = tuple[tuple[str, str], ...]


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
class _Series:
    """One histogram series of the exposition, before conversion."""

    buckets: list[tuple[float, float]] = field(default_factory=list)
    sum: float = 0.0


def needs_model(mapping: EngineMapping, families: Iterable[Family]) -> bool:
    """Whether some series the mapping reads names no served model (so one must be asked)."""
    wanted = {_norm(rule.family) for rule in mapping.rules}
    model_labels = frozenset(mapping.model_labels)
    return any(  # per sample one set test in C: this runs on every read
        sample.labels.keys().isdisjoint(model_labels)
        for family in families if _norm(family.name) in wanted
        for sample in family.samples
    )


def translate(mapping: EngineMapping, families: list[Family], *, model: str | None
              ) -> tuple[list[Point], list[HistogramPoint]]:
    """The contract's points of one exposition. ``model`` names the served model for series
    whose labels name none; without it such a series is an :class:`ExpositionError`."""
    created: dict[tuple[str, LabelKey], float] = {}
    by_family: dict[str, list[Family]] = {}
    for family in families:
        for sample in family.samples:
            if sample.name.endswith("_created"):
                created[(sample.name[: -len("_created")], _key(sample.labels))] = sample.value
        by_family.setdefault(_norm(family.name), []).append(family)

    scalars: dict[tuple[MetricDef, Attributes], _Scalar] = {}
    histograms: dict[tuple[MetricDef, Attributes], _Histogram] = {}
    for rule in mapping.rules:
        for family in by_family.get(_norm(rule.family), ()):
            base = _norm(family.name)
            if family.type == "histogram":
                for labels, series in _histogram_series(family).items():
                    if not _selected(mapping, rule, labels):
                        continue
                    attributes = _attributes(mapping, rule, labels, model)
                    start = _start(created, base, labels)
                    if rule.part == "value" and rule.metric.kind is Kind.HISTOGRAM:
                        _add_histogram(histograms, rule, attributes, family.name, series, start)
                    elif rule.part in ("sum", "count") and rule.metric.kind is not Kind.HISTOGRAM:
                        value = series.sum if rule.part == "sum" else series.buckets[-1][1]
                        _add_scalar(scalars, rule, attributes, value * rule.scale, start)
            elif family.type == "summary" and rule.part in ("sum", "count"):
                for labels, (total, count) in _summary_series(family).items():
                    if _selected(mapping, rule, labels):
                        _add_scalar(scalars, rule, _attributes(mapping, rule, labels, model),
                                    (total if rule.part == "sum" else count) * rule.scale,
                                    _start(created, base, labels))
            elif rule.part == "value" and rule.metric.kind is not Kind.HISTOGRAM:
                for sample in family.samples:
                    if sample.name.endswith("_created") or not _selected(mapping, rule, _key(sample.labels)):
                        continue
                    labels = _key(sample.labels)
                    value = sample.value * rule.scale
                    if not math.isfinite(value) or (rule.metric.kind is Kind.COUNTER and value < 0):
                        continue  # NaN before the first observation, or nonsense: no point
                    start = _start(created, base, labels) if rule.metric.kind is Kind.COUNTER else None
                    _add_scalar(scalars, rule, _attributes(mapping, rule, labels, model), value, start)

    points = [
        Point(metric, _number(metric, acc.value / acc.n if _averaged(mapping, metric) else acc.value),
              attributes, None if acc.unstarted else acc.start_ns)
        for (metric, attributes), acc in scalars.items()
    ]
    hists = [
        HistogramPoint(metric, h.bounds, tuple(h.counts), h.count, h.sum, attributes,
                       None if h.unstarted else h.start_ns)
        for (metric, attributes), h in histograms.items()
    ]
    return points, hists


def _norm(name: str) -> str:
    return name.removesuffix("_total")


def _key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


def _selected(mapping: EngineMapping, rule: Rule, labels: LabelKey) -> bool:
    if not rule.where and not mapping.replicas:
        return True
    have = dict(labels)
    return (all(have.get(name) == value for name, value in rule.where)
            and all(have.get(name, value) == value for name, value in mapping.replicas))


def _averaged(mapping: EngineMapping, metric: MetricDef) -> bool:
    return any(rule.average for rule in mapping.rules if rule.metric is metric)


def _attributes(mapping: EngineMapping, rule: Rule, labels: LabelKey, model: str | None) -> Attributes:
    have = dict(labels)
    served = next((have[label] for label in mapping.model_labels if label in have), model)
    if served is None:
        raise ExpositionError(f"{rule.family} names no served model (labels {', '.join(mapping.model_labels) or 'none'})"
                              " and none was given")
    attributes: list[tuple[str, AttrValue]] = [(MODEL, served), *rule.attributes]
    attributes.extend((attribute, have[label]) for label, attribute in rule.labels if label in have)
    return tuple(attributes)


def _start(created: Mapping[tuple[str, LabelKey], float], base: str, labels: LabelKey) -> int | None:
    seconds = created.get((base, labels))
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return None
    return int(seconds * 1e9)


def _number(metric: MetricDef, value: float) -> float | int:
    """Counts of things (``{token}``, ``{request}``) as integers, as OTLP's ``as_int``."""
    if metric.unit.startswith("{") and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _add_scalar(acc: dict[tuple[MetricDef, Attributes], _Scalar], rule: Rule, attributes: Attributes,
                value: float, start: int | None) -> None:
    entry = acc.setdefault((rule.metric, attributes), _Scalar())
    entry.value += value
    entry.n += 1
    if start is None:
        entry.unstarted = True
    elif entry.start_ns is None or start < entry.start_ns:
        entry.start_ns = start


def _histogram_series(family: Family) -> dict[LabelKey, _Series]:
    series: dict[LabelKey, _Series] = {}
    rest_before: dict[str, str] | None = None  # a series' buckets come one after another:
    current = _Series()  # the series of the bucket before, found again only when its labels change
    for sample in family.samples:
        if sample.name.endswith("_bucket"):
            rest = sample.labels.copy()  # its labels but the bound (copied and popped in C)
            le = rest.pop("le", None)
            if rest != rest_before:
                rest_before, labels = rest, _key(rest)
                current = series.setdefault(labels, _Series())
            try:
                bound = float(le)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                bound = math.nan
            if bound != bound:  # NaN: no bound at all
                raise ExpositionError(f"{sample.name} has a bucket without a valid 'le' label: {le!r}")
            current.buckets.append((bound, sample.value))
        elif sample.name.endswith("_sum"):
            series.setdefault(_key(sample.labels), _Series()).sum = sample.value
    for labels, one in series.items():
        one.buckets.sort()
        if not one.buckets or one.buckets[-1][0] != math.inf:
            raise ExpositionError(f"histogram {family.name}{dict(labels)} has no +Inf bucket")
        counts = [c for _, c in one.buckets]  # finite, not negative, not decreasing (checked in C)
        if not (all(map(math.isfinite, counts)) and counts[0] >= 0 and counts == sorted(counts)):
            raise ExpositionError(f"histogram {family.name}{dict(labels)} has bucket counts that are not cumulative")
    return series


def _summary_series(family: Family) -> dict[LabelKey, tuple[float, float]]:
    """A summary's ``_sum`` and ``_count`` per series (a Rust or Go exporter writes a
    histogram without configured buckets as one)."""
    sums: dict[LabelKey, list[float]] = {}
    for sample in family.samples:
        for index, suffix in enumerate(("_sum", "_count")):
            if sample.name.endswith(suffix):
                sums.setdefault(_key(sample.labels), [0.0, 0.0])[index] = sample.value
    return {labels: (pair[0], pair[1]) for labels, pair in sums.items()
            if math.isfinite(pair[0]) and math.isfinite(pair[1])}


def _add_histogram(acc: dict[tuple[MetricDef, Attributes], _Histogram], rule: Rule, attributes: Attributes,
                   name: str, series: _Series, start: int | None) -> None:
    bounds = tuple(bound * rule.scale for bound, _ in series.buckets[:-1])
    cumulative = [round(count) for _, count in series.buckets]
    counts = [cumulative[0], *(b - a for a, b in zip(cumulative, cumulative[1:]))]
    total = series.sum * rule.scale if math.isfinite(series.sum) else 0.0
    entry = acc.get((rule.metric, attributes))
    if entry is None:
        acc[(rule.metric, attributes)] = _Histogram(bounds, counts, cumulative[-1], total, start, start is None)
        return
    if entry.bounds != bounds:
        raise ExpositionError(f"histogram {name} has series with different buckets for one {rule.metric.name} point")
    entry.counts = [a + b for a, b in zip(entry.counts, counts)]
    entry.count += cumulative[-1]
    entry.sum += total
    if start is None:
        entry.unstarted = True
    elif entry.start_ns is None or start < entry.start_ns:
        entry.start_ns = start
