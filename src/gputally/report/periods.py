"""Charge periods: the report's range cut at UTC hour or day boundaries, and each period's
figures read on their own.

A FOCUS row belongs to one charge period, so the counters are read once per period
(`queries.fetch` over that period alone) rather than once for the whole range. The figures
of consecutive periods add up to the figures of the whole range: `queries.fetch` carries
each counter's value across a cut without extrapolating (see its module docstring), at the
cost of one more start query per counter and period.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from . import queries
from .prometheus import Prometheus
from .timerange import Range

__all__ = ["PERIODS", "Period", "billing_month", "fetch", "windows"]

PERIODS: dict[str, float] = {"hour": 3600.0, "day": 86400.0}
"""``--period`` -> its length in seconds (both divide a UTC day, so boundaries are aligned)."""


@dataclass(frozen=True, slots=True)
class Period:
    """One charge period's figures: ``start`` inclusive, ``end`` exclusive, as FOCUS has them
    (the range's own edges where it starts or ends inside a period)."""

    start: float
    end: float
    usage: queries.Usage


def windows(rng: Range, length: float) -> Iterator[tuple[float, float]]:
    """``rng`` cut at every multiple of ``length`` seconds since the epoch (UTC midnights for a
    day, full hours for an hour); the first and last piece end at the range's own edges."""
    a = rng.start
    while a < rng.end:
        b = min((a // length + 1) * length, rng.end)
        yield a, b
        a = b


def billing_month(at: float) -> tuple[float, float]:
    """The UTC calendar month holding ``at``: (first instant, first instant of the next month)."""
    moment = datetime.fromtimestamp(at, UTC)
    first = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = first.replace(year=first.year + 1, month=1) if first.month == 12 else first.replace(month=first.month + 1)
    return first.timestamp(), following.timestamp()


def fetch(client: Prometheus, rng: Range, period: str, *, lookback: float,
          progress: Callable[[int, int, float], None] | None = None) -> list[Period]:
    """Every period's accounts, oldest first (periods where no counter moved are kept, with
    no accounts)."""
    length = PERIODS[period]
    cuts = list(windows(rng, length))
    out: list[Period] = []
    for done, (a, b) in enumerate(cuts, 1):
        usage = queries.fetch(client, Range(a, b), chunk=b - a, lookback=lookback)
        out.append(Period(a, b, usage))
        if progress is not None:
            progress(done, len(cuts), b)
    return out
