"""What stands in for the cluster in the demo, built from the recording itself.

The recording holds what the node knew about each GPU process: its cgroup (a pod's uid,
QoS class and container id, or a Slurm job and step), its environment (``HOSTNAME``: a pod's
name; ``NVIDIA_VISIBLE_DEVICES``: the GPU the device plugin gave the pod; ``SLURM_JOB_ID``
and ``CUDA_VISIBLE_DEVICES``: the job and its GRES index) and its uid. From that the demo
answers, on real sockets and through the real protocols, what the node's services would:

* the kubelet's PodResources API (``v1.PodResourcesLister/List``, gRPC on a unix socket):
  each pod's container holds the GPU its ``NVIDIA_VISIBLE_DEVICES`` names (two pods on one
  GPU: time-slicing, device ids ``<uuid>::0``, ``<uuid>::1``);
* the container runtime's CRI (``runtime.v1.RuntimeService`` ``ListPodSandbox`` and
  ``ListContainers``, gRPC on a unix socket): each pod's uid, name and namespace, and its
  container;
* slurmrestd (``GET /slurm/v0.0.38/jobs`` and ``/job/<id>``, HTTP on loopback): each job
  running on the node with the GRES index its ``CUDA_VISIBLE_DEVICES`` names.

What the recording does not say is filled in plainly and said so in the README: the
namespace (``default``), the container's name (``worker``), a job's name (its command).
Every pod and job the recording shows holds its GPU for the whole replay: a pod whose
process stopped (the notebook) still holds its share, as a pod that stays does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from gputally.cgroup import parse_cgroup
from gputally.proto.cri.v1 import api_pb2 as cri_pb2
from gputally.proto.cri.v1 import api_pb2_grpc as cri_grpc
from gputally.proto.podresources.v1 import api_pb2 as pr_pb2
from gputally.proto.podresources.v1 import api_pb2_grpc as pr_grpc

__all__ = ["NAMESPACE", "Cluster", "Job", "Pod", "from_recording", "load", "serve_node", "slurmrestd_app"]

NAMESPACE = "default"
CONTAINER = "worker"
RESOURCE = "nvidia.com/gpu"
API_VERSION = "v0.0.38"


@dataclass(frozen=True)
class Pod:
    uid: str
    name: str
    container_id: str
    gpus: tuple[str, ...]
    """Device ids PodResources lists for its container."""


@dataclass(frozen=True)
class Job:
    job_id: int
    name: str
    uid: int
    gres: tuple[int, ...]


@dataclass(frozen=True)
class Cluster:
    node: str
    pods: tuple[Pod, ...]
    jobs: tuple[Job, ...]

    # -- the kubelet's PodResources ---------------------------------------------------------

    def pod_resources(self) -> pr_pb2.ListPodResourcesResponse:
        response = pr_pb2.ListPodResourcesResponse()
        for pod in self.pods:
            entry = response.pod_resources.add(name=pod.name, namespace=NAMESPACE)
            container = entry.containers.add(name=CONTAINER)
            if pod.gpus:
                container.devices.add(resource_name=RESOURCE, device_ids=list(pod.gpus))
        return response

    # -- the container runtime's CRI --------------------------------------------------------

    def sandboxes(self) -> list[cri_pb2.PodSandbox]:
        return [cri_pb2.PodSandbox(
            id=f"sandbox-{pod.uid}", metadata=cri_pb2.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=NAMESPACE),
            state=cri_pb2.SANDBOX_READY, created_at=1, labels=_pod_labels(pod)) for pod in self.pods]

    def containers(self) -> list[cri_pb2.Container]:
        return [cri_pb2.Container(
            id=pod.container_id, pod_sandbox_id=f"sandbox-{pod.uid}", metadata=cri_pb2.ContainerMetadata(name=CONTAINER),
            state=cri_pb2.CONTAINER_RUNNING, labels={**_pod_labels(pod), "io.kubernetes.container.name": CONTAINER})
            for pod in self.pods]

    # -- slurmrestd -------------------------------------------------------------------------

    def job_document(self, job: Job) -> dict[str, Any]:
        """One job as slurmrestd v0.0.38 (Slurm 22.05) writes it."""
        gres = ",".join(str(i) for i in job.gres)
        return {
            "job_id": job.job_id, "name": job.name, "user_id": job.uid, "user_name": "root" if job.uid == 0 else str(job.uid),
            "job_state": "RUNNING", "nodes": self.node, "array_job_id": 0,
            "job_resources": {"allocated_nodes": [{"nodename": self.node}]},
            "gres_detail": [f"gpu:{len(job.gres)}(IDX:{gres})"] if job.gres else [],
        }


def _pod_labels(pod: Pod) -> dict[str, str]:
    return {"io.kubernetes.pod.uid": pod.uid, "io.kubernetes.pod.name": pod.name,
            "io.kubernetes.pod.namespace": NAMESPACE}


def _int(value: Any) -> int | None:
    try:
        return int(str(value).split(",")[0])
    except ValueError:
        return None


def from_recording(data: Mapping[str, Any], *, node: str) -> Cluster:
    """The pods and jobs the recording's processes ran in, holding the GPUs their environment names."""
    device = data.get("device", {})
    uuid = str(device.get("uuid", ""))
    index = device.get("index", 0)
    pods: dict[str, dict[str, Any]] = {}
    jobs: dict[int, dict[str, Any]] = {}
    for snapshot in data.get("snapshots", []):
        for facts in snapshot.get("proc_facts", {}).values():
            cgroup = parse_cgroup(str(facts.get("cgroup", "")))
            env = facts.get("env_selected", {})
            uid = next((_int(line.split()[1]) for line in facts.get("status_uid", []) if line.startswith("Uid:")), 0)
            if cgroup.slurm_job_id is not None:
                visible = _int(env.get("CUDA_VISIBLE_DEVICES", ""))
                jobs.setdefault(int(cgroup.slurm_job_id), {
                    "name": Path(_script(str(facts.get("cmdline", "")))).name or "job",
                    "uid": uid or 0, "gres": () if visible is None else (visible,)})
            elif cgroup.pod_uid and cgroup.container_id:
                visible = _int(env.get("NVIDIA_VISIBLE_DEVICES", ""))
                pods.setdefault(cgroup.pod_uid, {
                    "name": str(env.get("HOSTNAME") or cgroup.pod_uid), "container_id": cgroup.container_id,
                    "holds": visible == index})
    shared = [uid for uid, pod in pods.items() if pod["holds"]]
    return Cluster(
        node=node,
        pods=tuple(Pod(uid, pod["name"], pod["container_id"],
                       (f"{uuid}::{shared.index(uid)}" if len(shared) > 1 else uuid,) if pod["holds"] else ())
                   for uid, pod in pods.items()),
        jobs=tuple(Job(job_id, job["name"], job["uid"], job["gres"]) for job_id, job in sorted(jobs.items())),
    )


def _script(cmdline: str) -> str:
    """The script a command line runs (``python3 worker.py ...``: ``worker.py``), else its program."""
    parts = cmdline.split()
    return next((p for p in parts[1:] if p.endswith(".py")), parts[0] if parts else "")


class _Kubelet(pr_grpc.PodResourcesListerServicer):
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def List(  # noqa: N802 - the gRPC method's name
        self, request: pr_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr_pb2.ListPodResourcesResponse:
        return self.cluster.pod_resources()


class _Runtime(cri_grpc.RuntimeServiceServicer):
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def ListPodSandbox(  # noqa: N802 - the gRPC method's name
        self, request: cri_pb2.ListPodSandboxRequest, context: grpc.aio.ServicerContext
    ) -> cri_pb2.ListPodSandboxResponse:
        return cri_pb2.ListPodSandboxResponse(items=self.cluster.sandboxes())

    async def ListContainers(  # noqa: N802 - the gRPC method's name
        self, request: cri_pb2.ListContainersRequest, context: grpc.aio.ServicerContext
    ) -> cri_pb2.ListContainersResponse:
        return cri_pb2.ListContainersResponse(containers=self.cluster.containers())


async def serve_node(cluster: Cluster, directory: Path) -> tuple[grpc.aio.Server, Path, Path]:
    """The kubelet's PodResources and the runtime's CRI on unix sockets under ``directory``
    (the kubelet's and containerd's layout): the server and the two socket paths."""
    kubelet = directory / "pod-resources" / "kubelet.sock"
    runtime = directory / "containerd" / "containerd.sock"
    for socket in (kubelet, runtime):
        socket.parent.mkdir(parents=True, exist_ok=True)
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(_Kubelet(cluster), server)
    cri_grpc.add_RuntimeServiceServicer_to_server(_Runtime(cluster), server)
    for socket in (kubelet, runtime):
        server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server, kubelet, runtime


def slurmrestd_app(cluster: Cluster) -> web.Application:
    """slurmrestd's two job calls, answering with the recording's jobs."""

    async def jobs(request: web.Request) -> web.Response:
        return web.json_response({"jobs": [cluster.job_document(job) for job in cluster.jobs], "errors": []})

    async def job(request: web.Request) -> web.Response:
        wanted = _int(request.match_info["job_id"])
        found = [cluster.job_document(j) for j in cluster.jobs if j.job_id == wanted]
        if not found:
            return web.json_response({"jobs": [], "errors": [{"error": "Invalid job id specified",
                                                               "error_number": 2017}]}, status=404)
        return web.json_response({"jobs": found, "errors": []})

    app = web.Application()
    app.router.add_get(f"/slurm/{API_VERSION}/jobs", jobs)
    app.router.add_get(f"/slurm/{API_VERSION}/job/{{job_id}}", job)
    return app


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a recording")
    return data
