"""Jobs from Slurm's OpenAPI JSON, as ``squeue --json`` and slurmrestd write it.

Written against v0.0.38 (Slurm 22.05, tested); later versions wrap numbers as
``{"set": true, "number": N}``, make ``job_state`` a list and move node names into
``job_resources.nodes.allocation``, which is read tolerantly too (untested).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gputally.processors.slurm.gres import parse_gres_indexes
from gputally.processors.slurm.hostlist import expand_hostlist
from gputally.processors.slurm.model import JobInfo

__all__ = ["ACTIVE_STATES", "job_from_json", "jobs_from_json", "running"]

ACTIVE_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "RESIZING"})
"""Job states in which a job holds its nodes and GPUs."""


def _number(value: Any) -> int | None:
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _states(job: Mapping[str, Any]) -> set[str]:
    state = job.get("job_state")
    if isinstance(state, str):
        return {state}
    if isinstance(state, list):
        return {s for s in state if isinstance(s, str)}
    return set()


def _allocated_nodes(job: Mapping[str, Any]) -> list[str]:
    resources = job.get("job_resources")
    if isinstance(resources, Mapping):
        listed = resources.get("allocated_nodes")  # v0.0.38
        if isinstance(listed, list):
            names = [n.get("nodename") for n in listed if isinstance(n, Mapping)]
            if names and all(isinstance(n, str) for n in names):
                return names  # type: ignore[return-value]
        nodes = resources.get("nodes")  # v0.0.40+
        if isinstance(nodes, Mapping) and isinstance(nodes.get("allocation"), list):
            names = [n.get("name") for n in nodes["allocation"] if isinstance(n, Mapping)]
            if names and all(isinstance(n, str) for n in names):
                return names  # type: ignore[return-value]
    expression = _text(job.get("nodes"))
    try:
        return expand_hostlist(expression) if expression else []
    except ValueError:
        return []


def job_from_json(job: Mapping[str, Any]) -> JobInfo | None:
    """One job object; ``None`` when it has no job ID."""
    job_id = _number(job.get("job_id"))
    if job_id is None:
        return None
    array_job_id = _number(job.get("array_job_id")) or None  # 0: not an array task
    gpus: list[tuple[str, tuple[int, ...]]] = []
    details = job.get("gres_detail")
    if isinstance(details, list) and any(details):
        for node, detail in zip(_allocated_nodes(job), details, strict=False):
            indexes = parse_gres_indexes(detail) if isinstance(detail, str) else ()
            if indexes:
                gpus.append((node, indexes))
    states = _states(job)
    return JobInfo(
        job_id=job_id,
        name=_text(job.get("name")),
        user=_text(job.get("user_name")),
        uid=_number(job.get("user_id")),
        account=_text(job.get("account")),
        partition=_text(job.get("partition")),
        qos=_text(job.get("qos")),
        array_job_id=array_job_id,
        array_task_id=_number(job.get("array_task_id")) if array_job_id is not None else None,
        nodes=_text(job.get("nodes")),
        cluster=_text(job.get("cluster")),
        state=sorted(states)[0] if len(states) == 1 else ("+".join(sorted(states)) or None),
        gpus=tuple(gpus),
    )


def jobs_from_json(document: Any) -> list[JobInfo]:
    """Every job of a ``{"jobs": [...]}`` document."""
    if not isinstance(document, Mapping) or not isinstance(document.get("jobs"), list):
        raise ValueError("not a Slurm jobs document (no 'jobs' list)")
    return [info for info in (job_from_json(j) for j in document["jobs"] if isinstance(j, Mapping)) if info]


def running(jobs: Iterable[JobInfo]) -> list[JobInfo]:
    """The jobs that hold their allocation now."""
    return [job for job in jobs if job.state and ACTIVE_STATES & set(job.state.split("+"))]
