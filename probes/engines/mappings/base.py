"""The shape of one engine's mapping: its own metric names -> the contract's metrics.

A mapping is data, not code: a table of :class:`Rule` s that
:mod:`~gputally.probes.engines.translate` applies, plus how the engine is recognised from its
exposition. Adding an engine is adding a table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from gputally.probes.core.model import Attributes, MetricDef
from gputally.probes.engines.exposition import Scanner, Selector, line_starts

__all__ = ["EngineMapping", "Rule"]

Part = Literal["value", "sum", "count"]


@dataclass(frozen=True)
class Rule:
    """One engine family feeding one contract metric."""

    family: str
    """The engine's family name as its ``# TYPE`` line declares it (a counter's with ``_total``)."""
    metric: MetricDef
    scale: float = 1.0
    """Multiplies values (and a histogram's bucket bounds and sum): ``1e-6`` for microseconds."""
    part: Part = "value"
    """``value``: the family as it is (a counter, gauge or histogram onto the same kind);
    ``sum`` or ``count``: a histogram's ``_sum`` or ``_count`` as a counter (TGI counts
    tokens only as a histogram of tokens per request)."""
    attributes: Attributes = ()
    """Fixed point attributes (``gen_ai.token.type`` = ``input``)."""
    labels: tuple[tuple[str, str], ...] = ()
    """Engine label -> point attribute (vLLM ``finished_reason`` -> ``gputally.inference.finish_reason``)."""
    where: tuple[tuple[str, str], ...] = ()
    """Only the series whose labels have these values (Triton's ``request_type="waiting"``)."""
    average: bool = False
    """Series that land on one point (per data-parallel rank, say) are averaged, not added: a fraction."""


@dataclass(frozen=True)
class EngineMapping:
    """One engine: how to recognise its exposition, where its model name is, what maps to what."""

    engine: str
    """A value of :data:`~gputally.probes.engines.model.ENGINES`."""
    markers: tuple[str, ...]
    """Family-name prefixes only this engine writes (``vllm:``); the first engine whose marker
    starts a line of the exposition is the one that wrote it."""
    model_labels: tuple[str, ...]
    """Labels that name the served model, first found wins; empty: the engine names none."""
    rules: tuple[Rule, ...]
    source: str
    """The documentation (or measurement) the table comes from, with its version."""
    model_path: str = "/v1/models"
    """Where to ask the served model's name when neither a label nor the endpoint names it:
    an OpenAI-style list (``data[0].id``) or TGI's ``/info`` (``model_id``)."""
    replicas: tuple[tuple[str, str], ...] = ()
    """Labels whose other values mark copies of one series (every tensor-parallel rank
    reporting the same requests): only the series with this value, or without the label, count."""

    @cached_property
    def selector(self) -> Selector:
        return Selector.of(rule.family for rule in self.rules)

    @cached_property
    def scanner(self) -> Scanner:
        return Scanner(rule.family for rule in self.rules)

    @cached_property
    def marker(self) -> re.Pattern[bytes]:
        alternatives = b"|".join(re.escape(m.encode()) for m in self.markers)
        return re.compile(rb"(?:" + alternatives + rb")")

    def writes(self, body: bytes) -> bool:
        """Whether the exposition holds a family of this engine (a line that begins with a marker)."""
        return next(line_starts(self.marker, body), None) is not None
