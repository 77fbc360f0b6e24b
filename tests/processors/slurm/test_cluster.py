"""Every scenario against a real Slurm 22.05 cluster, through each backend (CLI and slurmrestd)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest
from harness.slurm.cluster import SlurmCluster

from gputally.cgroup.parse import parse_cgroup
from gputally.otlp.batch import Batch
from gputally.processors.slurm import SlurmProcessor
from tests.processors.builders import attributes, metric, metrics_batch, reencoded, resource_metrics, resources
from tests.processors.slurm.scenario import GPU_A, GPU_B, Jobs, Process, make_processor, processor_config

CLUSTER = "gputally-test"


def batch_of(*resource_attrs: dict[str, Any]) -> Batch:
    gauge = [metric("gauge", "hw.gpu.utilization", [{}, {}])]
    return metrics_batch(*(resource_metrics(r, gauge) for r in resource_attrs))


async def attribute(proc: SlurmProcessor, *resource_attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``slurm.*`` attributes of each resource once the processor has looked everything up."""
    await proc.process(batch_of(*resource_attrs))  # the first sight queues lookups
    await asyncio.wait_for(proc.lookups_answered(), 15)
    out = await proc.process(batch_of(*resource_attrs))
    assert out is not None
    return [slurm(attributes(r)) for r in resources(reencoded(out))]


def slurm(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if k.startswith("slurm.")}


def expected(process: Process, **fields: Any) -> dict[str, Any]:
    base = {
        "slurm.job.id": process.job_id,
        "slurm.job.user": "root",
        "slurm.job.uid": 0,
        "slurm.job.account": "physics",
        "slurm.job.partition": "gpu",
        "slurm.job.qos": "normal",
        "slurm.cluster.name": CLUSTER,
        "slurm.job.source": "cgroup",
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


def sample(proc: SlurmProcessor, name: str, **labels: str) -> float:
    return proc.registry.get_sample_value(name, {"processor": "slurm", **labels}) or 0.0


async def test_batch_step_and_srun_step(
    processor: SlurmProcessor, slurm_jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    host = slurm_cluster.node
    batch, step = await attribute(
        processor, slurm_jobs.batch.resource(host=host), slurm_jobs.step.resource(host=host, gpu=GPU_A)
    )
    common = {"slurm.job.name": "steps", "slurm.job.nodes": host}
    assert batch == expected(slurm_jobs.batch, **common, **{"slurm.job.step": "batch"})
    assert step == expected(slurm_jobs.step, **common, **{"slurm.job.step": "0"})


async def test_gpu_job_on_the_second_fake_gpu(
    processor: SlurmProcessor, slurm_jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    detail = slurm_cluster.run(["scontrol", "show", "job", "-d", str(slurm_jobs.gpu_second.job_id)]).stdout
    assert re.search(r"GRES=gpu:h200:1\(IDX:1\)", detail), "the scenario needs the job on GRES index 1"
    host = slurm_cluster.node
    # the probe names a GPU by its device minor when NVML reports one; that beats a wrong index
    named = {"host.name": host, "hw.id": "GPU-dddddddd-0000-0000-0000-000000000003", "hw.name": "nvidia3",
             "gputally.gpu.index": 0}
    gpu_a, gpu_b, process, by_minor = await attribute(
        processor,
        {"host.name": host, **GPU_A},
        {"host.name": host, **GPU_B},
        slurm_jobs.gpu_second.resource(host=host, gpu=GPU_B),
        named,
    )
    # GRES index 1 is the device with minor 3 (gres.conf order), which the driver says is GPU_B
    gpu = {"slurm.job.name": "gpu-second", "slurm.job.nodes": host, "slurm.job.source": "gres"}
    assert gpu_b == expected(slurm_jobs.gpu_second, **gpu)
    assert gpu_a == expected(slurm_jobs.gpu_first, **{**gpu, "slurm.job.name": "gpu-first"})
    assert process == expected(
        slurm_jobs.gpu_second, **{**gpu, "slurm.job.source": "cgroup", "slurm.job.step": "batch"}
    )
    assert by_minor == gpu_b
    assert sample(processor, "gputally_slurm_resources_total", source="gres") == 3


async def test_learns_which_gpu_a_gres_index_is_from_a_jobs_process(
    slurm_jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    """Without gres.conf or driver minors, a one-GPU job's process on a GPU tells which GPU its GRES index is."""
    proc = make_processor(processor_config(slurm_cluster, "cli", None, gres={"conf": None}))
    await proc.start()
    try:
        host = slurm_cluster.node
        unknown_gpu = {"host.name": host, "hw.id": "GPU-cccccccc-0000-0000-0000-000000000009"}  # no index, no bus
        assert await attribute(proc, unknown_gpu) == [{}]
        await attribute(proc, slurm_jobs.gpu_second.resource(host=host, gpu=unknown_gpu))
        [gpu] = await attribute(proc, unknown_gpu)
        assert gpu["slurm.job.id"] == slurm_jobs.gpu_second.job_id and gpu["slurm.job.source"] == "gres"
    finally:
        await proc.shutdown()


async def test_job_array(processor: SlurmProcessor, slurm_jobs: Jobs, slurm_cluster: SlurmCluster) -> None:
    host = slurm_cluster.node
    tasks = await attribute(processor, *(p.resource(host=host) for p in slurm_jobs.array))
    for task_id, (process, attrs) in enumerate(zip(slurm_jobs.array, tasks, strict=True)):
        assert attrs == expected(
            process,
            **{
                "slurm.job.name": "sweep",
                "slurm.job.step": "batch",
                "slurm.job.account": "chemistry",
                "slurm.job.partition": "debug",
                "slurm.job.array.id": slurm_jobs.array_id,
                "slurm.job.array.task_id": task_id,
                "slurm.job.nodes": host,
            },
        )
    assert len({p.job_id for p in slurm_jobs.array}) == 2


async def test_job_of_another_user(processor: SlurmProcessor, slurm_jobs: Jobs, slurm_cluster: SlurmCluster) -> None:
    [attrs] = await attribute(processor, slurm_jobs.nobody.resource(host=slurm_cluster.node))
    assert attrs == expected(
        slurm_jobs.nobody,
        **{
            "slurm.job.name": "nobodys",
            "slurm.job.step": "batch",
            "slurm.job.user": "nobody",
            "slurm.job.uid": 65534,
            "slurm.job.account": "chemistry",
            "slurm.job.nodes": slurm_cluster.node,
        },
    )
    v1 = "slurmstepd.scope" not in slurm_jobs.nobody.cgroup
    assert parse_cgroup(slurm_jobs.nobody.cgroup).slurm_uid == (65534 if v1 else None)  # v1 paths name the uid


async def test_job_with_account_and_qos(
    processor: SlurmProcessor, slurm_jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    [attrs] = await attribute(processor, slurm_jobs.qos.resource(host=slurm_cluster.node))
    assert attrs["slurm.job.account"] == "physics"
    assert attrs["slurm.job.qos"] == "high"
    assert attrs["slurm.job.name"] == "urgent"


async def test_process_outside_any_job_is_left_alone(
    processor: SlurmProcessor, slurm_jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    resource = slurm_jobs.outside.resource(host=slurm_cluster.node)
    await processor.process(batch_of(resource))
    await asyncio.wait_for(processor.lookups_answered(), 15)  # its /proc was read too: nothing there either
    batch = batch_of(resource)
    raw = batch.serialize()
    out = await processor.process(batch)
    assert out is not None and out.serialize() is raw  # untouched: forwarded as the bytes that came
    assert sample(processor, "gputally_slurm_resources_total", source="none") == 2


async def test_environment_when_cgroups_say_nothing(
    processor: SlurmProcessor, slurm_jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    """proctrack/linuxproc: no job cgroup, but SLURM_JOB_ID in the process's environment."""
    host = slurm_cluster.node
    without_hint, with_plain_hint = await attribute(
        processor, slurm_jobs.environ.resource(host=host, hint=False), slurm_jobs.environ.resource(host=host)
    )
    want = expected(
        slurm_jobs.environ,
        **{"slurm.job.name": "steps", "slurm.job.step": "0", "slurm.job.nodes": host, "slurm.job.source": "environ"},
    )
    assert without_hint == want
    assert with_plain_hint == want
    # a process on another node is never looked up in this node's /proc
    [remote] = await attribute(processor, slurm_jobs.environ.resource(host="some-other-node", hint=False))
    assert remote == {}


async def test_job_that_ended_while_its_data_was_in_flight(
    processor: SlurmProcessor, slurm_jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    c = slurm_cluster
    name = f"ending-{processor.backend.name}"
    job_id = c.sbatch(f"echo $$ > {c.shared}/{name}.pid\nexec sleep 900\n", f"--job-name={name}")
    pid = int(c.wait_for_file(c.shared / f"{name}.pid"))
    ended = Process(pid, job_id, Path(f"/proc/{pid}/cgroup").read_text())  # what the probe had read
    c.run(["scancel", str(job_id)])
    c.wait_job_state(job_id, ["CANCELLED", "COMPLETED"])
    [attrs] = await attribute(processor, ended.resource(host=c.node))
    assert attrs == expected(ended, **{"slurm.job.name": name, "slurm.job.step": "batch", "slurm.job.nodes": c.node})

    # a job Slurm no longer knows: attributed from the cgroup alone, looked up once
    gone = Process(pid, 9_999_999, ended.cgroup.replace(f"job_{job_id}/", "job_9999999/"))
    uid = parse_cgroup(gone.cgroup).slurm_uid  # 0 on cgroup v1; v2 paths carry no uid
    for _ in range(3):
        [attrs] = await attribute(processor, gone.resource(host=c.node))
        assert attrs == expected(gone, **{
            "slurm.job.user": None, "slurm.job.uid": uid, "slurm.job.account": None, "slurm.job.partition": None,
            "slurm.job.qos": None, "slurm.cluster.name": None, "slurm.job.step": "batch",
        })
    assert sample(processor, "gputally_slurm_lookups_total", outcome="not_found") == 1


async def test_slurm_down_keeps_cached_metadata_flowing(
    processor: SlurmProcessor, slurm_jobs: Jobs, slurm_cluster: SlurmCluster
) -> None:
    host = slurm_cluster.node
    [known] = await attribute(processor, slurm_jobs.qos.resource(host=host))
    assert known["slurm.job.qos"] == "high"
    daemon = "slurmrestd" if processor.backend.name == "slurmrestd" else "slurmctld"
    with slurm_cluster.paused(daemon):
        batch = batch_of(slurm_jobs.qos.resource(host=host), slurm_jobs.nobody.resource(host=host))
        await processor.process(batch)
        await _until(lambda: processor.degraded() is not None, 20)
        out = await processor.process(
            batch_of(slurm_jobs.qos.resource(host=host), slurm_jobs.nobody.resource(host=host))
        )
        assert out is not None
        cached, new = (slurm(attributes(r)) for r in resources(reencoded(out)))
        assert cached == known  # cached metadata keeps flowing
        assert new == expected(slurm_jobs.nobody, **{  # a job first seen now: what its cgroup says
            "slurm.job.user": None, "slurm.job.uid": parse_cgroup(slurm_jobs.nobody.cgroup).slurm_uid,
            "slurm.job.account": None, "slurm.job.partition": None, "slurm.job.qos": None,
            "slurm.cluster.name": None, "slurm.job.step": "batch",
        })
        reason = processor.degraded()
        assert reason is not None
        pattern = rf"{processor.backend.name} unreachable since \S+Z \(\d+ lookups failed\); attributing from cache"
        assert re.fullmatch(pattern, reason)
        assert sample(processor, "gputally_slurm_lookups_total", outcome="error") >= 1
        assert sample(processor, "gputally_slurm_backend_errors_total", backend=processor.backend.name) >= 1
    await _until(lambda: processor.degraded() is None, 20)
    [recovered] = await attribute(processor, slurm_jobs.nobody.resource(host=host))
    assert recovered["slurm.job.user"] == "nobody"


async def test_zz_gpu_has_no_owner_once_its_job_ends(slurm_jobs: Jobs, slurm_cluster: SlurmCluster) -> None:
    """Runs last: it ends the job on the second GPU."""
    host = slurm_cluster.node
    procs = [make_processor(processor_config(slurm_cluster, b, slurm_jobs.proc_root)) for b in ("cli", "slurmrestd")]
    for proc in procs:
        await proc.start()
    try:
        for proc in procs:
            first, second = await attribute(proc, {"host.name": host, **GPU_A}, {"host.name": host, **GPU_B})
            assert second["slurm.job.id"] == slurm_jobs.gpu_second.job_id
        slurm_cluster.run(["scancel", str(slurm_jobs.gpu_second.job_id)])
        slurm_cluster.wait_job_state(slurm_jobs.gpu_second.job_id, ["CANCELLED", "COMPLETED"])
        for proc in procs:
            async def released(proc: SlurmProcessor = proc) -> bool:
                _, second = await attribute(proc, {"host.name": host, **GPU_A}, {"host.name": host, **GPU_B})
                return second == {}
            deadline = time.monotonic() + 10
            while not await released():
                assert time.monotonic() < deadline, f"{proc.backend.name}: GPU B still attributed after its job ended"
                await asyncio.sleep(0.2)
            first, _ = await attribute(proc, {"host.name": host, **GPU_A}, {"host.name": host, **GPU_B})
            assert first["slurm.job.id"] == slurm_jobs.gpu_first.job_id
    finally:
        for proc in procs:
            await proc.shutdown()


async def _until(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        await asyncio.sleep(0.05)
