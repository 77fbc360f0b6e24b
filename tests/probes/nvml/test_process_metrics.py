"""Per-process sampling across cycles, on the three-workload timeseries and the two-workload snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from gputally.probes.nvml.errors import NvmlCallFailed
from gputally.probes.nvml.process_metrics import ProcessSampler, merge_processes
from gputally.probes.nvml.replay import ReplaySource, load_recording
from tests.probes.nvml.helpers import TIMESERIES, pids, process, recording, run_cycles, value

GENERAL = {"hw.gpu.task": "general"}
TRAINER, NOTEBOOK, HOLDER = 448, 449, 450


def test_sampler_passes_the_newest_timestamp_and_keys_by_the_sample_pid() -> None:
    sampler = ProcessSampler()
    asked: list[int] = []

    def fetch(last_seen: int) -> list[dict[str, Any]]:
        asked.append(last_seen)
        return [
            {"pid": 7, "timeStamp": 1000, "smUtil": 10, "memUtil": 1, "encUtil": 0, "decUtil": 0},
            {"pid": 9, "timeStamp": 3000, "smUtil": 90, "memUtil": 9, "encUtil": 0, "decUtil": 0},
            {"pid": 7, "timeStamp": 2000, "smUtil": 20, "memUtil": 2, "encUtil": 0, "decUtil": 0},
        ]

    samples = sampler.sample(fetch)
    assert samples[7]["smUtil"] == 20 and samples[9]["smUtil"] == 90  # each pid its own, newest
    sampler.sample(fetch)
    assert asked == [0, 3000]


def test_not_found_means_no_samples_and_keeps_the_timestamp() -> None:
    sampler = ProcessSampler()
    sampler.last_seen = 5000

    def none(last_seen: int) -> list[dict[str, Any]]:
        raise NvmlCallFailed("process_utilization", 6)

    assert sampler.sample(none) == {}
    assert sampler.last_seen == 5000

    def lost(last_seen: int) -> list[dict[str, Any]]:
        raise NvmlCallFailed("process_utilization", 15)

    with pytest.raises(NvmlCallFailed):
        sampler.sample(lost)


def test_a_process_in_both_lists_counts_once() -> None:
    compute = [{"pid": 1, "usedGpuMemory": 100}, {"pid": 2, "usedGpuMemory": None}]
    graphics = [{"pid": 1, "usedGpuMemory": 100}]
    assert merge_processes(compute, graphics) == {1: 100, 2: None}


@pytest.fixture(scope="module")
def series_cycles() -> Any:
    import asyncio

    source = ReplaySource.from_file(TIMESERIES)
    cycles = asyncio.run(run_cycles(source, 10))
    return source, cycles


def test_sampler_asks_with_the_timestamps_the_recording_was_made_with(series_cycles: Any) -> None:
    source, _ = series_cycles
    recorded = [s["process_utilization_last_seen_arg"] for s in load_recording(TIMESERIES)["snapshots"]]
    assert source.last_seen_args == recorded
    assert not {TRAINER, NOTEBOOK, HOLDER} & set(source.last_seen_args)  # never a pid


def test_trainer_is_busy_every_cycle(series_cycles: Any) -> None:
    _, cycles = series_cycles
    sm = [value(process(c, TRAINER), "gputally.gpu.process.utilization", GENERAL) for c in cycles]
    assert sm == pytest.approx([0.79, 0.99, 0.99, 0.88, 0.90, 0.90, 0.99, 0.99, 0.98, 0.98])
    assert all(value(process(c, TRAINER), "gputally.gpu.process.memory.usage") == 14164164608 for c in cycles)


def test_notebook_shows_its_duty_cycle_then_leaves(series_cycles: Any) -> None:
    _, cycles = series_cycles
    sm = [value(process(c, NOTEBOOK), "gputally.gpu.process.utilization", GENERAL) for c in cycles[:6]]
    assert sm == pytest.approx([0.11, 0.0, 0.0, 0.10, 0.09, 0.10])  # no new sample at t1, t2: idle then
    assert [NOTEBOOK in pids(c) for c in cycles] == [True] * 6 + [False] * 4


def test_idle_holder_gets_memory_and_zero_utilization(series_cycles: Any) -> None:
    _, cycles = series_cycles
    for cycle in cycles:
        holder = process(cycle, HOLDER)
        assert value(holder, "gputally.gpu.process.memory.usage") == 3055550464
        assert value(holder, "gputally.gpu.process.utilization", GENERAL) == 0.0
        assert value(holder, "gputally.gpu.process.memory.activity") == 0.0


def test_processes_carry_their_cgroups(series_cycles: Any) -> None:
    _, cycles = series_cycles
    cgroups = {pid: process(cycles[0], pid).attributes["process.linux.cgroup"] for pid in (TRAINER, NOTEBOOK, HOLDER)}
    assert "cri-containerd-abab" in cgroups[TRAINER]
    assert "crio-cdcd" in cgroups[NOTEBOOK]
    assert cgroups[HOLDER] == "0::/system.slice/slurmstepd.scope/job_90210/step_0/user/task_0"
    assert not any(c.endswith("\n") for c in cgroups.values())


async def test_two_workloads_busy_idle_then_none() -> None:
    busy, idle, empty = await run_cycles(ReplaySource(recording()), 3)
    assert pids(busy) == [628, 629] and pids(idle) == [629] and pids(empty) == []
    assert value(process(busy, 628), "gputally.gpu.process.utilization", GENERAL) == pytest.approx(0.69)
    assert value(process(busy, 628), "gputally.gpu.process.memory.activity") == pytest.approx(0.17)
    assert value(process(busy, 629), "gputally.gpu.process.utilization", GENERAL) == 0.0
    assert value(process(idle, 629), "gputally.gpu.process.memory.usage") == 4129292288
    attrs = process(busy, 629).attributes
    assert attrs["hw.id"] == "GPU-1e061ec2-3930-fe87-1e34-cb91101c1bd9"
    assert attrs["process.executable.name"] == "python3" and attrs["process.owner"] == "root"
    assert attrs["process.user.id"] == 0 and attrs["host.name"] == "node-a"
    assert "kubepods-burstable-pod6ee8558e" in str(attrs["process.linux.cgroup"])


async def test_unsupported_process_utilization_gives_memory_without_made_up_zeros() -> None:
    data = recording()
    for snapshot in data["snapshots"]:
        snapshot["process_utilization"] = {"nvml_error": "Not Supported"}
    source = ReplaySource(data)
    first, _ = await run_cycles(source, 2)
    holder = process(first, 629)
    assert value(holder, "gputally.gpu.process.memory.usage") == 4129292288
    assert value(holder, "gputally.gpu.process.utilization", GENERAL) is None
    assert source.calls["process_utilization"] == 1  # not asked again
