"""What the Slurm scenarios share: the jobs' processes, the fake GPUs, and processor configs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.slurm.cluster import SlurmCluster

from gputally.otlp.batch import Signal
from gputally.processors.slurm import SlurmProcessor, factory
from tests.processors.builders import context

BACKENDS = ("cli", "slurmrestd")

# Fake GPUs as the NVIDIA probe describes them when NVML gave no minor number (``hw.name:
# gpu<index>``): the device minor then comes from the (fake) driver directory by PCI bus ID.
# The harness's gres.conf lists minor 5 first, then minor 3, so GRES index 0 is GPU_A (bus
# 1a, NVML index 1) and GRES index 1 is GPU_B (bus 0f, NVML index 0): assuming GRES index ==
# NVML index would swap them.
GPU_A = {"hw.id": "GPU-aaaaaaaa-0000-0000-0000-000000000005", "hw.type": "gpu", "hw.name": "gpu1",
         "gputally.gpu.index": 1, "gputally.gpu.pci.bus_id": "00000000:1A:00.0"}
GPU_B = {"hw.id": "GPU-bbbbbbbb-0000-0000-0000-000000000003", "hw.type": "gpu", "hw.name": "gpu0",
         "gputally.gpu.index": 0, "gputally.gpu.pci.bus_id": "00000000:0F:00.0"}
DRIVER_MINORS = {"0000:1a:00.0": 5, "0000:0f:00.0": 3}

STEP_SCRIPT = """
srun sh -c 'echo $$ > {dir}/step-$SLURM_JOB_ID.pid; exec sleep 900' &
echo $$ > {dir}/batch-$SLURM_JOB_ID.pid
wait
"""
SLEEP_SCRIPT = """
echo "$$ $SLURM_JOB_ID" > {dir}/{name}-${{SLURM_ARRAY_TASK_ID:-x}}.pid
exec sleep 900
"""


@dataclass
class Process:
    """A process of a running job (or none), with what the probe would say about it."""

    pid: int
    job_id: int | None
    cgroup: str

    def resource(self, *, host: str, gpu: dict[str, Any] | None = None, hint: bool = True) -> dict[str, Any]:
        attrs: dict[str, Any] = {"host.name": host, "process.pid": self.pid, "process.executable.name": "sleep"}
        if hint:
            attrs["process.linux.cgroup"] = self.cgroup
        if gpu is not None:
            attrs["hw.id"] = gpu["hw.id"]
        return attrs


@dataclass
class Jobs:
    """The jobs all scenarios share, submitted once per session."""

    batch: Process
    step: Process
    gpu_first: Process
    gpu_second: Process
    array: list[Process]
    array_id: int
    nobody: Process
    qos: Process
    outside: Process
    environ: Process
    proc_root: Path


def processor_config(cluster: SlurmCluster, backend: str, proc_root: Path | None, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "backend": backend,
        "node_name": cluster.node,
        "gres": {"conf": str(cluster.gres_conf)},
        "cache": {"refresh_interval": "1s"},
    }
    if proc_root is not None:
        config["proc_root"] = str(proc_root)
    if backend == "cli":
        config["cli"] = {"slurm_conf": str(cluster.slurm_conf), "timeout": "2s"}
    else:
        config["slurmrestd"] = {"endpoint": cluster.restd_url, "token": cluster.token(), "timeout": "2s"}
    config.update(extra)
    return config


def make_processor(config: dict[str, Any], component_id: str = "slurm") -> SlurmProcessor:
    processor = factory.create(factory.parse(config), context(component_id), Signal.METRICS)
    assert isinstance(processor, SlurmProcessor)
    return processor
