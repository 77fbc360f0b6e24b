"""Intake's check of a metrics request, skipped for a request shaped exactly like one checked.

A receiver must refuse bytes that are not an OTLP request, and that takes a parse
(:mod:`gputally.otlp.checked`): about 40 us for a GPU node's 26 KB request, more in a busy
server whose caches are cold. But a node sends the same request every cycle, with only its
data points' times and values changed. Those are fixed-width fields (``fixed64``, ``double``,
``sfixed64``), valid whatever their bytes hold. So a request equal to a checked one in every
byte that is not such a number is valid too, with as many points: one masked compare
(:class:`~gputally.otlp.skeleton.Skeleton`) proves it, a few microseconds.

Which shapes are kept, and for how long, is :class:`~gputally.otlp.shapes.Shapes`'s policy.
A request whose shape cannot be proven (another shape, a field written twice, metrics without
a name, bytes that do not parse) gets the full check, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from gputally.otlp.batch import Batch
from gputally.otlp.checked import checked_census
from gputally.otlp.shapes import Shapes
from gputally.otlp.signals import Signal
from gputally.otlp.skeleton import Malformed, Skeleton, number_spans

__all__ = ["CheckedShapes"]


@dataclass(slots=True)
class _Checked:
    skeleton: Skeleton
    items: int
    """The request's data points (the check's count)."""
    hits: int = 0

    @property
    def footprint(self) -> int:
        return self.skeleton.mask.nbytes + len(self.skeleton.words) + 128


def _check(raw: bytes) -> _Checked:
    try:
        census = checked_census(Signal.METRICS, raw)
    except DecodeError as exc:
        raise Malformed(f"not a metrics request: {exc}") from exc
    if census.nameless_metrics:
        raise Malformed("metrics without a name: Batch.decode removes them")
    return _Checked(Skeleton.of(raw, number_spans(raw)), census.items)


class CheckedShapes:
    """:meth:`Batch.decode <gputally.otlp.batch.Batch.decode>` for a receiver, remembering the
    metrics request shapes it checked within ``budget`` bytes (0: every request parsed)."""

    def __init__(self, *, budget: int = 32 << 20) -> None:
        self.shapes: Shapes[_Checked] = Shapes(_check, budget=budget)

    def decode(self, signal: Signal, raw: bytes) -> Batch:
        """Check and count ``raw`` as :meth:`Batch.decode` does; InvalidRequest when it is not
        a request of ``signal``."""
        if signal is Signal.METRICS and (shape := self.shapes.lookup(raw)) is not None:
            return Batch(signal, raw=raw, items=shape.items)
        return Batch.decode(signal, raw)
