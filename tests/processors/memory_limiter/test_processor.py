"""The memory limiter: limits, refusing and recovering, gc at the hard limit, cgroups, lifecycle."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gputally.errors import Refused
from gputally.otlp.batch import Batch, Signal
from gputally.processors.memory_limiter import (
    Limits,
    MemoryLimiter,
    MemoryLimiterConfig,
    cgroup_limit,
    factory,
    total_memory,
)
from tests.processors.builders import context, metric, metrics_batch, resource_metrics

TESTDATA = Path(__file__).parent / "testdata"
MIB = 1 << 20


class Memory:
    """A fake RSS reader: returns ``usage`` (MiB), or the next of ``after_gc`` once collected."""

    def __init__(self, usage: int) -> None:
        self.usage = usage
        self.after_gc: list[int] = []
        self.collections = 0
        self.fail = False

    def read(self) -> int:
        if self.fail:
            raise OSError("cannot read /proc")
        return self.usage * MIB

    def collect(self) -> None:
        self.collections += 1
        if self.after_gc:
            self.usage = self.after_gc.pop(0)


class Clock:
    """A fake sleep for the check loop: each :meth:`tick` ends one sleep and lets one check run."""

    def __init__(self) -> None:
        self.slept: list[float] = []
        self._wake: asyncio.Future[None] | None = None

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self._wake = asyncio.get_running_loop().create_future()
        await self._wake

    async def tick(self) -> None:
        wake = self._wake
        assert wake is not None, "the loop is not sleeping"
        wake.set_result(None)
        for _ in range(100):  # until the loop has checked and gone back to sleep
            if self._wake is not wake:
                return
            await asyncio.sleep(0)
        raise AssertionError("the check loop did not come back to sleep")


def limiter(memory: Memory, clock: Clock | None = None, **section: Any) -> MemoryLimiter:
    config = MemoryLimiterConfig.model_validate({"limit_mib": 100, **section})
    return MemoryLimiter(
        config,
        read_usage=memory.read,
        collect=memory.collect,
        total=lambda: 1000 * MIB,
        sleep=(clock or Clock()).sleep,
    )


def request() -> Batch:
    return metrics_batch(resource_metrics({}, [metric("gauge", "g", [{}])]))


def state_logs(records: Iterable[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.name.startswith("gputally.processors.memory_limiter")]


@pytest.mark.parametrize(
    ("section", "hard", "soft"),
    [
        ({"limit_mib": 100}, 100, 80),
        ({"limit_mib": 100, "spike_limit_mib": 30}, 100, 70),
        ({"limit_mib": 100, "spike_limit_mib": 0}, 100, 100),
        ({"limit_percentage": 50}, 500, 400),
        ({"limit_percentage": 50, "spike_limit_percentage": 10}, 500, 400),
        ({"limit_percentage": 80, "spike_limit_percentage": 5}, 800, 750),
    ],
)
def test_limits(section: dict[str, Any], hard: int, soft: int) -> None:
    limits = Limits.from_config(MemoryLimiterConfig.model_validate(section), total=lambda: 1000 * MIB)
    assert (limits.hard, limits.soft) == (hard * MIB, soft * MIB)


async def test_refuses_above_the_soft_limit_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    memory = Memory(usage=50)
    proc = limiter(memory, check_interval="2s")
    batch = request()
    raw = batch.serialize()
    proc.check()
    assert await proc.process(batch) is batch
    memory.usage = 81  # soft limit is 80 MiB
    with caplog.at_level(logging.INFO):
        proc.check()
        proc.check()  # still above: no second log line
        with pytest.raises(Refused, match="81 MiB is above the soft limit 80 MiB") as refused:
            await proc.process(batch)
        assert refused.value.retry_after == 2.0
        assert batch.serialize() is raw  # untouched
        memory.usage = 80
        proc.check()
        proc.check()
    assert await proc.process(batch) is batch
    assert memory.collections == 0  # never above the hard limit
    logs = state_logs(caplog.records)
    assert len(logs) == 2
    assert "refusing data" in logs[0] and "accepting data" in logs[1]


async def test_collects_garbage_once_per_check_above_the_hard_limit() -> None:
    memory = Memory(usage=120)
    proc = limiter(memory)
    proc.check()
    assert memory.collections == 1 and proc.refusing
    proc.check()
    assert memory.collections == 2
    memory.usage = 90  # between soft and hard: refuse, but no collection
    proc.check()
    assert memory.collections == 2 and proc.refusing


async def test_the_verdict_uses_the_reading_after_collection() -> None:
    memory = Memory(usage=150)
    memory.after_gc = [60]
    proc = limiter(memory)
    proc.check()
    assert memory.collections == 1
    assert not proc.refusing
    assert proc.usage == 60 * MIB


async def test_background_checks_follow_the_clock() -> None:
    memory = Memory(usage=10)
    clock = Clock()
    proc = limiter(memory, clock, check_interval="250ms")
    await proc.start()
    try:
        await asyncio.sleep(0)
        assert clock.slept == [0.25]
        memory.usage = 95
        assert not proc.refusing  # not measured yet
        await clock.tick()
        assert proc.refusing
        with pytest.raises(Refused):
            await proc.process(request())
        memory.usage = 20
        await clock.tick()
        assert not proc.refusing
        assert clock.slept == [0.25, 0.25, 0.25]
    finally:
        await proc.shutdown()


async def test_start_measures_at_once() -> None:
    memory = Memory(usage=99)
    proc = limiter(memory)
    await proc.start()
    try:
        with pytest.raises(Refused):
            await proc.process(request())
    finally:
        await proc.shutdown()


async def test_a_failing_measurement_keeps_the_verdict_and_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    memory = Memory(usage=90)
    clock = Clock()
    proc = limiter(memory, clock)
    await proc.start()
    try:
        await asyncio.sleep(0)
        memory.fail = True
        with caplog.at_level(logging.INFO):
            await clock.tick()
            await clock.tick()
            assert proc.refusing  # last verdict kept
            memory.fail, memory.usage = False, 10
            await clock.tick()
        assert not proc.refusing
        failures = [r for r in caplog.records if "memory check failed" in r.getMessage()]
        assert len(failures) == 1  # logged once, not every interval
    finally:
        await proc.shutdown()


async def test_lifecycle() -> None:
    clock = Clock()
    proc = limiter(Memory(usage=10), clock)
    await proc.shutdown()  # before start
    await proc.start()
    await proc.start()  # a second start adds no second loop
    await asyncio.sleep(0)
    tasks = [t for t in asyncio.all_tasks() if t.get_name().endswith("memory check")]
    assert len(tasks) == 1
    await asyncio.wait_for(proc.shutdown(), 1)
    assert tasks[0].cancelled()
    await proc.shutdown()


def test_factory_names_the_limiter_after_its_component_id() -> None:
    proc = factory.create(factory.parse({"limit_mib": 64}), context("memory_limiter/gpu"), Signal.METRICS)
    assert isinstance(proc, MemoryLimiter)
    assert proc.name == "memory_limiter/gpu"
    assert proc.limits == Limits(hard=64 * MIB, soft=64 * MIB - 64 * MIB // 5)


# --- total memory and cgroups -------------------------------------------------------------


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limit(tmp_path: Path) -> None:
    write(tmp_path / "memory.max", "1073741824\n")
    assert cgroup_limit(tmp_path) == 1 << 30
    assert total_memory(cgroup_root=tmp_path, physical=4 << 30) == 1 << 30


def test_cgroup_v2_without_a_limit(tmp_path: Path) -> None:
    write(tmp_path / "memory.max", "max\n")
    assert cgroup_limit(tmp_path) is None
    assert total_memory(cgroup_root=tmp_path, physical=4 << 30) == 4 << 30


def test_cgroup_v1_limit(tmp_path: Path) -> None:
    write(tmp_path / "memory" / "memory.limit_in_bytes", "536870912\n")
    assert cgroup_limit(tmp_path) == 512 << 20


def test_cgroup_v1_unlimited_is_capped_by_physical_memory(tmp_path: Path) -> None:
    write(tmp_path / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    assert total_memory(cgroup_root=tmp_path, physical=8 << 30) == 8 << 30


def test_no_cgroup_files_means_physical_memory(tmp_path: Path) -> None:
    assert cgroup_limit(tmp_path) is None
    assert total_memory(cgroup_root=tmp_path, physical=3 << 30) == 3 << 30


def test_unreadable_cgroup_value_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path / "memory.max", "lots\n")
    write(tmp_path / "memory" / "memory.limit_in_bytes", "2147483648\n")
    assert cgroup_limit(tmp_path) == 2 << 30
    assert "lots" in caplog.text


def test_percentage_limit_uses_the_cgroup_limit(tmp_path: Path) -> None:
    write(tmp_path / "memory.max", str(200 * MIB))
    config = MemoryLimiterConfig.model_validate({"limit_percentage": 50})
    proc = MemoryLimiter(config, cgroup_root=tmp_path, read_usage=lambda: 0)
    assert proc.limits == Limits(hard=100 * MIB, soft=80 * MIB)


# --- config -------------------------------------------------------------------------------


def test_config_from_yaml() -> None:
    config = factory.parse(yaml.safe_load((TESTDATA / "memory_limiter.yaml").read_text()))
    assert config == MemoryLimiterConfig.model_validate(
        {"check_interval": 0.5, "limit_percentage": 75, "spike_limit_percentage": 15}
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({}, "set exactly one of limit_mib and limit_percentage"),
        ({"limit_mib": 100, "limit_percentage": 50}, "set exactly one of limit_mib and limit_percentage"),
        ({"limit_mib": 100, "spike_limit_mib": 100}, "spike_limit_mib must be less than limit_mib"),
        ({"limit_percentage": 50, "spike_limit_percentage": 60}, "spike_limit_percentage must be less than"),
        ({"limit_percentage": 50, "spike_limit_mib": 10}, "spike_limit_mib goes with limit_mib"),
        ({"limit_mib": 50, "spike_limit_percentage": 10}, "spike_limit_percentage goes with limit_percentage"),
        ({"limit_percentage": 101}, "less than or equal to 100"),
        ({"limit_mib": 0}, "greater than 0"),
        ({"limit_mib": 10, "check_interval": 0}, "greater than 0"),
        ({"limit_mib": 10, "check_interval": "often"}, "is not a duration"),
        ({"limit_mb": 10}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_config(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        factory.parse(section)
