"""``--record``: what the probe read, written in the recording format, replays to the same metrics."""

from __future__ import annotations

import json
from pathlib import Path

from gputally.probes.core.model import Cycle
from gputally.probes.nvml.collector import NvmlCollector
from gputally.probes.nvml.record import RecordingSource
from gputally.probes.nvml.replay import ReplaySource, load_recording
from tests.probes.nvml.helpers import TIMESERIES, mig_variant, recording, run_cycles

VARIES = {"gputally.gpu.collection.duration", "hw.gpu.io"}  # wall time and time windows


def comparable(cycle: Cycle) -> dict[str, list[tuple[str, object, object]]]:
    return {
        entity.key: sorted((p.metric.name, p.attributes, p.value) for p in entity.points if p.metric.name not in VARIES)
        for entity in cycle.entities
    }


async def record(source: ReplaySource, path: Path, cycles: int) -> list[Cycle]:
    recorder = RecordingSource(source, source, path=path)
    probe = NvmlCollector(recorder, recorder, node_name="node-a", events=False)
    try:
        return [await probe.collect() for _ in range(cycles)]
    finally:
        await probe.close()


async def test_a_recording_replays_to_the_same_metrics(tmp_path: Path) -> None:
    path = tmp_path / "recorded.json"
    original = await record(ReplaySource.from_file(TIMESERIES), path, 4)
    data = load_recording(path)
    assert len(data["snapshots"]) == 4 and data["driver_version"] == "580.159.04"
    assert data["device"]["name"] == "NVIDIA H200"
    assert {"utilization", "memory", "compute_procs"} <= set(data["snapshots"][0]["dynamic"])
    assert data["snapshots"][0]["dynamic"]["bar1"] == {"nvml_error": "Not Supported"}
    assert data["snapshots"][1]["process_utilization_last_seen_arg"] == 1795978957650159
    assert data["snapshots"][0]["proc_facts"]["450"]["cgroup"].startswith("0::/system.slice/slurmstepd.scope/job_90210")
    assert "p50_us" in data["call_cost_us"]["utilization"]
    replayed = await run_cycles(ReplaySource(data), 4)
    assert [comparable(c) for c in replayed] == [comparable(c) for c in original]


async def test_the_file_is_valid_after_every_cycle(tmp_path: Path) -> None:
    path = tmp_path / "partial.json"
    recorder = RecordingSource(ReplaySource(recording()), ReplaySource(recording()), path=path)
    probe = NvmlCollector(recorder, recorder, node_name="n", events=False)
    try:
        await probe.collect()
        await probe.collect()  # the first cycle is written when the second begins
        assert len(json.loads(path.read_text())["snapshots"]) == 1
    finally:
        await probe.close()
    assert len(json.loads(path.read_text())["snapshots"]) == 2


async def test_mig_devices_are_recorded_and_replayed(tmp_path: Path) -> None:
    path = tmp_path / "mig.json"
    original = await record(ReplaySource(mig_variant(recording())), path, 1)
    data = load_recording(path)
    assert [m["gpu_instance_id"] for m in data["device"]["mig_devices"]] == [1, 2]
    (replayed,) = await run_cycles(ReplaySource(data), 1)
    assert comparable(replayed) == comparable(original[0])
