"""Retry of one send: jittered exponential backoff, the server's throttle hint, one deadline.

As in the OpenTelemetry Collector's retry sender: a permanent error ends the batch at once; a
transient one waits ``initial_interval`` grown by ``multiplier`` up to ``max_interval``, each
wait drawn from ``interval * (1 ± randomization_factor)``; a server hint (gRPC RetryInfo,
HTTP Retry-After) replaces the computed wait; the batch is given up when the next wait would
end after ``max_elapsed_time`` (0: never). Waits sleep on an event that :meth:`Retrier.stop`
sets, so shutdown never waits out a backoff; after stop, each send gets one attempt.
"""

from __future__ import annotations

import asyncio
import enum
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gputally.util.backoff import Backoff
from gputally.errors import ExportError, PermanentExportError, TransientExportError
from gputally.exporterhelper.settings import RetrySettings

__all__ = ["Clock", "Outcome", "Result", "Retrier", "SystemClock", "backoff"]

T = TypeVar("T")


class Clock(Protocol):
    """Time as the retry sees it; tests substitute one that does not really wait."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float, interrupt: asyncio.Event) -> bool:
        """Wait ``seconds``; False when ``interrupt`` was set first."""
        ...


class SystemClock:
    """Real time."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float, interrupt: asyncio.Event) -> bool:
        if interrupt.is_set():
            return False
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
        # races with the event, leaving a task that ignores shutdown.
        try:
            async with asyncio.timeout(seconds):
                await interrupt.wait()
        except TimeoutError:
            return True
        return False


class Outcome(enum.Enum):
    SENT = "sent"
    PERMANENT = "permanent"
    """The backend refused the data for good."""
    EXHAUSTED = "exhausted"
    """Transient failures until the deadline (or retry is disabled)."""
    STOPPED = "stopped"
    """A transient failure after :meth:`Retrier.stop`: the caller keeps or drops the data."""


@dataclass(frozen=True)
class Result(Generic[T]):
    outcome: Outcome
    value: T | None = None
    """What the successful attempt returned."""
    error: ExportError | None = None
    """The last failure, for logs."""
    retry_after: float | None = None
    """The last server hint, for a caller that passes backpressure on."""


def backoff(settings: RetrySettings, rng: random.Random) -> Iterator[float]:
    """Endless jittered waits per ``settings`` (the shared :class:`~gputally.util.backoff.Backoff`)."""
    waits = Backoff(initial=settings.initial_interval, maximum=settings.max_interval, factor=settings.multiplier,
                    jitter=settings.randomization_factor, rng=rng)
    while True:
        yield waits.next()


class Retrier:
    """Runs attempts until one succeeds, one fails for good, the deadline passes or stop()."""

    def __init__(
        self,
        settings: RetrySettings,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._stop = asyncio.Event()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """Wake every waiting retry; from now on each send gets a single attempt."""
        self._stop.set()

    async def run(self, attempt: Callable[[], Awaitable[T]]) -> Result[T]:
        settings = self._settings
        started = self._clock.monotonic()
        waits = backoff(settings, self._rng)
        while True:
            try:
                return Result(Outcome.SENT, value=await attempt())
            except PermanentExportError as exc:
                return Result(Outcome.PERMANENT, error=exc)
            except TransientExportError as exc:
                error = exc
            if self.stopped:
                return Result(Outcome.STOPPED, error=error, retry_after=error.retry_after)
            if not settings.enabled:
                return Result(Outcome.EXHAUSTED, error=error, retry_after=error.retry_after)
            computed = next(waits)
            wait = computed if error.retry_after is None else error.retry_after
            elapsed = self._clock.monotonic() - started
            if settings.max_elapsed_time and elapsed + wait > settings.max_elapsed_time:
                return Result(Outcome.EXHAUSTED, error=error, retry_after=error.retry_after)
            # Woken by stop(): fall through to one last attempt (the backend may be back), which
            # ends in STOPPED if it fails too.
            await self._clock.sleep(wait, self._stop)
