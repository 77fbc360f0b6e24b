"""One jittered exponential backoff for everything that retries: watches, exports, connects, lookups.

Waits start at ``initial``, grow by ``factor`` up to ``maximum``, and each is drawn from
``wait x [1 - jitter, 1 + jitter]`` (OpenTelemetry's ``randomization_factor``, gRPC's 20 %
connection backoff jitter), so that many gputally instances that lost the same API server,
slurmctld or backend do not come back in lockstep. ``reset()`` after a success starts again
from ``initial``; with ``reset_after``, a quiet spell that long does the same on its own
(client-go's backoff manager), for callers that never see a success as such (a watch that
ends normally).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """The waits between attempts of one thing that retries; not shared between things."""

    def __init__(
        self,
        *,
        initial: float,
        maximum: float,
        factor: float = 2.0,
        jitter: float = 0.2,
        reset_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 <= jitter <= 1:
            raise ValueError(f"jitter {jitter} is not in [0, 1]")
        self.initial = initial
        self.maximum = max(maximum, initial)
        self.factor = factor
        self.jitter = jitter
        self.reset_after = reset_after
        self._clock = clock
        self._rng = rng or random.Random()
        self._current = initial
        self._last: float | None = None

    def next(self) -> float:
        """The wait before the next attempt, after a failure now."""
        if self.reset_after is not None:
            now = self._clock()
            if self._last is not None and now - self._last > self.reset_after:
                self._current = self.initial
            self._last = now
        wait = min(self._current, self.maximum)
        self._current = min(self._current * self.factor, self.maximum)
        if not self.jitter:
            return wait
        return self._rng.uniform(wait * (1 - self.jitter), wait * (1 + self.jitter))

    def reset(self) -> None:
        """After a success: the next wait is ``initial`` again."""
        self._current = self.initial
        self._last = None
