"""Config of the ``usage`` processor: who an owner is, how time is integrated, what a GPU-hour costs.

Every key is optional: ``usage:`` alone accounts Slurm jobs and Kubernetes pods with the
defaults below and prices nothing (cost 0) until ``prices`` says otherwise.
"""

from __future__ import annotations

import fnmatch

from pydantic import Field, field_validator, model_validator

from gputally.storage import StorageRef
from gputally.config.types import Duration, Strict

__all__ = ["DEFAULT_OWNERS", "OwnerRule", "PriceRule", "SummaryConfig", "UsageConfig"]


class OwnerRule(Strict):
    """One way of naming a workload from the attributes the attribution processors wrote."""

    kind: str = Field(min_length=1)
    """What the owner is (``slurm.job``, ``k8s.pod``, ...): ``gputally.usage.owner.kind`` on its counters."""
    key: list[str] = Field(min_length=1)
    """Attributes that together identify the owner; all must be present. Their values joined
    with ``/`` are ``gputally.usage.owner.id``."""
    fallback_key: list[str] = Field(default_factory=list)
    """Attributes that name the owner when a ``key`` attribute is missing (a pod whose uid
    nobody on the node knew: by namespace and name). Its counters then are another owner's
    than the ones keyed by ``key``; empty: no fallback."""
    list_key: str | None = None
    """An array attribute on a GPU whose every element names one owner: the ``list_fields``
    values joined with ``/`` (``gputally.k8s.pod.uids`` = ``[namespace/pod/uid, ...]`` on a
    shared GPU). The owner is named by the ``key`` values among them, else by ``fallback_key``."""
    list_fields: list[str] = Field(default_factory=list)
    """The attributes each ``list_key`` element holds, in order (split on the first ``len - 1``
    slashes); they are carried onto the owner's counters. Default: ``key``."""
    carry: list[str] = Field(default_factory=list)
    """Attributes copied onto the owner's counters when present (glob patterns allowed:
    ``k8s.pod.label.*``), so queries can group by them."""

    @model_validator(mode="after")
    def _fields(self) -> OwnerRule:
        if self.list_fields and self.list_key is None:
            raise ValueError("list_fields needs list_key")
        fields = self.list_fields or self.key
        named = set(self.key) <= set(fields) or bool(self.fallback_key and set(self.fallback_key) <= set(fields))
        if self.list_key is not None and not named:
            raise ValueError("list_fields must hold the key (or the fallback_key) attributes")
        return self

    @field_validator("carry")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not pattern or pattern != pattern.strip():
                raise ValueError(f"{pattern!r} is not an attribute key or pattern")
            fnmatch.translate(pattern)
        return patterns


DEFAULT_OWNERS: tuple[OwnerRule, ...] = (
    OwnerRule(
        kind="slurm.job",
        key=["slurm.job.id"],
        carry=[
            "slurm.cluster.name", "slurm.job.name", "slurm.job.user", "slurm.job.account", "slurm.job.partition",
            "slurm.job.qos", "slurm.job.array.id", "slurm.job.array.task_id",
        ],
    ),
    OwnerRule(
        kind="k8s.pod",
        key=["k8s.pod.uid"],
        fallback_key=["k8s.namespace.name", "k8s.pod.name"],
        list_key="gputally.k8s.pod.uids",
        list_fields=["k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid"],
        carry=[
            "k8s.namespace.name", "k8s.pod.name", "k8s.node.name", "gputally.k8s.owner.kind", "gputally.k8s.owner.name",
            "k8s.deployment.name", "k8s.statefulset.name", "k8s.job.name", "k8s.cronjob.name",
            "k8s.daemonset.name", "k8s.pod.label.*",
        ],
    ),
)
"""A Slurm job first (a job's process in a pod is the job's), else a Kubernetes pod, keyed by its
uid (which the node knows: the cgroup, the container runtime), its names carried."""


class PriceRule(Strict):
    """The price of one GPU-hour of a model (``hw.model``, glob pattern, case-insensitive)."""

    model: str = Field(min_length=1)
    """``NVIDIA H100*``, ``*MI300X*``, ``1g.18gb`` (a MIG profile is its own model)."""
    per_gpu_hour: float = Field(ge=0)


class SummaryConfig(Strict):
    """``summary``: the thresholds behind the notes of an owner's end-of-allocation summary."""

    low_utilization: float = Field(0.15, ge=0, le=1)
    """Note "mean utilization 9 % on 2 GPUs" when the owner's mean utilization is below this."""
    unused_below: float = Field(0.01, ge=0, le=1)
    """A GPU whose busy share of its allocated time is below this counts as unused ("used 1 of 4 allocated GPUs")."""
    low_memory: float = Field(0.25, ge=0, le=1)
    """Note "peak memory 9 GiB of 141 GiB" when the peak is below this share of the GPU's memory."""


class UsageConfig(Strict):
    """``processors: usage:``."""

    owners: list[OwnerRule] = Field(default_factory=lambda: list(DEFAULT_OWNERS))
    """How owners are named, first matching rule wins. A GPU that matches none belongs to
    ``unallocated``; a process that matches none to ``unattributed``."""
    idle_below: float = Field(0.05, ge=0, le=1)
    """An owner whose utilization of a GPU is below this (0-1) is idle on it."""
    idle_after: Duration = Field(1800.0, gt=0)
    """An idle spell this long raises one WARN event (once per spell)."""
    end_after: Duration = Field(300.0, gt=0)
    """An owner not seen on any GPU for this long (sample time) has ended: its summary event
    is sent and its counters stop."""
    max_gap: Duration = Field(120.0, gt=0)
    """Two samples of one GPU further apart than this are not integrated: the time between
    them is counted as unobserved."""
    settle: Duration = Field(1.0, ge=0)
    """How long a sample waits for the rest of its cycle (a GPU's processes sent in another
    request) and for reordered requests, before it is integrated in time order. A sample
    older than the last one integrated for its GPU arrives too late and is ignored."""
    emit_interval: Duration = Field(60.0, gt=0)
    """How often the counters are sent down the pipeline (and saved, with ``storage``)."""
    prices: list[PriceRule] = Field(default_factory=list)
    """GPU-hour prices by model, first match wins."""
    default_price_per_gpu_hour: float = Field(0.0, ge=0)
    """The price of a GPU-hour for models no rule matches."""
    energy_price_per_kwh: float = Field(0.0, ge=0)
    """Added to the cost per kWh the owner's share of the GPU used."""
    currency: str = Field("USD", min_length=1)
    """Written as ``gputally.usage.currency`` on every cost counter."""
    storage: StorageRef | None = None
    """A ``file_storage`` extension in whose directory the counters are kept across restarts
    (``usage-<processor id>.json``; they continue with their original start time). Without it
    a restart starts them anew, with a new start time."""
    instance_id: str | None = Field(None, min_length=1)
    """Written as ``service.instance.id`` (with ``service.name`` ``gputally``) on every counter,
    so the counters of several replicas (scale-out) are separate series that add up. Default:
    the host name (the pod's name in Kubernetes). With ``storage``, the name saved with the
    counters is kept, so restored counters stay one series."""
    max_owners: int = Field(100_000, ge=1)
    """Most owners held; beyond it the longest-unseen owner is dropped (counted in
    ``gputally_usage_owners_evicted_total``)."""
    layout_cache_mib: int = Field(32, ge=0)
    """MiB of request layouts kept to read a node's requests without parsing them (about twice
    a request's size per node shape: 32 MiB holds about 600 eight-GPU nodes). Requests past it
    are read the general way, at about three times the CPU; 0 reads every request that way."""
    summary: SummaryConfig = SummaryConfig()

    @property
    def flush_interval(self) -> float:
        """How often queued samples are integrated: every ``settle`` (every second when samples
        count at once, ``settle: 0``), at least every ``emit_interval``, at most 5 times a second."""
        return max(0.2, min(self.emit_interval, self.settle or 1.0))

    @model_validator(mode="after")
    def _distinct_kinds(self) -> UsageConfig:
        kinds = [rule.kind for rule in self.owners]
        reserved = {"unallocated", "unattributed"} & set(kinds)
        if reserved:
            raise ValueError(f"owner kind {sorted(reserved)[0]!r} is reserved")
        if len(set(kinds)) != len(kinds):
            raise ValueError("owner kinds must be distinct")
        return self
