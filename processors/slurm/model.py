"""What a Slurm job is, as every backend reports it and the cache and processor use it.

Its own module so that the backends (which make :class:`JobInfo`) and the job cache (which
holds them and calls the backends) depend on it, not on each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hostlist import expand_hostlist

__all__ = ["JobInfo"]


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One Slurm job as the backends report it; ``None`` where the source said nothing."""

    job_id: int
    """The job's own ID; for an array task the task's job ID (which its cgroup names)."""
    name: str | None = None
    user: str | None = None
    uid: int | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    array_job_id: int | None = None
    """The array's ID, for array tasks only."""
    array_task_id: int | None = None
    nodes: str | None = None
    """Allocated nodes as a Slurm hostlist (``gpu[01-02]``)."""
    cluster: str | None = None
    state: str | None = None
    gpus: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """GRES GPU indexes allocated on each node: ``(("gpu01", (0, 1)),)``."""

    def gpu_indexes(self, node: str) -> tuple[int, ...]:
        return next((indexes for name, indexes in self.gpus if name == node), ())

    def node_names(self) -> list[str]:
        try:
            return expand_hostlist(self.nodes) if self.nodes else []
        except ValueError:
            return []
