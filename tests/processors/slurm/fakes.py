"""An in-process Slurm backend for tests that need no cluster: jobs from a dict, outages on demand."""

from __future__ import annotations

from collections import Counter

from gputally.processors.slurm import Backend, JobInfo, SlurmUnavailable


class FakeBackend(Backend):
    name = "fake"

    def __init__(self, *jobs: JobInfo) -> None:
        self.jobs = {job.job_id: job for job in jobs}
        self.down = False
        self.calls: Counter[str] = Counter()
        self.started = self.closed = 0

    async def start(self) -> None:
        self.started += 1

    async def close(self) -> None:
        self.closed += 1

    async def get_job(self, job_id: int) -> JobInfo | None:
        self.calls["get_job"] += 1
        if self.down:
            raise SlurmUnavailable("controller down (fake)")
        return self.jobs.get(job_id)

    async def running_jobs(self) -> list[JobInfo]:
        self.calls["running_jobs"] += 1
        if self.down:
            raise SlurmUnavailable("controller down (fake)")
        return [job for job in self.jobs.values() if job.state == "RUNNING"]
