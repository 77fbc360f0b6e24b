"""What is wrong right now, per metadata source: logged once per cause, counted every time.

A source that keeps failing the same way (an API server that stays down) logs one warning
when the cause first appears and one line when it recovers, however many retries happen in
between; each failure still counts in ``gputally_k8s_errors_total{source,cause}``.
``/readyz`` shows :meth:`Problems.describe` through the processor's ``degraded()``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Problem", "Problems"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Problem:
    cause: str
    summary: str
    """One line for ``/readyz``, saying what fails and what attribution does meanwhile."""
    since: float
    """Wall-clock time the cause first appeared."""


class Problems:
    """The active problem of each source (``apiserver``, ``podresources``, ``owners``, ``nodes``, ``proc``)."""

    def __init__(self, *, name: str, clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self._clock = clock
        self._active: dict[str, Problem] = {}
        self.counts: dict[tuple[str, str], int] = {}

    def report(self, source: str, cause: str, summary: str) -> None:
        """Record a failure of ``source``; log only when its cause changes."""
        self.counts[(source, cause)] = self.counts.get((source, cause), 0) + 1
        current = self._active.get(source)
        if current is not None and current.cause == cause:
            self._active[source] = Problem(cause, summary, current.since)
            return
        self._active[source] = Problem(cause, summary, self._clock())
        log.warning("%s: %s", self.name, summary)

    def clear(self, source: str) -> None:
        """``source`` works again."""
        gone = self._active.pop(source, None)
        if gone is not None:
            log.info("%s: %s recovered after %.0f s (%s)", self.name, source, self._clock() - gone.since, gone.cause)

    def get(self, source: str) -> Problem | None:
        return self._active.get(source)

    def describe(self) -> str | None:
        if not self._active:
            return None
        return "; ".join(
            f"{p.summary} (since {_timestamp(p.since)})" for _, p in sorted(self._active.items())
        )


def _timestamp(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
