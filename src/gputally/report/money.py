"""Rounding amounts so that the rounded parts add up to the rounded whole.

Rounding every FOCUS row's cost on its own lets a period's rows drift from the GPUs' cost by
up to half a unit per row: a thousand rows at two decimals can be five euros off. Instead the
whole is rounded once and handed out by the largest-remainder method: every part gets its
amount rounded down, and the units left over go to the parts with the largest remainders
(ties by position). Each part is then within one unit of its exact amount, and the parts add
up to the whole exactly.

The export does this twice per period and currency (`focus`): the period's total among its
GPUs, then each GPU's share among its rows. So a period's rows add up to the period's total,
and a GPU's rows to its own share, both to the last decimal.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal

__all__ = ["apportion", "exact", "quantum"]


def quantum(decimals: int) -> Decimal:
    """``Decimal('0.01')`` for 2 decimals."""
    return Decimal(1).scaleb(-decimals)


def exact(value: float) -> Decimal:
    """A float's shortest repr as a Decimal (``0.1`` -> ``Decimal('0.1')``, not its binary
    expansion), so sums of exact parts are what a person adding the figures gets."""
    return Decimal(repr(float(value)))


def apportion(parts: Sequence[Decimal], unit: Decimal, *, whole: Decimal | None = None) -> list[Decimal]:
    """``parts`` rounded to multiples of ``unit`` so that they add up to ``whole`` (default:
    their exact sum rounded half-even to ``unit``). ``whole`` must lie between the sum of the
    parts rounded down and that sum plus one unit per part (any rounding of the exact sum
    does). Negative parts are not expected (costs); they are rounded down like the rest."""
    if not parts:
        return []
    target = sum(parts, Decimal(0)).quantize(unit, rounding=ROUND_HALF_EVEN) if whole is None else whole
    floors = [p.quantize(unit, rounding=ROUND_FLOOR) for p in parts]
    left = int((target - sum(floors, Decimal(0))) / unit)
    if not 0 <= left <= len(parts):
        raise ValueError(f"cannot hand out {target} among parts that add up to {sum(parts, Decimal(0))}")
    order = sorted(range(len(parts)), key=lambda i: (-(parts[i] - floors[i]), i))
    for i in order[:left]:
        floors[i] += unit
    return floors
