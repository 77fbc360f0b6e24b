"""An engine in a Slurm job is attributed to its job as the job's GPU process is: real
processes in a real Slurm-shaped cgroup (v1), the engine in another step than the GPU process,
discovered and read by the probe, encoded by its OTLP shape, then the ``slurm`` processor."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gputally.otlp.batch import Batch, Signal
from gputally.probes.core.hints import ProcFs
from gputally.probes.core.otlp_shape import metrics_request
from gputally.probes.engines.collector import EngineCollector, EngineReads
from gputally.probes.engines.discover import Discovery
from gputally.processors.slurm import JobInfo, SlurmConfig, SlurmProcessor, SlurmRuntime
from tests.processors.builders import all_kinds, attributes, metrics_batch, reencoded, resource_metrics, resources
from tests.processors.slurm.fakes import FakeBackend
from tests.probes.engines.pods import CGROUP_ROOT, SERVER, GpuCollector, Reader, exposition, started_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not (CGROUP_ROOT / "pids").is_dir(),
                                reason="needs root and cgroup v1 (the project's test machine)")

JOB = JobInfo(job_id=4242, name="serve", user="alice", uid=1001, account="ml", partition="h200", qos="normal",
              nodes="n1", cluster="east", state="RUNNING", gpus=(("n1", (0,)),))


def slurm_of(out: Batch) -> list[dict[str, Any]]:
    return [{k: v for k, v in attributes(r).items() if k.startswith("slurm.")} for r in resources(reencoded(out))]


async def test_an_engine_gets_the_job_of_its_cgroup(tmp_path: Path) -> None:
    root = CGROUP_ROOT / "pids" / f"slurm_gputally{os.getpid()}"
    job = root / "uid_1001" / "job_4242"
    gpu_step, api_step = job / "step_0" / "task_0", job / "step_batch"
    started: list[subprocess.Popen[bytes]] = []
    try:
        gpu_step.mkdir(parents=True)
        api_step.mkdir(parents=True)
        gpu = subprocess.Popen(["sleep", "600"])
        server = subprocess.Popen([sys.executable, str(SERVER), "--file", str(exposition(tmp_path))],
                                  stdout=subprocess.PIPE)
        started += [gpu, server]
        (gpu_step / "cgroup.procs").write_text(str(gpu.pid))
        (api_step / "cgroup.procs").write_text(str(server.pid))
        started_port(server)

        procfs = ProcFs(Path("/proc"))
        reads = EngineReads(Reader(), walker=Discovery(processes=procfs), processes=procfs, node_name="n1")
        collector = EngineCollector(GpuCollector([gpu.pid]), reads, deadline_s=2.0)
        cycle = await collector.collect()
        await collector.close()
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        for directory in (gpu_step, gpu_step.parent, api_step, job, job.parent, root):
            with contextlib.suppress(OSError):
                for pid in (directory / "cgroup.procs").read_text().split():
                    (CGROUP_ROOT / "pids" / "cgroup.procs").write_text(pid)
                directory.rmdir()
    assert [e.kind for e in cycle.entities] == ["gpu", "process", "engine"]

    settings: dict[str, Any] = {"backend": "slurmrestd", "slurmrestd": {"endpoint": "http://x", "token": "t"}}
    runtime = SlurmRuntime(SlurmConfig.model_validate(settings), backend=FakeBackend(JOB), node_name="n1")
    proc = SlurmProcessor(runtime, signal=Signal.METRICS)
    await proc.start()
    try:
        raw = metrics_request(cycle.entities, cycle.time_ns).SerializeToString()
        await proc.process(Batch.decode(Signal.METRICS, raw))
        await asyncio.wait_for(proc.lookups_answered(), 5)
        out = await proc.process(Batch.decode(Signal.METRICS, raw))
    finally:
        await proc.shutdown()
    assert out is not None
    _, process, engine = slurm_of(out)
    assert process["slurm.job.step"] == "0" and engine["slurm.job.step"] == "batch"  # each its own step
    del process["slurm.job.step"], engine["slurm.job.step"]
    assert engine == process
    assert engine["slurm.job.id"] == 4242 and engine["slurm.job.user"] == "alice"


async def test_an_explicit_engine_with_only_a_cgroup_gets_its_job() -> None:
    """`--engine URL,engine=llamacpp,cgroup=/slurm/uid_1001/job_4242/step_batch` (the README's
    bare-metal form, no pid): the engine's resource carries only the cgroup, and slurm names the
    job from it."""
    engine = {"gputally.inference.engine": "llamacpp", "host.name": "n1", "server.address": "10.0.0.5",
              "server.port": 8080, "process.linux.cgroup": "0::/slurm/uid_1001/job_4242/step_batch"}
    settings: dict[str, Any] = {"backend": "slurmrestd", "slurmrestd": {"endpoint": "http://x", "token": "t"}}
    runtime = SlurmRuntime(SlurmConfig.model_validate(settings), backend=FakeBackend(JOB), node_name="n1")
    proc = SlurmProcessor(runtime, signal=Signal.METRICS)
    await proc.start()
    try:
        raw = metrics_batch(resource_metrics(engine, all_kinds([{}]))).serialize()
        await proc.process(Batch.decode(Signal.METRICS, raw))
        await asyncio.wait_for(proc.lookups_answered(), 5)
        out = await proc.process(Batch.decode(Signal.METRICS, raw))
    finally:
        await proc.shutdown()
    assert out is not None
    [attributed] = slurm_of(out)
    assert attributed["slurm.job.id"] == 4242 and attributed["slurm.job.user"] == "alice"
    assert attributed["slurm.job.step"] == "batch"
