"""Log lines for repeating events (queue full, dropped data) at most once per interval.

Per-batch events are counted in self-metrics; the log only has to tell an operator that it is
happening and why, so one line a minute per kind of event is enough. The next line says how
many were held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["LogThrottle"]


class LogThrottle:
    """Emits one record per key per ``interval`` seconds."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, key: str, level: int, msg: str, *args: object) -> None:
        """Log ``msg % args`` unless a record with ``key`` went out less than ``interval`` ago."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._held[key] = self._held.get(key, 0) + 1
            return
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            msg = f"{msg} (%d more like this since the last report)"
            args = (*args, held)
        self._logger.log(level, msg, *args)
