"""The ``slurm.*`` resource attributes, built once per (job, step, source) as a serialized blob.

No semantic convention covers Slurm, so gputally keeps one namespace of its own:

| key | type | from |
|---|---|---|
| ``slurm.job.id`` | int | cgroup, environment, or GRES allocation |
| ``slurm.job.step`` | string | cgroup or environment (``0``, ``batch``, ``extern``, ``interactive``); processes only |
| ``slurm.job.name`` | string | backend |
| ``slurm.job.user`` | string | backend |
| ``slurm.job.uid`` | int | backend, else the cgroup v1 path (``uid_<U>``) |
| ``slurm.job.account`` | string | backend |
| ``slurm.job.partition`` | string | backend |
| ``slurm.job.qos`` | string | backend (needs accounting) |
| ``slurm.job.array.id`` | int | backend; array tasks only |
| ``slurm.job.array.task_id`` | int | backend; array tasks only |
| ``slurm.job.nodes`` | string | backend, as a Slurm hostlist |
| ``slurm.cluster.name`` | string | config ``cluster_name``, else backend |
| ``slurm.job.source`` | string | how the job was found: ``cgroup``, ``environ`` or ``gres`` |

Adding a blob to a resource is one ``MergeFromString`` (appending to the repeated
``attributes`` field), the cheapest way protobuf offers.
"""

from __future__ import annotations

from collections.abc import Collection

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from .local import Found
from .model import JobInfo

__all__ = ["ATTRIBUTES", "JOB_ID", "SOURCE", "resource_blob"]

JOB_ID = "slurm.job.id"
STEP = "slurm.job.step"
NAME = "slurm.job.name"
USER = "slurm.job.user"
UID = "slurm.job.uid"
ACCOUNT = "slurm.job.account"
PARTITION = "slurm.job.partition"
QOS = "slurm.job.qos"
ARRAY_ID = "slurm.job.array.id"
ARRAY_TASK_ID = "slurm.job.array.task_id"
NODES = "slurm.job.nodes"
CLUSTER = "slurm.cluster.name"
SOURCE = "slurm.job.source"
ATTRIBUTES = (JOB_ID, STEP, NAME, USER, UID, ACCOUNT, PARTITION, QOS, ARRAY_ID, ARRAY_TASK_ID, NODES, CLUSTER, SOURCE)
"""Every key this processor may set."""


def resource_blob(
    found: Found, job: JobInfo | None, *, cluster: str | None, skip: Collection[str] = ()
) -> bytes:
    """The encoded ``Resource.attributes`` entries for ``found`` (and ``job`` once known).

    ``skip``: keys the resource already has; they are left alone (OTLP forbids duplicates).
    """
    values: list[tuple[str, str | int | None]] = [(JOB_ID, found.job_id), (STEP, found.step)]
    if job is not None:
        values += [
            (NAME, job.name),
            (USER, job.user),
            (UID, job.uid if job.uid is not None else found.uid),
            (ACCOUNT, job.account),
            (PARTITION, job.partition),
            (QOS, job.qos),
            (ARRAY_ID, job.array_job_id),
            (ARRAY_TASK_ID, job.array_task_id),
            (NODES, job.nodes),
        ]
    else:
        values.append((UID, found.uid))
    values += [(CLUSTER, cluster or (job.cluster if job else None)), (SOURCE, found.source)]
    attributes = [
        KeyValue(key=key, value=AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value))
        for key, value in values
        if value is not None and key not in skip
    ]
    blob: bytes = Resource(attributes=attributes).SerializeToString()
    return blob
