"""The replay source serves the real recordings as they are, through the live source's interface."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from gputally.probes.nvml.errors import NvmlCallFailed, NvmlUnavailable
from gputally.probes.nvml.replay import ReplaySource, load_recording
from gputally.probes.nvml.source import FIELDS
from tests.probes.nvml.helpers import GPU_UUID, TIMESERIES, TWO_WORKLOADS, recording


def test_reads_both_recordings_as_they_are() -> None:
    for path, count in ((TWO_WORKLOADS, 3), (TIMESERIES, 10)):
        source = ReplaySource.from_file(path)
        info = source.open()
        assert info.driver_version == "580.159.04"
        (gpu,) = source.gpus()
        assert source.device_info(gpu)["name"] == "NVIDIA H200"
        assert len(load_recording(path)["snapshots"]) == count


def test_not_a_recording_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not an NVML recording"):
        ReplaySource.from_file(bad)


def test_cycles_through_the_snapshots() -> None:
    source = ReplaySource.from_file(TWO_WORKLOADS)
    labels = []
    for _ in range(5):
        source.next_cycle()
        labels.append(source.snapshot_label)
    assert labels == ["busy+idle", "idle-holder-only", "no-process", "busy+idle", "idle-holder-only"]


def test_recorded_nvml_error_and_missing_call_are_not_supported() -> None:
    source = ReplaySource.from_file(TIMESERIES)
    (gpu,) = source.gpus()
    source.next_cycle()
    with pytest.raises(NvmlCallFailed) as missing:
        source.read(gpu, "bar1")  # not recorded in the timeseries
    assert missing.value.not_supported and missing.value.name == "Not Supported"
    two = ReplaySource.from_file(TWO_WORKLOADS)
    (gpu,) = two.gpus()
    two.next_cycle()
    with pytest.raises(NvmlCallFailed) as refused:
        two.read(gpu, "fan")  # type: ignore[arg-type]  # {"nvml_error": "Not Supported"}
    assert refused.value.code == 3


def test_pynvml_style_error_entry_is_not_found() -> None:
    source = ReplaySource.from_file(TWO_WORKLOADS)
    (gpu,) = source.gpus()
    source.next_cycle()
    source.next_cycle()  # idle-holder-only: process_utilization is {"error": "NVMLError_NotFound(6)"}
    with pytest.raises(NvmlCallFailed) as exc:
        source.process_utilization(gpu, 0)
    assert exc.value.not_found


def test_process_utilization_honours_last_seen_and_laps_move_time_forward() -> None:
    source = ReplaySource.from_file(TIMESERIES)
    (gpu,) = source.gpus()
    source.next_cycle()
    first = source.process_utilization(gpu, 0)
    assert sorted(s["pid"] for s in first) == [448, 449]
    newest_449 = next(s["timeStamp"] for s in first if s["pid"] == 449)
    only_newer = source.process_utilization(gpu, newest_449)
    assert [s["pid"] for s in only_newer] == [448]
    stamps = []
    for _ in range(25):  # two and a half laps
        source.next_cycle()
        stamps.append(max(s["timeStamp"] for s in source.process_utilization(gpu, 0)))
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


def test_energy_counter_keeps_rising_across_laps() -> None:
    source = ReplaySource.from_file(TWO_WORKLOADS)
    (gpu,) = source.gpus()
    energy = []
    for _ in range(7):
        source.next_cycle()
        name = "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
        entry = source.field_values(gpu, [name])[name]
        energy.append(entry["value"]["ullVal"])
    assert energy[0] == 38481635
    assert all(b > a for a, b in itertools.pairwise(energy))


def test_unrecorded_field_is_not_supported() -> None:
    source = ReplaySource.from_file(TWO_WORKLOADS)
    (gpu,) = source.gpus()
    source.next_cycle()
    fields = source.field_values(gpu, FIELDS)
    assert fields["NVML_FI_DEV_PCIE_COUNT_TX_BYTES"]["ret"] == 3
    assert fields["NVML_FI_DEV_MEMORY_TEMP"]["ret"] == 0


def test_injected_failures_hit_the_named_call_and_gpu_then_stop() -> None:
    source = ReplaySource(recording(), copies=2)
    gpu0, gpu1 = source.gpus()
    source.next_cycle()
    source.fail("utilization", "GPU is lost", gpu=1, times=1)
    assert source.read(gpu0, "utilization") == {"gpu": 99, "memory": 25}
    with pytest.raises(NvmlCallFailed) as exc:
        source.read(gpu1, "utilization")
    assert exc.value.gpu_gone
    assert source.read(gpu1, "utilization") == {"gpu": 99, "memory": 25}
    source.fail_open("NVML Shared Library Not Found")
    with pytest.raises(NvmlUnavailable):
        source.open()


def test_copies_pose_as_distinct_gpus() -> None:
    source = ReplaySource(recording(), copies=3)
    gpus = source.gpus()
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[0].uuid == GPU_UUID and len({g.uuid for g in gpus}) == 3
    bus_ids = {source.device_info(g)["pci_info"]["busId"] for g in gpus}
    assert len(bus_ids) == 3


def test_latency_model_sleeps_the_recorded_cost() -> None:
    source = ReplaySource(recording(), latency=True)
    (gpu,) = source.gpus()
    source.next_cycle()
    started = time.perf_counter()
    source.field_values(gpu, FIELDS)  # recorded p50: 3633.8 us
    elapsed = time.perf_counter() - started
    assert 0.0033 < elapsed < 0.05
    started = time.perf_counter()
    for _ in range(100):
        source.read(gpu, "utilization")  # 1.2 us each: slept in quanta, 120 us in all
    assert time.perf_counter() - started < 0.02


def test_process_facts_come_from_the_recording() -> None:
    source = ReplaySource.from_file(TWO_WORKLOADS)
    source.next_cycle()
    facts = source.facts(628)
    assert facts is not None
    assert facts.cgroup == "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"
    assert facts.comm == "python3" and facts.uid == 0 and facts.owner == "root"
    assert source.facts(4242) is None
    source.next_cycle()  # idle-holder-only: 628 has gone
    assert source.facts(628) is None and source.facts(629) is not None
