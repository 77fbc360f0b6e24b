"""An exposition's shape, parsed and mapped once, and its values read on every cycle.

Between two reads of one engine only its values move: the same families, series and labels
come back in the same order. So a read splits the wanted lines into their heads (names and
labels, as written) and values (:class:`~gputally.probes.engines.exposition.Scanner`, in C),
and looks the heads up: a shape seen before has its families parsed and its mapping planned
(:func:`~gputally.probes.engines.translate.plan`) already, and the read costs the scan and
the values. A new shape is parsed as the full path parses its lines
(:func:`~gputally.probes.engines.exposition.parse_lines`), each value stood in for by its
line's index, so it is known where each sample's value is; a value never changes what a line
parses to.

Anything the scan does not take, or a shape whose lines do not parse, goes the full way
(:func:`~gputally.probes.engines.exposition.parse`), which is the reference, errors
included: ``tests/probes/engines/test_shape.py`` holds the two to the same readings on every
fixture and on variations of them.

Shapes are kept by their reader in a :class:`Shapes` (the probe keeps one for all its engines),
keyed by what they are (so engines of one shape share one), the oldest dropped first once they
hold :data:`MOST_SAMPLES` samples between them (a kept sample costs about 0.6-0.9 KB, so at
most ~15 MB; a vLLM shape holds 166); a shape of more than :data:`MOST_SAMPLES_ONE` samples is
not kept. So an engine whose series change on every read, or one that writes thousands, costs
what every read cost before, and no more memory.
"""

from __future__ import annotations

from functools import cached_property

from gputally.probes.engines.exposition import ExpositionError, Split, parse_lines
from gputally.probes.engines.mappings.base import EngineMapping
from gputally.probes.engines.plan import Plan
from gputally.probes.engines.scrape import ScrapeLimits
from gputally.probes.engines.textformat import Family
from gputally.probes.engines.translate import needs_model, plan, values_of

__all__ = ["MOST_SAMPLES", "MOST_SAMPLES_ONE", "Shape", "Shapes", "read", "read_full"]

MOST_SAMPLES = 16_384
MOST_SAMPLES_ONE = 4_096
_MOST_PLANS = 4
_Key = tuple[str, tuple[bytes, ...], tuple[int, ...], tuple[bytes, ...]]


class Shape:
    """One exposition's wanted families (their values aside) and their plans, one per
    served-model name given."""

    def __init__(self, mapping: EngineMapping, families: list[Family], order: list[int] | None = None) -> None:
        """``order``: where each sample (in the families' order) finds its value in a read's
        values; None: in that same order."""
        self.mapping = mapping
        self.families = families
        self.needs_model = needs_model(mapping, families)
        """Whether some series names no served model (so one must be asked)."""
        self.samples = sum(len(f.samples) for f in families)
        self._order = order
        self._plans: dict[str | None, Plan] = {}

    @cached_property
    def most_labels(self) -> int:
        return max((len(s.labels) for f in self.families for s in f.samples), default=0)

    def values(self, read: list[float]) -> list[float]:
        """A read's values (a split's: in the order of its lines) in the order the plans read them."""
        return read if self._order is None else list(map(read.__getitem__, self._order))

    def plan(self, model: str | None) -> Plan:
        found = self._plans.get(model)
        if found is None:
            if len(self._plans) >= _MOST_PLANS:
                self._plans.clear()
            found = self._plans[model] = plan(self.mapping, self.families, model=model)
        return found


def read(mapping: EngineMapping, body: bytes, limits: ScrapeLimits, shapes: Shapes) -> tuple[Shape, list[float]]:
    """The shape of ``body``'s wanted lines (kept in ``shapes``, or found there) and their
    values; raises :class:`ExpositionError` as :func:`read_full` does."""
    scanner = mapping.scanner
    lines = None
    if scanner.anchored:
        split = scanner.scan(body, limits)
    else:
        lines = mapping.selector.lines(body, limits)
        split = scanner.split_lines(lines, limits)
    if split is not None:
        shape = _shape(mapping, split, limits, shapes)
        if shape is not None:
            return shape, shape.values(split.values)
    if lines is None:
        lines = mapping.selector.lines(body, limits)
    return _full(mapping, lines, limits)


def read_full(mapping: EngineMapping, body: bytes, limits: ScrapeLimits) -> tuple[Shape, list[float]]:
    """The same, the full way: every wanted line parsed, nothing kept (the reference of :func:`read`)."""
    return _full(mapping, mapping.selector.lines(body, limits), limits)


def _full(mapping: EngineMapping, lines: list[bytes], limits: ScrapeLimits) -> tuple[Shape, list[float]]:
    families = parse_lines(lines, limits)
    return Shape(mapping, families), values_of(families)


def _shape(mapping: EngineMapping, split: Split, limits: ScrapeLimits, shapes: Shapes) -> Shape | None:
    """The shape of a split seen before, or parsed now; None where its lines do not parse
    (or break a limit): the full way says why."""
    key = (mapping.engine, split.types, split.counts, split.heads)
    shape = shapes.get(key)
    if shape is None:
        try:
            families = parse_lines(split.lines(), limits)  # each value its line's index in the split
        except ExpositionError:
            return None
        order = [int(value) for value in values_of(families)]
        if sorted(order) != list(range(len(split.values))):
            return None  # not one sample a line (the reference parser's doing): the full way
        shape = Shape(mapping, families, None if order == sorted(order) else order)
        shapes.put(key, shape)
    elif shape.most_labels > limits.max_labels_per_series:
        return None
    return shape


class Shapes:
    """The shapes one reader keeps, oldest first, within a budget of samples: ``most`` in
    all, none of more than ``most_one``. Used from one event loop."""

    def __init__(self, *, most: int = MOST_SAMPLES, most_one: int = MOST_SAMPLES_ONE) -> None:
        self._shapes: dict[_Key, Shape] = {}
        self._samples = 0
        self._most, self._most_one = most, most_one

    def get(self, key: _Key) -> Shape | None:
        return self._shapes.get(key)

    def put(self, key: _Key, shape: Shape) -> None:
        if shape.samples > self._most_one:
            return
        while self._shapes and self._samples + shape.samples > self._most:
            self._samples -= self._shapes.pop(next(iter(self._shapes))).samples
        self._shapes[key] = shape
        self._samples += shape.samples

    def __len__(self) -> int:
        return len(self._shapes)

