"""Config of the ``k8s`` processor: where pod metadata and device allocations come from.

Two deployment shapes (``mode``):

* ``node``: gputally runs on the GPU node (DaemonSet or sidecar). It watches only the pods
  bound to its node, reads the kubelet's PodResources socket for device allocations, and may
  read ``/proc`` for processes the probe sent without a cgroup hint.
* ``gateway``: one gputally for the cluster. It watches every pod. Device allocations are
  node-local: the node probes read PodResources and send each GPU's holders as a hint
  (``gputally.k8s.podresources.holders``, see probes/core/allocations.py), which gateway mode
  turns into the same attribution node mode gives.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from gputally.config.types import Duration, Strict
from gputally.kubelet import DEFAULT_RESOURCE_NAMES, DEFAULT_SOCKET, find_socket

__all__ = [
    "CriConfig",
    "ExtractConfig",
    "K8sConfig",
    "PodResourcesConfig",
    "WatchConfig",
]



class PodResourcesConfig(Strict):
    """``pod_resources``: device allocations from the kubelet's PodResources API (v1 ``List``)."""

    enabled: bool | None = None
    """Read allocations at all. Default: on in ``node`` mode, off in ``gateway`` mode (the socket is
    node-local; there the probes' holders hints are used). Where this socket is read, it wins over
    a hint on the same resource."""
    socket: Path = DEFAULT_SOCKET
    """The kubelet's socket. Mount its directory, not the file, so a kubelet restart (which
    replaces the socket) is survived."""
    resource_names: list[str] = Field(default_factory=lambda: list(DEFAULT_RESOURCE_NAMES))
    """Resource names (glob patterns) whose devices are GPUs; also matched against DRA driver names."""
    refresh_interval: Duration = Field(10.0, gt=0)
    """How often ``List`` is called. An allocation is seen at most this long after the pod starts."""
    timeout: Duration = Field(5.0, gt=0)
    """Deadline of one ``List`` call."""

    @field_validator("resource_names")
    @classmethod
    def _patterns(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name or name != name.strip():
                raise ValueError(f"{name!r} is not a resource name or pattern")
            fnmatch.translate(name)
        return names


class CriConfig(Strict):
    """``cri``: pod identity from the container runtime on the node (``ListPodSandbox``,
    ``ListContainers``), so processes (cgroup: pod uid, container id) and allocations
    (PodResources: namespace, pod, container) are named alike while the API server is
    unreachable or has not shown a pod yet."""

    enabled: bool | None = None
    """Ask the runtime at all. Default: on in ``node`` mode when a socket is found, off in
    ``gateway`` mode (there the probes' ``gputally.k8s.podresources.uids`` hint is used)."""
    socket: Path | None = None
    """The runtime's CRI socket. Default: the first that exists of
    ``/run/containerd/containerd.sock``, ``/var/run/crio/crio.sock``, ``/run/crio/crio.sock``."""
    refresh_interval: Duration = Field(10.0, gt=0)
    """How often the runtime is asked."""
    timeout: Duration = Field(5.0, gt=0)
    """Deadline of one call."""


class ExtractConfig(Strict):
    """``extract``: which pod labels and annotations become resource attributes."""

    labels: list[str] = Field(default_factory=list)
    """Label keys (glob patterns) copied as ``k8s.pod.label.<key>``. Only these are kept in memory."""
    annotations: list[str] = Field(default_factory=list)
    """Annotation keys (glob patterns) copied as ``k8s.pod.annotation.<key>``."""


class WatchConfig(Strict):
    """``watch``: how the pod list+watch (a client-go style reflector) talks to the API server."""

    timeout: Duration = Field(300.0, gt=0)
    """Server-side timeout of one watch, randomised to between this and twice this; the watch
    then resumes from the last resourceVersion without a relist."""
    backoff_initial: Duration = Field(0.8, gt=0)
    """First wait after a failed list or watch; doubles on each failure."""
    backoff_max: Duration = Field(30.0, gt=0)
    """Longest wait between attempts. The wait resets after two quiet minutes."""
    page_size: int = Field(500, ge=1, le=10000)
    """Pods per page of the initial list (and of every relist), which bounds its memory."""
    request_timeout: Duration = Field(30.0, gt=0)
    """Deadline of one list page or one get (owners, nodes)."""


class K8sConfig(Strict):
    """``processors: k8s:``."""

    mode: Literal["node", "gateway"] = "node"
    """``node``: pods of one node, PodResources and /proc; ``gateway``: pods of the whole cluster."""
    node_name: str | None = None
    """This node's name (node mode). Default: the environment variable ``K8S_NODE_NAME``,
    set from the downward API (``spec.nodeName``); see :meth:`node_name_in`."""
    kubeconfig: Path | None = None
    """A kubeconfig file. Default: the in-cluster service account when running in a pod,
    else ``$KUBECONFIG`` or ``~/.kube/config``."""
    context: str | None = None
    """The kubeconfig context to use (default: its current context)."""
    proc_root: Path | None = None
    """Where the host's ``/proc`` is (``/host/proc``, or ``/proc`` with ``hostPID``). When set,
    a process sent without ``process.linux.cgroup`` has its cgroup read from here. Off by
    default: in a container without the host's pid namespace, a pid names another process."""
    pod_resources: PodResourcesConfig = PodResourcesConfig()
    cri: CriConfig = CriConfig()
    extract: ExtractConfig = ExtractConfig()
    owner_lookups: bool = True
    """Resolve ReplicaSet -> Deployment and Job -> CronJob with ``get`` (RBAC: get replicasets, jobs)."""
    node_labels: bool = True
    """Read node labels for ``cloud.region``, ``cloud.availability_zone``, ``host.type`` (RBAC: get nodes)."""
    node_refresh_interval: Duration = Field(600.0, gt=0)
    """How often known nodes' labels are read again."""
    deleted_pod_grace: Duration = Field(300.0, ge=0)
    """How long a deleted pod still attributes data that arrives late."""
    max_deleted_pods: int = Field(10000, ge=0)
    """Most deleted pods kept for their grace period; the oldest go first."""
    watch: WatchConfig = WatchConfig()

    def pod_resources_enabled(self) -> bool:
        enabled = self.pod_resources.enabled
        return self.mode == "node" if enabled is None else enabled

    def cri_socket(self) -> Path | None:
        """The CRI socket to read, or None (off, or no socket found where runtimes serve it)."""
        enabled = self.cri.enabled
        if enabled is False or (enabled is None and self.mode != "node"):
            return None
        if self.cri.socket is not None:
            return self.cri.socket
        return find_socket()

    def node_name_in(self, environ: Mapping[str, str]) -> str | None:
        """``node_name``, else ``K8S_NODE_NAME`` from ``environ``; ValueError in node mode
        without either (gateway mode needs none)."""
        name = self.node_name or environ.get("K8S_NODE_NAME") or None
        if self.mode == "node" and not name:
            raise ValueError("node mode needs this node's name: set node_name, or K8S_NODE_NAME "
                             "from the downward API (fieldRef spec.nodeName)")
        return name
