"""Shared pieces of the benches that attribute Slurm jobs: a real one-node cluster, jobs on its
GPUs, and the ``slurm`` processor's config as a GPU node would run it.

The cluster is the test harness's (tests/harness/slurm: munged, MariaDB, slurmdbd, slurmctld,
slurmd with two GRES GPUs; root only, packages from tests/harness/slurm/setup.sh). slurmrestd
is not started: a node-mode gputally, which sits on the Slurm node itself, asks Slurm through
the ``cli`` backend (``scontrol``/``squeue`` on PATH, the cluster's slurm.conf), the way
processors/slurm/README.md's ``slurm/node`` example does.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the Slurm harness (tests/harness/slurm)

PROCESSES_PER_JOB = 2
"""Processes each job starts (two ranks of one batch step); each becomes a process resource."""

JOB_SCRIPT = """
sleep 3600 &
a=$!
sleep 3600 &
b=$!
echo "$a $b" > {pids}
wait
"""


@dataclass(frozen=True)
class SlurmJob:
    """A running job holding one GRES GPU, with its processes as the probe would see them."""

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    pids: tuple[int, ...]
    cgroups: tuple[str, ...]
    """Each process's ``/proc/PID/cgroup`` text: the ``process.linux.cgroup`` hint the probe sends."""


def submit(cluster: Any, name: str, *, user: str, account: str, partition: str) -> SlurmJob:
    """Submit a job holding one GPU (``--gres=gpu:1``) that runs two processes; return once they run."""
    pid_file = cluster.shared / f"{name}.pids"
    job_id = cluster.sbatch(JOB_SCRIPT.format(pids=pid_file), "--gres=gpu:1", f"--job-name={name}",
                            f"--account={account}", f"--partition={partition}", user=user)
    cluster.wait_job_state(job_id, ("RUNNING",))
    pids = tuple(int(p) for p in cluster.wait_for_file(pid_file).split())
    assert len(pids) == PROCESSES_PER_JOB, pids
    cgroups = tuple(Path(f"/proc/{pid}/cgroup").read_text() for pid in pids)
    return SlurmJob(job_id, name, user, account, partition, pids, cgroups)


@contextlib.contextmanager
def slurm_node() -> Iterator[tuple[Any, list[SlurmJob]]]:
    """A started cluster with two running jobs (one GPU each, different users, accounts and
    partitions); every daemon is stopped and the cluster's directory and cgroups removed on exit."""
    from harness.slurm.cluster import SlurmCluster

    cluster = SlurmCluster(restd=False)
    try:
        started = time.monotonic()
        cluster.start()
        jobs = [
            submit(cluster, "bench-train", user="root", account="physics", partition="gpu"),
            submit(cluster, "bench-eval", user="nobody", account="chemistry", partition="debug"),
        ]
        print(f"slurm: node {cluster.node} up with {len(jobs)} jobs in {time.monotonic() - started:.0f} s: "
              + "; ".join(f"job {j.job_id} ({j.name}, {j.user}, {j.account}, {j.partition}, pids "
                          f"{' '.join(map(str, j.pids))})" for j in jobs), flush=True)
        yield cluster, jobs
    finally:
        cluster.close()


def processor_config(cluster: Any) -> dict[str, Any]:
    """The ``slurm`` processor on the cluster's node: the ``cli`` backend with its slurm.conf, its
    gres.conf, and the node's Slurm name. No ``proc_root``: the probe's cgroup hints name every
    Slurm process, and the request's other pids are synthetic (this machine's /proc would answer
    for unrelated processes)."""
    return {
        "backend": "cli",
        "cli": {"slurm_conf": str(cluster.slurm_conf)},
        "node_name": cluster.node,
        "gres": {"conf": str(cluster.gres_conf)},
    }


def check_metadata(cluster: Any, jobs: list[SlurmJob], payload: bytes) -> None:
    """Put ``payload`` through a ``slurm`` processor with :func:`processor_config` (in this process,
    until its caches have settled) and check that each job's processes and GPU carry the job's
    id, user, account and partition: the part of the attribution /metrics cannot show."""
    import asyncio

    from gputally.otlp.batch import Batch, Signal
    from gputally.pipeline.component import ComponentContext
    from gputally.processors.slurm import SlurmProcessor, factory
    from gputally.telemetry import SelfTelemetry

    async def attributed() -> list[dict[str, Any]]:
        context = ComponentContext(id="slurm", telemetry=SelfTelemetry())
        processor = factory.create(factory.parse(processor_config(cluster)), context, Signal.METRICS)
        assert isinstance(processor, SlurmProcessor)
        await processor.start()
        try:
            for _ in range(3):  # the jobs from their cgroups, then their metadata and GRES GPUs
                batch = Batch.decode(Signal.METRICS, payload)
                await processor.process(batch)
                await asyncio.wait_for(processor.lookups_answered(), 30)
        finally:
            await processor.shutdown()
        return [{kv.key: getattr(kv.value, kv.value.WhichOneof("value") or "string_value")
                 for kv in rm.resource.attributes} for rm in batch.message.resource_metrics]

    resources = asyncio.run(attributed())
    for job in jobs:
        want = {"slurm.job.id": job.job_id, "slurm.job.name": job.name, "slurm.job.user": job.user,
                "slurm.job.account": job.account, "slurm.job.partition": job.partition}
        mine = [r for r in resources if r.get("slurm.job.id") == job.job_id]
        kinds = sorted("process" if "process.pid" in r else "GPU" for r in mine)
        if kinds != ["GPU"] + ["process"] * PROCESSES_PER_JOB:
            raise RuntimeError(f"slurm: job {job.job_id} attributed to {kinds}, want its GPU and its processes")
        for r in mine:
            got = {key: r.get(key) for key in want}
            if got != want:
                raise RuntimeError(f"slurm: {r.get('process.pid', r.get('hw.id'))} got {got}, want {want}")
        print(f"slurm: job {job.job_id} -> {job.user}/{job.account}/{job.partition} on its GPU "
              f"{mine[0]['hw.id']} and processes {job.pids} (checked in process)", flush=True)
