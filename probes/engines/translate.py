"""Parsed families + an engine's mapping -> a plan of the contract's points and histograms.

Series that land on the same contract point (vLLM's data-parallel ``engine`` ranks, or
llama.cpp's prompt tokens plus its cached prompt tokens, both "input") are added, or
averaged where the rule says so (a fraction). A counter's or histogram's start time is the
engine's own ``_created`` sample where it writes one, so a restart shows as a new start time;
where it writes none the start is left to the caller's
:class:`~gputally.probes.core.counters.CounterStarts`.

It is done in two steps, because between two reads of one engine only the values move:
:func:`plan` walks the families' names, types and labels once and writes down what goes where,
by each sample's place among the families' samples (a
:class:`~gputally.probes.engines.plan.Plan`), and the plan is run on the values. A read whose exposition has the shape of an earlier one reuses its
plan (:mod:`~gputally.probes.engines.shape`) and costs the values alone. Every check and error of
the mapping keeps its place in the plan, so the first error a read meets is the one it always met.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from gputally.probes.core.model import Attributes, AttrValue, Kind
from gputally.probes.engines.catalog import MODEL
from gputally.probes.engines.exposition import ExpositionError
from gputally.probes.engines.mappings.base import EngineMapping, Rule
from gputally.probes.engines.plan import (AddHistogram, Buckets, Check, Key, LabelKey, Part, Plan, Raise, Series,
                                          Step, SummaryPart, Value)
from gputally.probes.engines.textformat import Family

__all__ = ["needs_model", "plan", "values_of"]


def needs_model(mapping: EngineMapping, families: Iterable[Family]) -> bool:
    """Whether some series the mapping reads names no served model (so one must be asked)."""
    wanted = {_norm(rule.family) for rule in mapping.rules}
    model_labels = frozenset(mapping.model_labels)
    return any(
        sample.labels.keys().isdisjoint(model_labels)
        for family in families if _norm(family.name) in wanted
        for sample in family.samples
    )


def values_of(families: list[Family]) -> list[float]:
    """The families' sample values, in the order a :class:`Plan` reads them."""
    return [sample.value for family in families for sample in family.samples]


def plan(mapping: EngineMapping, families: list[Family], *, model: str | None) -> Plan:
    """The plan of ``families``, their values aside: a run reads each sample's value at its
    place among the families' samples, in order (:func:`values_of`). ``model`` names the
    served model for series whose labels name none."""
    created: dict[tuple[str, LabelKey], int] = {}
    by_family: dict[str, list[tuple[Family, int]]] = {}
    at = 0
    for family in families:
        for index, sample in enumerate(family.samples, at):
            if sample.name.endswith("_created"):
                created[(sample.name[: -len("_created")], _key(sample.labels))] = index
        by_family.setdefault(_norm(family.name), []).append((family, at))
        at += len(family.samples)
    averaged = {rule.metric for rule in mapping.rules if rule.average}
    steps: list[Step] = []
    slots: dict[Key, int] = {}
    try:
        _steps(mapping, by_family, created, model, steps, slots)
    except ExpositionError as exc:  # certain whatever the values: the plan ends there
        steps.append(Raise(str(exc)))
    return Plan(tuple(steps), tuple(slots), tuple(metric in averaged for metric, _ in slots))


def _steps(mapping: EngineMapping, by_family: dict[str, list[tuple[Family, int]]],
           created: dict[tuple[str, LabelKey], int],
           model: str | None, steps: list[Step], slots: dict[Key, int]) -> None:
    checked: set[int] = set()
    bounds_of: dict[Key, tuple[float, ...]] = {}
    for rule in mapping.rules:
        for family, at in by_family.get(_norm(rule.family), ()):
            base = _norm(family.name)
            if family.type == "histogram":
                series = _histogram_series(family, at)
                if id(family) not in checked:  # a second rule's check of the same values cannot fail
                    checked.add(id(family))
                    steps.append(Check(family.name, tuple(series)))
                    if any(not s.buckets.bounds or s.buckets.bounds[-1] != math.inf for s in series):
                        return  # the check fails on every run
                for one in series:
                    if not _selected(mapping, rule, one.labels):
                        continue
                    key = (rule.metric, _attributes(mapping, rule, one.labels, model))
                    slot = slots.setdefault(key, len(slots))
                    start = created.get((base, one.labels))
                    if rule.part == "value" and rule.metric.kind is Kind.HISTOGRAM:
                        bounds = tuple(bound * rule.scale for bound in one.buckets.bounds[:-1])
                        if bounds_of.setdefault(key, bounds) != bounds:
                            raise ExpositionError(f"histogram {family.name} has series with different buckets "
                                                  f"for one {rule.metric.name} point")
                        steps.append(AddHistogram(slot, bounds, one, rule.scale, start))
                    elif rule.part in ("sum", "count") and rule.metric.kind is not Kind.HISTOGRAM:
                        steps.append(Part(slot, one, rule.part == "count", rule.scale, start))
            elif family.type == "summary" and rule.part in ("sum", "count"):
                for labels, (total, count) in _summary_series(family, at).items():
                    if _selected(mapping, rule, labels):
                        key, error = _attributes_or_error(mapping, rule, labels, model)
                        steps.append(SummaryPart(slots.setdefault(key, len(slots)), total, count, rule.part, rule.scale,
                                                  created.get((base, labels)), error))
            elif rule.part == "value" and rule.metric.kind is not Kind.HISTOGRAM:
                counter = rule.metric.kind is Kind.COUNTER
                for index, sample in enumerate(family.samples, at):
                    labels = _key(sample.labels)
                    if sample.name.endswith("_created") or not _selected(mapping, rule, labels):
                        continue
                    key, error = _attributes_or_error(mapping, rule, labels, model)
                    steps.append(Value(slots.setdefault(key, len(slots)), index, rule.scale, counter,
                                        created.get((base, labels)) if counter else None, error))


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


def _attributes(mapping: EngineMapping, rule: Rule, labels: LabelKey, model: str | None) -> Attributes:
    have = dict(labels)
    served = next((have[label] for label in mapping.model_labels if label in have), model)
    if served is None:
        raise ExpositionError(f"{rule.family} names no served model (labels {', '.join(mapping.model_labels) or 'none'})"
                              " and none was given")
    attributes: list[tuple[str, AttrValue]] = [(MODEL, served), *rule.attributes]
    attributes.extend((attribute, have[label]) for label, attribute in rule.labels if label in have)
    return tuple(attributes)


def _attributes_or_error(mapping: EngineMapping, rule: Rule, labels: LabelKey, model: str | None
                         ) -> tuple[Key, str | None]:
    """The point's key, or the error of a series that names no model (raised where its value counts)."""
    try:
        return (rule.metric, _attributes(mapping, rule, labels, model)), None
    except ExpositionError as exc:
        return (rule.metric, ()), str(exc)


def _histogram_series(family: Family, at: int) -> list[Series]:
    """A histogram family's series, in the order they first appear; raises for a bucket
    without a valid ``le``, which the family's check would meet before any other."""
    buckets: dict[LabelKey, list[tuple[float, int]]] = {}
    sums: dict[LabelKey, int] = {}  # its keys keep the order series first appear in, by bucket or sum
    rest_before: dict[str, str] | None = None  # a series' buckets come one after another:
    current: list[tuple[float, int]] = []  # its key is made again only when its labels change
    for index, sample in enumerate(family.samples, at):
        if sample.name.endswith("_bucket"):
            rest = sample.labels.copy()
            le = rest.pop("le", None)
            if rest != rest_before:
                rest_before, key = rest, _key(rest)
                current = buckets.setdefault(key, [])
                sums.setdefault(key, -1)
            try:
                bound = float(le)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                bound = math.nan
            if bound != bound:  # NaN: no bound at all
                raise ExpositionError(f"{sample.name} has a bucket without a valid 'le' label: {le!r}")
            current.append((bound, index))
        elif sample.name.endswith("_sum"):
            sums[_key(sample.labels)] = index
    series = []
    for labels, at in sums.items():
        pairs = sorted(buckets.get(labels, ()))
        bounds = tuple(bound for bound, _ in pairs)
        tied = len(set(bounds)) < len(bounds)
        series.append(Series(labels, Buckets(bounds, tuple(index for _, index in pairs), tied),
                              None if at < 0 else at))
    return series


def _summary_series(family: Family, at: int) -> dict[LabelKey, tuple[int | None, int | None]]:
    """A summary's ``_sum`` and ``_count`` indices per series (a Rust or Go exporter writes a
    histogram without configured buckets as one); the finite ones count, on each run."""
    found: dict[LabelKey, list[int | None]] = {}
    for index, sample in enumerate(family.samples, at):
        for part, suffix in enumerate(("_sum", "_count")):
            if sample.name.endswith(suffix):
                found.setdefault(_key(sample.labels), [None, None])[part] = index
    return {labels: (pair[0], pair[1]) for labels, pair in found.items()}
