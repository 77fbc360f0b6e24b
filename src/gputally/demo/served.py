"""The served-model table the demo prints: its sink's served-model accounts, in the rows and
the text of ``gputally report --by served-model`` (:mod:`gputally.report.served`,
:mod:`gputally.report.render_served`), so the figures per 1M tokens are computed in one place.

The report takes each counter's increase over its range from Prometheus; the demo's range is
the replay, so its counters' latest values are those increases (they begin in it).
"""

from __future__ import annotations

from gputally.report.render_served import served_text
from gputally.report.served import Row, Served
from gputally.report.timerange import Range

from .sink import TOKENS, ServedKey, Sink

__all__ = ["rows", "served_table"]

_TIMES = {"gputally.usage.model.allocated.time": "allocated", "gputally.usage.model.busy.time": "busy",
          "gputally.usage.model.energy": "energy"}
_MONEY = {"gputally.usage.model.cost": "cost", "gputally.usage.model.busy.cost": "busy_cost"}


def _label(sink: Sink, kind: str, owner: str) -> str:
    """The owner as the report names it: ``k8s.pod namespace/name``, ``slurm.job 90210``."""
    attributes = sink.owners.get((kind, owner), {})
    namespace, pod = attributes.get("k8s.namespace.name"), attributes.get("k8s.pod.name")
    return f"{kind} {namespace}/{pod}" if kind == "k8s.pod" and namespace and pod else f"{kind} {owner}"


def _part(sink: Sink, key: ServedKey) -> Row:
    """One series' figures as a row of its own (tokens of one type, or one GPU's model account)."""
    kind, owner, model, engine, last = key
    attributes = sink.served_attributes.get(key, {})
    row = Row(kind, owner, model, str(attributes.get("hw.model", "")), engines={engine})
    counters = sink.served[key]
    if TOKENS in counters:
        setattr(row, "input" if last == "input" else "output", counters[TOKENS])
    for name, field_ in _TIMES.items():
        setattr(row, field_, counters.get(name, 0.0))
    currency = str(attributes.get("gputally.usage.currency", ""))
    for name, field_ in _MONEY.items():
        if name in counters:
            getattr(row, field_)[currency] = counters[name]
    return row


def rows(sink: Sink, rng: Range) -> Served:
    """Per owner x served model x GPU model, as the report makes them (TOTAL adds them)."""
    by: dict[tuple[str, str, str, str], Row] = {}
    for key in sink.served:
        part = _part(sink, key)
        row = by.get((part.kind, part.owner, part.model, part.gpu_model))
        if row is None:
            row = by[(part.kind, part.owner, part.model, part.gpu_model)] = Row(
                part.kind, part.owner, part.model, part.gpu_model, label=_label(sink, part.kind, part.owner))
        row.add(part)
    ordered = sorted(by.values(), key=lambda r: (-r.tokens, -r.allocated, r.label, r.model, r.gpu_model))
    total = Row("", "", "", "", label="TOTAL")
    for row in ordered:
        total.add(row)
    return Served(rng, ordered, total, sorted(set(total.cost) | set(total.busy_cost)))


def served_table(sink: Sink, *, start: float, end: float) -> str:
    """``gputally report --by served-model``'s table of the replay (``start``, ``end``: unix seconds)."""
    rng = Range(start, end)
    return served_text(rows(sink, rng), rng)
