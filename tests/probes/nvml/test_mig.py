"""MIG on (a constructed variant of the recording) and off (the recording as it is)."""

from __future__ import annotations

import pytest

from gputally.probes.nvml.replay import ReplaySource
from tests.probes.nvml.helpers import GPU_UUID, MIG_A, MIG_B, gpu, mig_variant, process, recording, run_cycles, value


def migs(cycle):  # type: ignore[no-untyped-def]
    return {e.attributes["hw.id"]: e for e in cycle.entities if e.kind == "mig"}


async def test_each_gpu_instance_is_its_own_entity() -> None:
    (cycle,) = await run_cycles(ReplaySource(mig_variant(recording())), 1)
    devices = migs(cycle)
    assert set(devices) == {MIG_A, MIG_B}
    a = devices[MIG_A].attributes
    assert a["hw.parent"] == GPU_UUID
    assert a["gputally.gpu.mig.gpu_instance_id"] == 1 and a["gputally.gpu.mig.compute_instance_id"] == 0
    assert a["hw.model"] == "NVIDIA H200 MIG 3g.71gb" and a["hw.name"] == "nvidia0/gi1"
    assert gpu(cycle).attributes["gputally.gpu.mig.enabled"] is True


async def test_instances_have_their_memory_processes_and_gpm() -> None:
    (cycle,) = await run_cycles(ReplaySource(mig_variant(recording())), 1)
    a, b = migs(cycle)[MIG_A], migs(cycle)[MIG_B]
    assert value(a, "hw.gpu.memory.usage") == 9869197312
    assert value(a, "hw.gpu.memory.limit") == 71 * 1024**3
    assert value(b, "hw.gpu.memory.usage") == 4129292288
    assert value(a, "gputally.gpu.sm.activity") == pytest.approx(0.9614865055005619)
    assert value(b, "gputally.gpu.sm.activity") == 0.0
    busy, idle = process(cycle, 628), process(cycle, 629)
    assert busy.attributes["hw.id"] == MIG_A and idle.attributes["hw.id"] == MIG_B
    assert value(busy, "gputally.gpu.process.memory.usage") == 9869197312
    assert "job_4242" in str(busy.attributes["process.linux.cgroup"])
    # NVML has no per-process utilization under MIG: memory only, no invented zeros
    assert value(busy, "gputally.gpu.process.utilization", {"hw.gpu.task": "general"}) is None


async def test_parent_gpu_keeps_device_metrics_but_no_processes() -> None:
    source = ReplaySource(mig_variant(recording()))
    (cycle,) = await run_cycles(source, 1)
    parent = gpu(cycle)
    assert value(parent, "hw.gpu.utilization", {"hw.gpu.task": "general"}) is None  # refused under MIG
    assert value(parent, "hw.power") == pytest.approx(683.843)
    assert value(parent, "gputally.gpu.sm.activity") is not None  # whole-GPU GPM
    assert [e.attributes["hw.id"] for e in cycle.processes()] == [MIG_A, MIG_B]
    assert source.calls["compute_procs"] == 2  # once per MIG device, never on the parent
    (snapshot,) = [e for e in cycle.logs if e.event_name == "gputally.gpu.snapshot"]
    assert [m["uuid"] for m in snapshot.body["mig"]] == [MIG_A, MIG_B]
    assert snapshot.body["mig"][0]["processes"][0]["pid"] == 628


async def test_mig_off_has_no_mig_entities() -> None:
    source = ReplaySource(recording())
    (cycle,) = await run_cycles(source, 1)
    assert migs(cycle) == {}
    assert source.calls["mig_devices"] == 0
    assert gpu(cycle).attributes["gputally.gpu.mig.enabled"] is False
