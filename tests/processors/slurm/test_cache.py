"""JobCache: one lookup per job, TTLs, bounds, allocation refresh, and outages."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from support.clock import Clock

from gputally.processors.slurm import JobCache, JobInfo
from tests.processors.slurm.fakes import FakeBackend

ALICE = JobInfo(job_id=1, user="alice", state="RUNNING", nodes="n1", gpus=(("n1", (0,)),))
BOB = JobInfo(job_id=2, user="bob", state="RUNNING", nodes="n1", gpus=(("n1", (1,)),))
DONE = JobInfo(job_id=3, user="carol", state="COMPLETED", nodes="n1")


@pytest.fixture
async def running() -> AsyncIterator[Callable[..., Any]]:
    tasks: list[asyncio.Task[None]] = []

    def start(cache: JobCache) -> JobCache:
        tasks.append(asyncio.create_task(cache.run()))
        return cache

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def cache(backend: FakeBackend, clock: Clock, **options: Any) -> JobCache:
    settings: dict[str, Any] = {"ttl": 60, "negative_ttl": 10, "max_entries": 100, "refresh_interval": 30}
    settings.update(options)
    return JobCache(backend, clock=clock, **settings)


async def test_one_lookup_per_job(running: Callable[..., Any]) -> None:
    backend, clock = FakeBackend(ALICE, DONE), Clock()
    jobs = running(cache(backend, clock))
    assert jobs.get(3) is None  # not known yet: asked for, answered later
    for _ in range(100):
        jobs.get(3)
    await jobs.settle()
    assert jobs.get(3) == DONE
    assert backend.calls == {"get_job": 1}


async def test_stale_entries_are_served_while_refreshed(running: Callable[..., Any]) -> None:
    backend, clock = FakeBackend(ALICE), Clock()
    jobs = running(cache(backend, clock))
    jobs.get(1)
    await jobs.settle()
    backend.jobs[1] = JobInfo(job_id=1, user="alice", qos="high", state="RUNNING")
    clock.now += 59
    assert jobs.get(1) == ALICE
    await jobs.settle()
    assert backend.calls["get_job"] == 1  # still fresh
    clock.now += 2
    assert jobs.get(1) == ALICE  # stale but served; its refresh is queued
    await jobs.settle()
    assert jobs.get(1) is not None and jobs.get(1).qos == "high"  # type: ignore[union-attr]
    assert backend.calls["get_job"] == 2


async def test_unknown_jobs_are_negatively_cached(running: Callable[..., Any]) -> None:
    lookups: list[str] = []
    backend, clock = FakeBackend(), Clock()
    jobs = running(cache(backend, clock, on_lookup=lookups.append))
    jobs.get(99)
    await jobs.settle()
    for _ in range(5):
        assert jobs.get(99) is None
    await jobs.settle()
    assert lookups == ["not_found"]
    clock.now += 11
    jobs.get(99)
    await jobs.settle()
    assert lookups == ["not_found", "not_found"]


async def test_bounded_least_recently_used_first(running: Callable[..., Any]) -> None:
    backend, clock = FakeBackend(*(JobInfo(job_id=n) for n in range(1, 6))), Clock()
    jobs = running(cache(backend, clock, max_entries=3))
    for n in (1, 2, 3):
        jobs.get(n)
        await jobs.settle()
    jobs.get(1)  # used again: 2 is now the least recently used
    jobs.get(4)
    await jobs.settle()
    assert len(jobs) == 3
    calls = backend.calls["get_job"]
    assert jobs.get(1) is not None and jobs.get(3) is not None and jobs.get(4) is not None
    assert jobs.get(2) is None  # evicted: looked up again
    await jobs.settle()
    assert backend.calls["get_job"] == calls + 1


async def test_many_new_jobs_take_one_call(running: Callable[..., Any]) -> None:
    backend, clock = FakeBackend(ALICE, BOB, DONE), Clock()
    jobs = running(cache(backend, clock))
    for n in (1, 2, 3):
        jobs.get(n)
    await jobs.settle()
    assert [jobs.get(n) for n in (1, 2, 3)] == [ALICE, BOB, DONE]
    assert backend.calls == {"running_jobs": 1, "get_job": 1}  # only the finished job singly


async def test_allocations_refresh_only_while_asked_for(running: Callable[..., Any]) -> None:
    backend, clock = FakeBackend(ALICE), Clock()
    jobs = running(cache(backend, clock, refresh_interval=0.05))
    await asyncio.sleep(0.2)
    assert backend.calls["running_jobs"] == 0  # nobody asked about a node
    assert jobs.allocations("n1") == {}
    await jobs.settle()
    assert jobs.allocations("n1") == {0: 1}
    assert jobs.get(1) == ALICE  # its metadata came along
    backend.jobs[2] = BOB
    clock.now += 0.06
    await asyncio.sleep(0.2)
    assert jobs.allocations("n1") == {0: 1, 1: 2}
    assert backend.calls["get_job"] == 0
    clock.now += 10  # nobody asked about n1 for a long time: it is no longer refreshed
    await asyncio.sleep(0.2)
    calls = backend.calls["running_jobs"]
    await asyncio.sleep(0.2)
    assert backend.calls["running_jobs"] == calls


async def test_outage_keeps_cache_and_says_so(running: Callable[..., Any]) -> None:
    errors: list[None] = []
    lookups: list[str] = []
    backend, clock = FakeBackend(ALICE, BOB), Clock()
    jobs = running(cache(backend, clock, on_error=lambda: errors.append(None), on_lookup=lookups.append))
    jobs.get(1)
    await jobs.settle()
    assert jobs.degraded() is None
    backend.down = True
    clock.now += 61  # alice is stale: her refresh fails, her metadata stays
    assert jobs.get(1) == ALICE
    jobs.get(2)
    await asyncio.wait_for(jobs.settle(), 2)
    reason = jobs.degraded()
    assert reason is not None and re.fullmatch(
        r"fake unreachable since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\d+ lookups failed\); attributing from cache", reason
    )
    assert jobs.get(1) == ALICE and jobs.get(2) is None
    assert errors  # the failed calls were counted
    backend.down = False
    clock.now += 5
    await asyncio.wait_for(_until(lambda: jobs.get(2) == BOB), 5)  # retried after the backoff
    assert jobs.degraded() is None


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.02)
