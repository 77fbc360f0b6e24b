"""Recordings, constructed variants and small readers for the NVIDIA probe's tests.

The two recordings are the real H200 readings in ``shared/fixtures/nvml`` (read as they are);
the variants below are constructed from them and marked as such in their descriptions.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from gputally.probes.core.model import Cycle
from gputally.probes.nvml.collector import NvmlCollector
from gputally.probes.nvml.replay import ReplaySource, load_recording
from tests.probes.readers import device, gpu, pids, process, value, values

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "nvml"
TWO_WORKLOADS = FIXTURES / "h200-two-workloads.json"
TIMESERIES = FIXTURES / "h200-three-workloads-timeseries.json"
GPU_UUID = "GPU-1e061ec2-3930-fe87-1e34-cb91101c1bd9"
MIG_A = "MIG-aaaaaaaa-1111-5111-8111-000000000001"
MIG_B = "MIG-bbbbbbbb-2222-5222-8222-000000000002"

__all__ = [
    "FIXTURES", "GPU_UUID", "MIG_A", "MIG_B", "TIMESERIES", "TWO_WORKLOADS", "collector", "device", "gpu",
    "mig_variant", "pids", "process", "recording", "run_cycles", "value", "values", "without_gpm",
]


def recording(path: Path = TWO_WORKLOADS) -> dict[str, Any]:
    """A fresh copy of a recording, safe to modify."""
    return copy.deepcopy(load_recording(path))


def collector(source: ReplaySource, **options: Any) -> NvmlCollector:
    options.setdefault("node_name", "node-a")
    options.setdefault("events", False)
    return NvmlCollector(source, source, **options)


async def run_cycles(source: ReplaySource, count: int, **options: Any) -> list[Cycle]:
    probe = collector(source, **options)
    try:
        return [await probe.collect() for _ in range(count)]
    finally:
        await probe.close()


def without_gpm(data: dict[str, Any]) -> dict[str, Any]:
    """Constructed: the same GPU as if it were pre-Hopper (no GPM support, no GPM readings)."""
    data = copy.deepcopy(data)
    data["description"] = "CONSTRUCTED from a real recording: GPM unsupported. " + data["description"]
    data["device"]["gpm_support"] = {"version": 1, "isSupportedDevice": 0}
    for snapshot in data["snapshots"]:
        snapshot.pop("gpm_1s", None)
    return data


def mig_variant(data: dict[str, Any]) -> dict[str, Any]:
    """Constructed: the two-workload H200 in MIG mode with two GPU instances, the busy process
    (628) on the first and the idle holder (629) on the second. Under MIG, NVML refuses
    whole-GPU utilization and process utilization, as it does on real MIG GPUs."""
    data = copy.deepcopy(data)
    data["description"] = "CONSTRUCTED MIG variant of a real recording. " + data["description"]
    device = data["device"]
    device["mig_mode"] = [1, 1]
    device["mig_devices"] = [
        {"uuid": MIG_A, "name": "NVIDIA H200 MIG 3g.71gb", "gpu_instance_id": 1, "compute_instance_id": 0},
        {"uuid": MIG_B, "name": "NVIDIA H200 MIG 3g.71gb", "gpu_instance_id": 2, "compute_instance_id": 0},
    ]
    half = 71 * 1024**3
    for snapshot in data["snapshots"]:
        dynamic = snapshot["dynamic"]
        dynamic["utilization"] = {"nvml_error": "Not Supported"}
        snapshot["process_utilization"] = {"nvml_error": "Not Supported"}
        procs = {p["pid"]: p for p in dynamic.pop("compute_procs")}
        dynamic.pop("graphics_procs", None)
        gpm = snapshot.get("gpm_1s", {})
        mig: dict[str, Any] = {}
        for uuid, gi, pid in ((MIG_A, 1, 628), (MIG_B, 2, 629)):
            mine = [{**procs[pid], "gpuInstanceId": gi, "computeInstanceId": 0}] if pid in procs else []
            used = sum(p["usedGpuMemory"] for p in mine)
            mig[uuid] = {
                "dynamic": {
                    "memory": {"total": half, "free": half - used, "used": used},
                    "compute_procs": mine,
                    "graphics_procs": [],
                },
                "gpm_1s": copy.deepcopy(gpm) if uuid == MIG_A else {k: {**v, "value": 0.0} for k, v in gpm.items()},
            }
        snapshot["mig"] = mig
    return data
