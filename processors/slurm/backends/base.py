"""The one interface every job-metadata backend implements, and the errors it may raise.

A backend answers two questions: "what is job J?" (:meth:`Backend.get_job`) and "which jobs
run now, and on which GPUs?" (:meth:`Backend.running_jobs`). Answers are
:class:`~gputally.processors.slurm.model.JobInfo` values, whatever the source spoke (text
from ``scontrol``, JSON from ``squeue`` or slurmrestd, pyslurm objects). Failures raise
:class:`~gputally.processors.slurm.errors.SlurmError`; an unknown job is ``None``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable

from gputally.processors.slurm.errors import SlurmError, SlurmUnavailable
from gputally.processors.slurm.model import JobInfo

__all__ = ["Backend", "SlurmError", "SlurmUnavailable", "first"]


class Backend(abc.ABC):
    """Where job metadata comes from. Methods run on the event loop; blocking work goes to threads."""

    name: str = "backend"
    """Short name for logs, metrics and ``/readyz`` (``cli``, ``slurmrestd``, ``pyslurm``)."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open what the backend needs (HTTP session). Must not wait on Slurm."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`start` opened. Idempotent."""

    @abc.abstractmethod
    async def get_job(self, job_id: int) -> JobInfo | None:
        """Job ``job_id`` (running or recently finished), ``None`` if Slurm does not know it."""

    @abc.abstractmethod
    async def running_jobs(self) -> list[JobInfo]:
        """Every running job, with its GPU allocation per node (one call for the whole cluster)."""

    async def jobs_on_node(self, node: str) -> list[JobInfo]:
        """Running jobs with an allocation on ``node``."""
        return [job for job in await self.running_jobs() if node in job.node_names()]


def first(jobs: Iterable[JobInfo], job_id: int) -> JobInfo | None:
    """The job with ID ``job_id`` among ``jobs`` (Slurm answers an array's ID with all its tasks)."""
    return next((job for job in jobs if job.job_id == job_id), None)
