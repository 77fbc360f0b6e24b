"""Config of the ``memory_limiter`` processor; keys as the Collector's memory limiter."""

from __future__ import annotations

from pydantic import Field, model_validator

from gputally.config.types import Duration, Strict

__all__ = ["MemoryLimiterConfig"]


class MemoryLimiterConfig(Strict):
    """``processors: memory_limiter:``. Set exactly one of ``limit_mib`` and ``limit_percentage``.

    Data is refused while the process's resident memory is above the soft limit
    (limit minus spike); above the hard limit a garbage collection is also forced.
    """

    check_interval: Duration = Field(1.0, gt=0)
    """How often memory is measured (``1s``). Refusals tell senders to retry after this long."""
    limit_mib: int | None = Field(None, gt=0)
    """Hard limit on resident memory, in MiB."""
    spike_limit_mib: int | None = Field(None, ge=0)
    """Headroom for growth between checks, in MiB; the soft limit is ``limit_mib`` minus this.
    Default: 20% of ``limit_mib``."""
    limit_percentage: int | None = Field(None, gt=0, le=100)
    """Hard limit as a percentage of total memory: the cgroup limit when one is set
    (cgroup v2 ``memory.max``, v1 ``memory/memory.limit_in_bytes``), else physical memory."""
    spike_limit_percentage: int | None = Field(None, ge=0, le=100)
    """Headroom as a percentage of total memory. Default: 20% of ``limit_percentage``."""

    @model_validator(mode="after")
    def _one_limit(self) -> MemoryLimiterConfig:
        problems = []
        if (self.limit_mib is None) == (self.limit_percentage is None):
            problems.append("set exactly one of limit_mib and limit_percentage")
        if self.spike_limit_mib is not None:
            if self.limit_mib is None:
                problems.append("spike_limit_mib goes with limit_mib")
            elif self.spike_limit_mib >= self.limit_mib:
                problems.append("spike_limit_mib must be less than limit_mib")
        if self.spike_limit_percentage is not None:
            if self.limit_percentage is None:
                problems.append("spike_limit_percentage goes with limit_percentage")
            elif self.spike_limit_percentage >= self.limit_percentage:
                problems.append("spike_limit_percentage must be less than limit_percentage")
        if problems:
            raise ValueError("; ".join(problems))
        return self
