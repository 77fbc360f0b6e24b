"""``hw.status`` as the hardware conventions ask: one point per state, 1 for the current one.

Every vendor's probe says a device's state this way (NVIDIA from its readings, AMD and Gaudi
from their snapshots), so the shape lives here, beside no vendor.
"""

from __future__ import annotations

from collections.abc import Iterable

from gputally.probes.core import catalog as m
from gputally.probes.core.model import Point

__all__ = ["STATES", "status_points"]

STATES = ("ok", "degraded", "failed")
"""The states a device is reported in."""


def status_points(state: str, states: Iterable[str] = STATES) -> list[Point]:
    """``hw.status``: 1 for ``state``, 0 for the others."""
    return [Point(m.STATUS, 1 if s == state else 0, (("hw.state", s),)) for s in states]
