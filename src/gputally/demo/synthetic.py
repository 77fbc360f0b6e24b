"""A small synthetic NVML recording, for a demo where the shared H200 recording is absent
(an installed package: the fixtures' README grants no redistribution, so none is shipped).

Made up, and said so wherever it is used: one H200-sized GPU, ten readings 2 s apart, the
same three workloads as the real recording (a busy trainer pod, a notebook pod at a 30 % duty
cycle that stops after the sixth reading, a Slurm job holding memory and never computing), in
the recording format of the shared fixtures' README as the replay source reads it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["recording"]

GIB = 1 << 30
_START_S = 1_800_000_000.0
_STEP_S = 2.0
_PROCS = {
    448: ("0::/kubepods.slice/kubepods-pod3a5b7c9d_1e2f_4a6b_8c0d_2e4f6a8b0c1d.slice/"
          "cri-containerd-" + "ab" * 32 + ".scope\n", 13.2, {"HOSTNAME": "trainer-0", "NVIDIA_VISIBLE_DEVICES": "0"}),
    449: ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5b1d9e2a_7c4f_4e8b_9a6d_3f2e1c0b9a87.slice/"
          "crio-" + "cd" * 32 + ".scope\n", 6.2, {"HOSTNAME": "notebook-0", "NVIDIA_VISIBLE_DEVICES": "0"}),
    450: ("0::/system.slice/slurmstepd.scope/job_90210/step_0/user/task_0\n", 2.8,
          {"SLURM_JOB_ID": "90210", "SLURM_STEP_ID": "0"}),
}


def _sm(i: int) -> dict[int, int]:
    """Each process's SM utilization (%) at reading ``i``: the notebook stops after the sixth."""
    notebook = i < 6
    return {448: 85 if notebook else 97, 449: 12 if notebook else 0, 450: 0}


def _power_mw(i: int) -> int:
    return 250_000 + 4_400 * min(100, sum(_sm(i).values()))


def _reading(i: int) -> dict[str, Any]:
    sm = _sm(i)
    pids = [448, 450] + ([449] if i < 6 else [])
    util = min(100, sum(sm.values()))
    used = sum(int(_PROCS[p][1] * GIB) for p in pids)
    power_mw = _power_mw(i)
    t = _START_S + i * _STEP_S
    ts_us = int(t * 1e6)
    # the energy counter (mJ) advances by the power held over each step before this reading
    energy_mj = 6_000_000 + sum(int(_STEP_S * _power_mw(k)) for k in range(i))
    return {
        "label": f"t{i}",
        "time": t,
        "dynamic": {
            "utilization": {"gpu": util, "memory": util // 4},
            "memory": {"total": 141 * GIB, "used": used, "free": 141 * GIB - used},
            "power_mw": power_mw,
            "energy_mj": energy_mj,
            "temp_gpu": 45 + util // 7,
            "clock_sm": 1_755,
            "throttle_reasons": 0,
            "compute_procs": [{"pid": p, "usedGpuMemory": int(_PROCS[p][1] * GIB),
                               "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF} for p in pids],
        },
        "field_values": {"NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION": {
            "ret": 0, "type": 3, "ts": ts_us, "value": {"ullVal": energy_mj, "ulVal": energy_mj, "sllVal": energy_mj}}},
        "process_utilization": [{"pid": p, "timeStamp": ts_us - 100_000 * k, "smUtil": sm[p], "memUtil": sm[p] // 5,
                                 "encUtil": 0, "decUtil": 0} for k, p in enumerate(pids) if sm[p] > 0],
        "process_utilization_last_seen_arg": 0 if i == 0 else int((t - _STEP_S) * 1e6),
        "proc_facts": {str(p): {"cgroup": _PROCS[p][0], "cmdline": "python3 worker.py", "comm": "python3",
                                "status_uid": ["Uid:\t0\t0\t0\t0"],
                                "env_selected": {"CUDA_VISIBLE_DEVICES": "0", **_PROCS[p][2]}} for p in pids},
    }


def recording() -> dict[str, Any]:
    """The synthetic recording, as JSON-ready data."""
    return {
        "description": "SYNTHETIC (gputally demo): made up in the shape of a real H200 recording",
        "nvml_version": "13.580.0", "driver_version": "580.0", "cuda_driver_version": 13000, "device_count": 1,
        "cgroup_fs_type": "cgroup2",
        "device": {
            "name": "NVIDIA H200 (synthetic)", "uuid": "GPU-00000000-0000-4000-8000-00000000d3e0", "serial": "0",
            "index": 0, "minor_number": 0,
            "pci_info": {"busId": "00000000:00:06.0", "busIdLegacy": "0000:00:06.0", "domain": 0, "bus": 0, "device": 6},
            "architecture": 9, "cuda_cc": [9, 0], "mig_mode": [0, 0], "max_sm_clock": 1980, "max_mem_clock": 3201,
            "power_limit_mw": 700_000, "enforced_power_limit_mw": 700_000, "power_limit_constraints": [200_000, 700_000],
            "temp_threshold_slowdown": 89, "temp_threshold_shutdown": 95,
        },
        "snapshots": [_reading(i) for i in range(10)],
    }
