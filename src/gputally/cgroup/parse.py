"""What a process's cgroup says about who runs it: Kubernetes pod and container, or Slurm job.

One pure function, :func:`parse_cgroup`, reads the text of ``/proc/PID/cgroup`` and returns a
:class:`CgroupInfo`. It is shared by the Kubernetes and Slurm processors and by
``gputally explain-cgroup``. It only looks at text: it never touches the file system and never
runs a command.

Shapes understood (one line per hierarchy; v1 has many, v2 one ``0::`` line):

* Kubernetes, systemd driver: ``/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice/<runtime scope>``
  (guaranteed pods have no QoS level: ``kubepods-pod<uid>.slice``), also nested under a
  kubelet slice as kind does: ``/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-<qos>-pod<uid>.slice/...``.
* Kubernetes, cgroupfs driver: ``/kubepods/<qos>/pod<uid>/<container id>`` (guaranteed: ``/kubepods/pod<uid>/<id>``).
* Runtime scopes: containerd ``cri-containerd-<id>.scope`` or a bare ``<id>``; CRI-O
  ``crio-<id>.scope`` (and ``crio-conmon-<id>.scope``, the pod's monitor, not a container);
  Docker and cri-dockerd ``docker-<id>.scope``; a plain Docker container outside Kubernetes
  ``/system.slice/docker-<id>.scope`` or ``/docker/<id>``.
* Slurm, cgroup v1: ``/slurm[_<node>]/uid_<U>/job_<J>/step_<S>[/task_<T>]``;
  cgroup v2: ``/system.slice/slurmstepd.scope/job_<J>/step_<S>/...``. Steps are named as
  Slurm names them: ``0``, ``1``..., ``batch``, ``extern``, ``interactive``.
* Anything else: a systemd service (``system``), a user session (``user``), or ``unknown``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["MAX_TEXT", "CgroupInfo", "Kind", "parse_cgroup"]

Kind = Literal["kubernetes", "slurm", "container", "system", "user", "unknown"]

_HEX64 = r"[0-9a-f]{64}"
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_QOS = r"(?:-(?P<qos>burstable|besteffort|guaranteed))?"
# A pod's own cgroup: systemd (possibly kubelet-prefixed) or cgroupfs.
_POD_SYSTEMD = re.compile(rf"(?:kubelet-)?kubepods{_QOS}-pod(?P<uid>{_UID})\.slice")
_POD_CGROUPFS = re.compile(rf"pod(?P<uid>{_UID})")
_QOS_CGROUPFS = re.compile(r"(?P<qos>burstable|besteffort|guaranteed)")
_SCOPE = re.compile(rf"(?P<runtime>cri-containerd|crio-conmon|crio|docker|cri-o)-(?P<id>{_HEX64})\.scope")
_BARE_ID = re.compile(rf"(?P<id>{_HEX64})")
_SLURM_V1_ROOT = re.compile(r"slurm(?:_[^/]+)?")
# Numeric ids are Slurm's and the kernel's 32-bit unsigned integers: at most 10 digits and
# 4294967295, checked by _id(). Anything longer or larger is not an id, so it matches nothing.
_ID = r"\d{1,10}"
_SLURM_UID = re.compile(rf"uid_(?P<uid>{_ID})")
_SLURM_JOB = re.compile(rf"job_(?P<job>{_ID})")
_SLURM_STEP = re.compile(rf"step_(?P<step>{_ID}|batch|extern|interactive)")
_SLURM_TASK = re.compile(rf"task_(?P<task>{_ID}|special)")
_MAX_ID = 2**32 - 1
MAX_TEXT = 64 * 1024
"""Most of a ``/proc/PID/cgroup`` text that is read (a real one is under 2 KiB)."""
Runtime = Literal["containerd", "crio", "docker"]
_RUNTIMES: dict[str, Runtime] = {"cri-containerd": "containerd", "crio": "crio", "cri-o": "crio", "crio-conmon": "crio", "docker": "docker"}


@dataclass(frozen=True, slots=True)
class CgroupInfo:
    """What the cgroup path revealed; ``None`` where it said nothing."""

    kind: Kind = "unknown"
    runtime: Runtime | None = None
    container_id: str | None = None
    """The bare 64-hex container ID, without runtime prefix."""
    pod_uid: str | None = None
    """The pod UID as the API writes it (with dashes)."""
    qos_class: Literal["guaranteed", "burstable", "besteffort"] | None = None
    slurm_job_id: int | None = None
    slurm_step: str | None = None
    slurm_task: int | None = None
    slurm_uid: int | None = None
    path: str | None = None
    """The cgroup path the answer came from."""

    def explain(self) -> dict[str, object]:
        """The keys ``gputally explain-cgroup`` prints: always all of them, null where absent."""
        data = asdict(self)
        return {key: data[key] for key in (
            "runtime", "container_id", "pod_uid", "qos_class", "slurm_job_id", "slurm_step", "slurm_uid"
        )}


def parse_cgroup(text: str) -> CgroupInfo:
    """Parse the text of ``/proc/PID/cgroup`` (every line; the most telling one wins)."""
    best = CgroupInfo()
    for line in text[:MAX_TEXT].splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        found = _parse_path(parts[2].strip())
        if _rank(found) > _rank(best):
            best = found
    return best


def _rank(info: CgroupInfo) -> int:
    order = {"unknown": 0, "user": 1, "system": 1, "container": 2, "slurm": 3, "kubernetes": 3}
    detail = sum(v is not None for v in (info.container_id, info.pod_uid, info.slurm_step, info.slurm_uid))
    return order[info.kind] * 10 + detail


def _parse_path(path: str) -> CgroupInfo:
    components = [c for c in path.split("/") if c]
    return _kubernetes(components, path) or _slurm(components, path) or _other(components, path)


def _kubernetes(components: list[str], path: str) -> CgroupInfo | None:
    for index, component in enumerate(components):
        qos: str | None = None
        match = _POD_SYSTEMD.fullmatch(component)
        if match:
            qos = match.group("qos")
        else:
            match = _POD_CGROUPFS.fullmatch(component)
            if not match or not any(c.startswith(("kubepods", "kubelet-kubepods")) for c in components[:index]):
                continue
            parent = components[index - 1] if index else ""
            qos_match = _QOS_CGROUPFS.fullmatch(parent)
            qos = qos_match.group("qos") if qos_match else None
        runtime, container_id = _container(components[index + 1 : index + 2])
        return CgroupInfo(
            kind="kubernetes",
            runtime=runtime,
            container_id=container_id,
            pod_uid=match.group("uid").replace("_", "-"),
            qos_class=qos or "guaranteed",  # type: ignore[arg-type]
            path=path,
        )
    return None


def _container(components: list[str]) -> tuple[Runtime | None, str | None]:
    """Runtime and container ID from the component below a pod (or a plain container scope)."""
    if not components:
        return None, None
    component = components[0]
    scope = _SCOPE.fullmatch(component)
    if scope:
        runtime = _RUNTIMES[scope.group("runtime")]
        if scope.group("runtime") == "crio-conmon":
            return runtime, None  # the pod's monitor process, not a container
        return runtime, scope.group("id")
    if _BARE_ID.fullmatch(component):
        return None, component  # cgroupfs driver: the path does not name the runtime
    return None, None


def _id(match: re.Match[str] | None, group: str) -> int | None:
    """The 32-bit id in ``match``'s ``group``, or None (no match, or not an id: too large)."""
    if match is None or not match.group(group).isdigit():
        return None
    value = int(match.group(group))
    return value if value <= _MAX_ID else None


def _slurm(components: list[str], path: str) -> CgroupInfo | None:
    job_index = next((i for i, c in enumerate(components) if _id(_SLURM_JOB.fullmatch(c), "job") is not None), None)
    if job_index is None:
        return None
    above = components[:job_index]
    v1 = any(_SLURM_V1_ROOT.fullmatch(c) for c in above)
    v2 = "slurmstepd.scope" in above
    if not (v1 or v2):
        return None
    uid = next((n for c in above if (n := _id(_SLURM_UID.fullmatch(c), "uid")) is not None), None)
    below = components[job_index + 1 :]
    step = next((m for c in below if (m := _SLURM_STEP.fullmatch(c)) and _valid_step(m)), None)
    task = next((m for c in below if (m := _SLURM_TASK.fullmatch(c))), None)
    job = _id(_SLURM_JOB.fullmatch(components[job_index]), "job")
    assert job is not None
    return CgroupInfo(
        kind="slurm",
        slurm_job_id=job,
        slurm_step=step.group("step") if step else None,
        slurm_task=_id(task, "task"),
        slurm_uid=uid,
        path=path,
    )


def _valid_step(match: re.Match[str]) -> bool:
    step = match.group("step")
    return not step.isdigit() or int(step) <= _MAX_ID


def _other(components: list[str], path: str) -> CgroupInfo:
    for index, component in enumerate(components):
        scope = _SCOPE.fullmatch(component)
        if scope and scope.group("runtime") != "crio-conmon":
            return CgroupInfo(kind="container", runtime=_RUNTIMES[scope.group("runtime")],
                              container_id=scope.group("id"), path=path)
        if component == "docker" and index + 1 < len(components) and _BARE_ID.fullmatch(components[index + 1]):
            return CgroupInfo(kind="container", runtime="docker", container_id=components[index + 1], path=path)
    if components and components[0] == "user.slice":
        return CgroupInfo(kind="user", path=path)
    if components and components[0] == "system.slice":
        return CgroupInfo(kind="system", path=path)
    return CgroupInfo(path=path or None)
