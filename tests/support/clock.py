"""A monotonic clock for tests: ``clock()`` reads ``clock.now``, which only the test moves."""

from __future__ import annotations


class Clock:
    """Fake monotonic time, passed where code takes a ``clock`` callable: intervals are waited
    out by moving ``now``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
