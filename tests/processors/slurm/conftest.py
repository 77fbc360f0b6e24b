"""Slurm test fixtures: the real cluster (from the harness), the jobs every scenario uses, and
processors built against it with each backend."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from harness.slurm.cluster import SlurmCluster

from gputally.processors.slurm import SlurmProcessor
from tests.processors.slurm.scenario import (
    BACKENDS,
    DRIVER_MINORS,
    SLEEP_SCRIPT,
    STEP_SCRIPT,
    Jobs,
    Process,
    make_processor,
    processor_config,
)


def _cgroup(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def _wait_pid(cluster: SlurmCluster, path: Path) -> tuple[int, int | None]:
    parts = cluster.wait_for_file(path).split()
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else None


@pytest.fixture(scope="session")
def slurm_jobs(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    c = slurm_cluster
    d = c.shared

    def sleeper(name: str, *args: str, user: str | None = None) -> Process:
        job_id = c.sbatch(SLEEP_SCRIPT.format(dir=d, name=name), *args, user=user)
        pid, _ = _wait_pid(c, d / f"{name}-x.pid")
        return Process(pid, job_id, _cgroup(pid))

    batch_id = c.sbatch(STEP_SCRIPT.format(dir=d), "--job-name=steps")
    gpu_first = sleeper("gpu-first", "--gres=gpu:1", "--job-name=gpu-first")
    gpu_second = sleeper("gpu-second", "--gres=gpu:1", "--job-name=gpu-second")
    array_id = c.sbatch(SLEEP_SCRIPT.format(dir=d, name="array"), "--array=0-1", "--partition=debug",
                        "--account=chemistry", "--job-name=sweep")
    nobody = sleeper("nobody", "--job-name=nobodys", user="nobody")
    qos = sleeper("qos", "--account=physics", "--qos=high", "--job-name=urgent")
    array = []
    for task in (0, 1):
        pid, job_id = _wait_pid(c, d / f"array-{task}.pid")
        array.append(Process(pid, job_id, _cgroup(pid)))
    batch_pid, _ = _wait_pid(c, d / f"batch-{batch_id}.pid")
    step_pid, _ = _wait_pid(c, d / f"step-{batch_id}.pid")
    outside = subprocess.Popen(["sleep", "900"], stdin=subprocess.DEVNULL)
    # proctrack/linuxproc leaves no job cgroup: a process known only by its environment
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_JOB_ID": str(batch_id), "SLURM_STEP_ID": "0"}
    environ = subprocess.Popen(["sleep", "900"], env=env, stdin=subprocess.DEVNULL)
    # a /proc for the processor: the real processes, plus an NVIDIA driver directory saying
    # which PCI bus ID has which device minor
    proc_root = tmp_path_factory.mktemp("proc")
    for pid in (outside.pid, environ.pid, batch_pid, step_pid):
        (proc_root / str(pid)).symlink_to(f"/proc/{pid}")
    for bus, minor in DRIVER_MINORS.items():
        info = proc_root / "driver" / "nvidia" / "gpus" / bus
        info.mkdir(parents=True)
        (info / "information").write_text(f"Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nDevice Minor: \t {minor}\n")
    jobs = Jobs(
        batch=Process(batch_pid, batch_id, _cgroup(batch_pid)),
        step=Process(step_pid, batch_id, _cgroup(step_pid)),
        gpu_first=gpu_first,
        gpu_second=gpu_second,
        array=array,
        array_id=array_id,
        nobody=nobody,
        qos=qos,
        outside=Process(outside.pid, None, _cgroup(outside.pid)),
        environ=Process(environ.pid, batch_id, _cgroup(environ.pid)),
        proc_root=proc_root,
    )
    try:
        yield jobs
    finally:
        for process in (outside, environ):
            process.kill()
            process.wait()


@pytest.fixture(params=BACKENDS)
async def processor(
    request: pytest.FixtureRequest, slurm_cluster: SlurmCluster, slurm_jobs: Jobs
) -> AsyncIterator[SlurmProcessor]:
    """A started processor against the real cluster through one backend."""
    proc = make_processor(processor_config(slurm_cluster, request.param, slurm_jobs.proc_root))
    await proc.start()
    try:
        yield proc
    finally:
        await proc.shutdown()
