"""The ``memory_limiter`` processor at run time.

Measuring memory costs a system call, so it happens on a timer in a background task, not
per request: :meth:`MemoryLimiter.process` only reads the last verdict. Refusing early
(with a retry hint) lets senders keep their data and back off, where running out of memory
would lose everything in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from gputally.errors import Refused
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, Processor

from .config import MemoryLimiterConfig
from .memory import DEFAULT_CGROUP_ROOT, rss_reader, total_memory

__all__ = ["Limits", "MemoryLimiter", "create"]

logger = logging.getLogger(__name__)

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    """Thresholds in bytes: refuse data above ``soft``, also force a collection above ``hard``."""

    hard: int
    soft: int

    @classmethod
    def from_config(cls, config: MemoryLimiterConfig, *, total: Callable[[], int]) -> Limits:
        """``total`` (bytes the process may use) is read only for percentage limits."""
        if config.limit_mib is not None:
            hard = config.limit_mib * MIB
            spike = config.spike_limit_mib * MIB if config.spike_limit_mib is not None else hard // 5
        else:
            assert config.limit_percentage is not None  # the config demands one of the two
            available = total()
            hard = available * config.limit_percentage // 100
            if config.spike_limit_percentage is not None:
                spike = available * config.spike_limit_percentage // 100
            else:
                spike = hard // 5
        return cls(hard=hard, soft=hard - spike)


class MemoryLimiter(Processor):
    """Refuses data while this process's memory is above the soft limit."""

    def __init__(
        self,
        config: MemoryLimiterConfig,
        *,
        name: str = "memory_limiter",
        read_usage: Callable[[], int] | None = None,
        cgroup_root: Path = DEFAULT_CGROUP_ROOT,
        total: Callable[[], int] | None = None,
        collect: Callable[[], object] = gc.collect,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        announce: bool = True,
    ) -> None:
        """``announce``: log the limits on start (the first of an ID's instances does, not one
        per pipeline). ``read_usage`` (bytes in use), ``total`` (bytes allowed), ``collect`` and ``sleep``
        (the clock of the check loop) default to the real ones; tests pass fakes."""
        self.name = name
        self.interval = config.check_interval
        self.limits = Limits.from_config(
            config, total=total if total is not None else lambda: total_memory(cgroup_root=cgroup_root)
        )
        self._read_usage = read_usage if read_usage is not None else rss_reader()
        self._collect = collect
        self._sleep = sleep
        self._refusing = False
        self._usage = 0
        self._task: asyncio.Task[None] | None = None
        self._check_failing = False
        self._announce = announce

    @property
    def refusing(self) -> bool:
        """True while usage, at the last check, was above the soft limit."""
        return self._refusing

    @property
    def usage(self) -> int:
        """Bytes in use at the last check."""
        return self._usage

    async def start(self) -> None:
        if self._task is not None:
            return
        self.check()  # a verdict before the first request, not one interval later
        self._task = asyncio.create_task(self._check_loop(), name=f"{self.name} memory check")
        if self._announce:
            logger.info(
                "%s: limits %d MiB (soft) / %d MiB (hard), checked every %gs",
                self.name,
                self.limits.soft // MIB,
                self.limits.hard // MIB,
                self.interval,
            )

    async def shutdown(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def process(self, batch: Batch) -> Batch | None:
        if self._refusing:
            raise Refused(
                f"memory usage {self._usage // MIB} MiB is above the soft limit {self.limits.soft // MIB} MiB",
                retry_after=self.interval,
            )
        return batch

    def check(self) -> None:
        """Measure once and update the verdict; above the hard limit, collect garbage first."""
        usage = self._read_usage()
        if usage > self.limits.hard:
            self._collect()
            usage = self._read_usage()
        self._usage = usage
        refusing = usage > self.limits.soft
        if refusing == self._refusing:
            return
        self._refusing = refusing
        if refusing:
            logger.warning(
                "%s: memory usage %d MiB is above the soft limit %d MiB; refusing data",
                self.name,
                usage // MIB,
                self.limits.soft // MIB,
            )
        else:
            logger.info(
                "%s: memory usage %d MiB is below the soft limit %d MiB again; accepting data",
                self.name,
                usage // MIB,
                self.limits.soft // MIB,
            )

    async def _check_loop(self) -> None:
        while True:
            await self._sleep(self.interval)
            try:
                self.check()
            except Exception:  # never crash after startup; keep the last verdict
                if not self._check_failing:
                    logger.exception("%s: memory check failed; keeping the last verdict", self.name)
                self._check_failing = True
            else:
                if self._check_failing:
                    logger.info("%s: memory check works again", self.name)
                self._check_failing = False


def create(config: MemoryLimiterConfig, context: ComponentContext, signal: Signal) -> MemoryLimiter:
    """Factory hook: one limiter per pipeline, each with its own check task."""
    del signal  # the verdict is the same for every signal
    made: list[MemoryLimiter] = context.shared.get(__name__, context.id, list)
    made.append(MemoryLimiter(config, name=context.id, announce=not made))
    return made[-1]
