"""The cache of what is known about Slurm jobs (:class:`JobCache`; a job is a :class:`~.model.JobInfo`).

The processor never waits on Slurm: it asks the cache, which answers from memory at once and
queues what it does not know (or knows too long) for its background task. So a job first
seen is attributed with what its cgroup says (ID, step, uid) and gets its metadata a moment
later; a controller outage leaves the cached metadata flowing while the gap is counted.

One lookup per job, not per data point: entries live ``ttl`` (answers "no such job" live
``negative_ttl``), stale entries keep being served while their refresh is pending, and the
least recently used entry goes once ``max_entries`` is reached. GPU allocations (which job
holds which GRES index on a node) come from one ``running_jobs`` call per
``refresh_interval``, made only while some node's GPUs are being asked about.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gputally.util.backoff import Backoff

from .errors import SlurmError
from .model import JobInfo

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = ["JobCache"]

log = logging.getLogger(__name__)

_BULK = 2
"""With this many jobs waiting, one ``running_jobs`` call is cheaper than a lookup each."""
_NODE_IDLE_INTERVALS = 10
"""A node whose GPUs were not asked about for this many refresh intervals is no longer refreshed."""
_FIRST_BACKOFF = 1.0


@dataclass(slots=True)
class _Entry:
    info: JobInfo | None
    fetched: float


class JobCache:
    """Job metadata and GPU allocations, answered from memory and refreshed by :meth:`run`.

    ``on_lookup(outcome)`` is called once per job lookup (``found``, ``not_found``, ``error``),
    ``on_error()`` once per failed backend call; the processor counts them as self-metrics.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        ttl: float,
        negative_ttl: float,
        max_entries: int,
        refresh_interval: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        on_lookup: Callable[[str], None] = lambda outcome: None,
        on_error: Callable[[], None] = lambda: None,
    ) -> None:
        self.backend = backend
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._max_entries = max_entries
        self._refresh_interval = refresh_interval
        self._clock = clock
        self._wall_clock = wall_clock
        self._on_lookup = on_lookup
        self._on_error = on_error
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._pending: dict[int, None] = {}  # an ordered set
        self._nodes: dict[str, float] = {}  # node -> last asked about
        self._allocations: dict[str, dict[int, int]] = {}  # node -> GRES index -> job ID
        self._allocations_at: float | None = None
        self._wake = asyncio.Event()
        self._busy = False
        self._down_since: float | None = None
        self._failed = 0
        self._backoff = Backoff(initial=_FIRST_BACKOFF, maximum=max(refresh_interval, _FIRST_BACKOFF))
        self._retry_at = 0.0
        self.generation = 0
        """Grows whenever an answer changes (a job stored, allocations reloaded): memoised
        attributions older than it are stale."""

    # --- the hot path: memory only --------------------------------------------------------

    def get(self, job_id: int) -> JobInfo | None:
        """What is known of ``job_id`` now; queues a lookup when nothing (or something stale) is."""
        entry = self._entries.get(job_id)
        if entry is None:
            self._request(job_id)
            return None
        self._entries.move_to_end(job_id)
        age = self._clock() - entry.fetched
        if age >= (self._ttl if entry.info is not None else self._negative_ttl):
            self._request(job_id)
        return entry.info

    def allocations(self, node: str) -> Mapping[int, int]:
        """GRES GPU index -> job ID on ``node`` as of the last refresh; keeps ``node`` refreshed."""
        if node not in self._nodes:
            self._wake.set()  # a node not seen before: load its allocations now
        self._nodes[node] = self._clock()
        return self._allocations.get(node, {})

    def __len__(self) -> int:
        return len(self._entries)

    def degraded(self) -> str | None:
        if self._down_since is None:
            return None
        since = datetime.fromtimestamp(self._down_since, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return (
            f"{self.backend.name} unreachable since {since} ({self._failed} lookups failed); "
            "attributing from cache"
        )

    def _request(self, job_id: int) -> None:
        if job_id in self._pending:
            return
        if len(self._pending) >= self._max_entries:
            return  # bounded: the job is asked for again on its next data
        self._pending[job_id] = None
        self._wake.set()

    # --- the background side --------------------------------------------------------------

    async def run(self) -> None:
        """Answer queued lookups and refresh allocations until cancelled."""
        while True:
            now = self._clock()
            delay = self._next_due(now) - now
            if delay > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):  # due: time to work
                    await asyncio.wait_for(self._wake.wait(), None if math.isinf(delay) else delay)
                if self._clock() < self._retry_at:
                    continue
            self._busy = True
            try:
                await self._work()
            finally:
                self._busy = False

    async def settle(self) -> None:
        """Return once every lookup asked for so far is answered (or has failed) and every
        node asked about has its allocations loaded. For tests and one-shot tools."""
        while True:
            failing = self._down_since is not None
            waiting = self._pending or (self._nodes and self._allocations_at is None)
            if not self._busy and (failing or not waiting):
                return
            await asyncio.sleep(0.005)

    def _next_due(self, now: float) -> float:
        if now < self._retry_at:
            return self._retry_at
        if self._pending:
            return now
        if self._nodes:
            if self._allocations_at is None:
                return now
            return self._allocations_at + self._refresh_interval
        return math.inf

    async def _work(self) -> None:
        now = self._clock()
        self._forget_idle_nodes(now)
        stale_allocations = self._nodes and (
            self._allocations_at is None or now - self._allocations_at >= self._refresh_interval
        )
        if stale_allocations or len(self._pending) >= _BULK:
            try:
                jobs = await self.backend.running_jobs()
            except Exception as exc:  # noqa: BLE001 - backends translate; anything else is counted too
                self._failure(exc)
                return
            self._succeeded()
            self._apply_running(jobs, now)
        for job_id in list(self._pending):
            entry = self._entries.get(job_id)
            if entry is not None and entry.info is not None and entry.fetched >= now:
                del self._pending[job_id]  # answered by running_jobs just now
                continue
            try:
                info = await self.backend.get_job(job_id)
            except Exception as exc:  # noqa: BLE001
                self._on_lookup("error")
                self._failure(exc)
                return
            self._succeeded()
            self._on_lookup("found" if info is not None else "not_found")
            self._pending.pop(job_id, None)
            self._store(job_id, info, self._clock())

    def _apply_running(self, jobs: list[JobInfo], now: float) -> None:
        allocations: dict[str, dict[int, int]] = {}
        for job in jobs:
            for node, indexes in job.gpus:
                slots = allocations.setdefault(node, {})
                for index in indexes:
                    slots[index] = job.job_id
            wanted = job.job_id in self._pending or job.job_id in self._entries
            if wanted or any(node in self._nodes for node, _ in job.gpus):
                self._store(job.job_id, job, now)
        self._allocations = allocations
        self._allocations_at = now
        self.generation += 1

    def _store(self, job_id: int, info: JobInfo | None, now: float) -> None:
        self.generation += 1
        self._entries[job_id] = _Entry(info, now)
        self._entries.move_to_end(job_id)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def _forget_idle_nodes(self, now: float) -> None:
        horizon = now - _NODE_IDLE_INTERVALS * self._refresh_interval
        for node in [n for n, seen in self._nodes.items() if seen < horizon]:
            del self._nodes[node]

    def _failure(self, exc: BaseException) -> None:
        self._on_error()
        self._failed += 1
        if self._down_since is None:
            self._down_since = self._wall_clock()
            if isinstance(exc, SlurmError):
                log.warning("slurm backend %s unreachable: %s; attributing from cache", self.backend.name, exc)
            else:
                log.error("slurm backend %s failed; attributing from cache", self.backend.name, exc_info=exc)
        self._retry_at = self._clock() + self._backoff.next()

    def _succeeded(self) -> None:
        if self._down_since is not None:
            log.info(
                "slurm backend %s reachable again after %.0f s (%d lookups failed meanwhile)",
                self.backend.name, self._wall_clock() - self._down_since, self._failed,
            )
        self._down_since = None
        self._failed = 0
        self._backoff.reset()
        self._retry_at = 0.0
