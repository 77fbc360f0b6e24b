"""Retry: backoff with jitter, the server's hint, the deadline, permanent errors, stop()."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable

import pytest

from gputally.errors import ExportError, PermanentExportError, TransientExportError
from gputally.exporterhelper.retry import Outcome, Retrier, SystemClock, backoff
from gputally.exporterhelper.settings import RetrySettings


class FakeClock:
    """Time that moves only when the retrier sleeps; records each wait."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float, interrupt: asyncio.Event) -> bool:
        if interrupt.is_set():
            return False
        self.waits.append(seconds)
        self.now += seconds
        return True


class Script:
    """An attempt function that raises the given errors in turn, then returns "ok"."""

    def __init__(self, errors: Iterable[ExportError]) -> None:
        self.errors = list(errors)
        self.attempts = 0

    async def __call__(self) -> str:
        self.attempts += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def settings(**overrides: object) -> RetrySettings:
    base: dict[str, object] = {"initial_interval": 1, "randomization_factor": 0, "multiplier": 2,
                               "max_interval": 5, "max_elapsed_time": 60}
    return RetrySettings.model_validate(base | overrides)


def transient(retry_after: float | None = None) -> TransientExportError:
    return TransientExportError("unavailable", retry_after=retry_after)


async def test_exponential_backoff_capped_at_max_interval() -> None:
    clock = FakeClock()
    script = Script([transient() for _ in range(5)])
    result = await Retrier(settings(), clock=clock).run(script)
    assert result.outcome is Outcome.SENT and result.value == "ok"
    assert clock.waits == [1, 2, 4, 5, 5]
    assert script.attempts == 6


def test_jitter_stays_within_randomization_factor() -> None:
    waits = backoff(settings(randomization_factor=0.5, multiplier=1), random.Random(7))
    drawn = [next(waits) for _ in range(200)]
    assert all(0.5 <= w <= 1.5 for w in drawn)
    assert max(drawn) - min(drawn) > 0.5  # actually random, not constant


async def test_server_hint_replaces_computed_wait_both_ways() -> None:
    clock = FakeClock()
    script = Script([transient(retry_after=0.25), transient(retry_after=20), transient()])
    result = await Retrier(settings(), clock=clock).run(script)
    assert result.outcome is Outcome.SENT
    # The hints win over 1 s and 2 s; the third wait is the backoff's own (4 s).
    assert clock.waits == [0.25, 20, 4]


async def test_gives_up_when_next_wait_would_pass_deadline() -> None:
    clock = FakeClock()
    script = Script([transient() for _ in range(100)])
    result = await Retrier(settings(max_elapsed_time=10), clock=clock).run(script)
    assert result.outcome is Outcome.EXHAUSTED
    assert isinstance(result.error, TransientExportError)
    assert clock.waits == [1, 2, 4]  # 7 s elapsed; 7 + 5 > 10
    assert script.attempts == 4


async def test_zero_max_elapsed_time_retries_forever() -> None:
    clock = FakeClock()
    script = Script([transient() for _ in range(50)])
    result = await Retrier(settings(max_elapsed_time=0), clock=clock).run(script)
    assert result.outcome is Outcome.SENT and script.attempts == 51


async def test_permanent_error_stops_at_once() -> None:
    clock = FakeClock()
    script = Script([PermanentExportError("bad request")])
    result = await Retrier(settings(), clock=clock).run(script)
    assert result.outcome is Outcome.PERMANENT and script.attempts == 1 and clock.waits == []


async def test_disabled_retry_makes_one_attempt() -> None:
    clock = FakeClock()
    script = Script([transient(retry_after=3)])
    result = await Retrier(settings(enabled=False), clock=clock).run(script)
    assert (result.outcome, result.retry_after, script.attempts) == (Outcome.EXHAUSTED, 3, 1)


async def test_stop_interrupts_a_long_wait_and_later_runs_try_once() -> None:
    retrier = Retrier(settings(initial_interval=3600, max_interval=3600, max_elapsed_time=0), clock=SystemClock())
    script = Script([transient() for _ in range(10)])
    task = asyncio.create_task(retrier.run(script))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    retrier.stop()
    result = await asyncio.wait_for(task, 1)
    assert result.outcome is Outcome.STOPPED and time.monotonic() - started < 0.5
    assert script.attempts == 2  # the interrupted wait still ends in one last attempt
    again = Script([transient()])
    assert (await retrier.run(again)).outcome is Outcome.STOPPED and again.attempts == 1


async def test_a_batch_waiting_at_stop_is_sent_if_the_backend_is_back() -> None:
    """Shutdown must not drop a batch that sat in backoff while the backend came back."""
    retrier = Retrier(settings(initial_interval=3600, max_interval=3600, max_elapsed_time=0), clock=SystemClock())
    script = Script([transient()])
    task = asyncio.create_task(retrier.run(script))
    await asyncio.sleep(0.05)
    retrier.stop()
    result = await asyncio.wait_for(task, 1)
    assert (result.outcome, result.value, script.attempts) == (Outcome.SENT, "ok", 2)


@pytest.mark.parametrize("interrupted", [False, True])
async def test_system_clock_sleep(interrupted: bool) -> None:
    event = asyncio.Event()
    if interrupted:
        event.set()
    started = time.monotonic()
    assert await SystemClock().sleep(0.05, event) is not interrupted
    assert (time.monotonic() - started < 0.04) is interrupted
