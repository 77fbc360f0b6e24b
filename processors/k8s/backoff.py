"""Exponential backoff with jitter that forgets after a quiet spell (client-go's backoff manager)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """Waits of ``initial``, doubling up to ``maximum``, each stretched by up to ``jitter``.

    Jitter spreads many gputally instances that lost the same API server, so they do not
    come back in lockstep. After ``reset_after`` seconds without a failure the next wait
    starts again from ``initial``.
    """

    def __init__(
        self,
        *,
        initial: float,
        maximum: float,
        factor: float = 2.0,
        jitter: float = 0.2,
        reset_after: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.initial = initial
        self.maximum = max(maximum, initial)
        self.factor = factor
        self.jitter = jitter
        self.reset_after = reset_after
        self._clock = clock
        self._rand = rand
        self._current = initial
        self._last: float | None = None

    def next(self) -> float:
        """The wait before the next attempt, after a failure now."""
        now = self._clock()
        if self._last is not None and now - self._last > self.reset_after:
            self._current = self.initial
        self._last = now
        delay = min(self._current, self.maximum)
        self._current = min(self._current * self.factor, self.maximum)
        return delay * (1.0 + self.jitter * self._rand())

    def reset(self) -> None:
        self._current = self.initial
        self._last = None
