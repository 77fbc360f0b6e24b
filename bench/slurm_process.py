"""Cost of the slurm processor's hot path on a GPU node's request, with every job's metadata cached.

Builds the request an 8-GPU node sends (one resource per GPU with 30 points, two processes per
GPU with 6 points each, cgroup v2 Slurm hints), warms the processor's caches through an
in-process backend, then times ``process()`` on fresh decoded copies. Prints resources/s,
points/s and microseconds per resource, against a plain decode + re-encode of the same request.

    .venv/bin/python bench/slurm_process.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m

from gputally.otlp.batch import Batch, Signal
from gputally.processors.slurm import Backend, JobInfo, SlurmConfig, SlurmProcessor, SlurmRuntime

sys.path.insert(0, str(Path(__file__).parent))
from timing import repeat_for  # noqa: E402

GPUS, PROCESSES_PER_GPU, GPU_POINTS, PROCESS_POINTS = 8, 2, 30, 6


class Cached(Backend):
    name = "bench"

    def __init__(self, jobs: list[JobInfo]) -> None:
        self.jobs = {job.job_id: job for job in jobs}

    async def get_job(self, job_id: int) -> JobInfo | None:
        return self.jobs.get(job_id)

    async def running_jobs(self) -> list[JobInfo]:
        return list(self.jobs.values())


def kv(key: str, value: str | int) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value))


def resource(attrs: dict[str, str | int], points: int) -> m.ResourceMetrics:
    out = m.ResourceMetrics()
    out.resource.attributes.extend(kv(k, v) for k, v in attrs.items())
    metric = out.scope_metrics.add().metrics.add(name="hw.gpu.utilization")
    for i in range(points):
        metric.gauge.data_points.add(as_double=i / 100, time_unix_nano=1_000 + i)
    return out


def request() -> tuple[bytes, list[JobInfo], int]:
    req = ExportMetricsServiceRequest()
    jobs = []
    for gpu in range(GPUS):
        job_id = 1000 + gpu
        jobs.append(JobInfo(job_id=job_id, name=f"train-{gpu}", user="alice", uid=1001, account="ml",
                            partition="h200", qos="normal", nodes="gpu01", cluster="east", state="RUNNING",
                            gpus=(("gpu01", (gpu,)),)))
        uuid = f"GPU-{gpu:08d}-0000-0000-0000-000000000000"
        req.resource_metrics.append(resource({"hw.id": uuid, "hw.type": "gpu", "hw.name": f"nvidia{gpu}",
                                              "gputally.gpu.index": gpu, "host.name": "gpu01"}, GPU_POINTS))
        for p in range(PROCESSES_PER_GPU):
            cgroup = f"0::/system.slice/slurmstepd.scope/job_{job_id}/step_{p}/user/task_0\n"
            req.resource_metrics.append(resource({"hw.id": uuid, "host.name": "gpu01", "process.pid": 10_000 + gpu * 10 + p,
                                                  "process.linux.cgroup": cgroup, "process.owner": "alice"},
                                                 PROCESS_POINTS))
    points = GPUS * (GPU_POINTS + PROCESSES_PER_GPU * PROCESS_POINTS)
    return req.SerializeToString(), jobs, points


async def main(seconds: float) -> None:
    raw, jobs, points = request()
    resources = GPUS * (1 + PROCESSES_PER_GPU)
    config = SlurmConfig.model_validate({"backend": "slurmrestd", "slurmrestd": {"endpoint": "http://x", "token": "t"}})
    proc = SlurmProcessor(SlurmRuntime(config, backend=Cached(jobs), node_name="gpu01"), signal=Signal.METRICS)
    await proc.start()
    await proc.process(Batch.decode(Signal.METRICS, raw))
    await proc.lookups_answered()
    for _ in range(2):
        await proc.process(Batch.decode(Signal.METRICS, raw))
        await proc.lookups_answered()

    async def baseline() -> None:
        batch = Batch.decode(Signal.METRICS, raw)
        batch.mutable()
        batch.serialize()

    async def attributed() -> None:
        batch = Batch.decode(Signal.METRICS, raw)
        await proc.process(batch)
        batch.serialize()

    for label, run in (("decode + re-encode only", baseline), ("decode + slurm + re-encode", attributed)):
        count, elapsed = await repeat_for(seconds, run)
        print(f"{label:28s} {count / elapsed:8.0f} requests/s  {count * points / elapsed:10.0f} points/s  "
              f"{elapsed / count / resources * 1e6:6.1f} us/resource")
    await proc.shutdown()
    print(f"request: {resources} resources ({GPUS} GPUs, {GPUS * PROCESSES_PER_GPU} processes), {points} points, "
          f"{len(raw)} bytes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    asyncio.run(main(parser.parse_args().seconds))
