"""Pod identity from the container runtime (CRI), on the node, without the API server.

A GPU process's cgroup names its pod's uid and its container id; PodResources names a GPU's
holders by namespace, pod and container. Only the API server joined the two, so while it was
unreachable (or had not yet shown a new pod) a pod's processes and its allocation could not
meet. The runtime that started the pod knows both: ``ListPodSandbox`` gives every sandbox's
uid, namespace and name, ``ListContainers`` every container's id, name and pod uid. Polled
like PodResources (:mod:`.podresources`): the last answer stays in use when a call fails, the
cause goes to :class:`~.health.Problems`, and the channel is rebuilt for the next call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gputally.proto.cri.v1 import api_pb2

from .polling import SocketPoller

__all__ = [
    "DEFAULT_CRI_SOCKETS",
    "LIST_CONTAINERS",
    "LIST_POD_SANDBOX",
    "CriClient",
    "PodDirectory",
    "PodIdentity",
    "find_socket",
]


LIST_POD_SANDBOX = "/runtime.v1.RuntimeService/ListPodSandbox"
LIST_CONTAINERS = "/runtime.v1.RuntimeService/ListContainers"
DEFAULT_CRI_SOCKETS = (
    Path("/run/containerd/containerd.sock"),
    Path("/var/run/crio/crio.sock"),
    Path("/run/crio/crio.sock"),
)
"""Where containerd and CRI-O serve the CRI, in the order they are looked for."""

# Labels the kubelet puts on every sandbox and container it creates (pkg/kubelet/types/labels.go).
POD_UID_LABEL = "io.kubernetes.pod.uid"
POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """A pod as the runtime knows it."""

    uid: str
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class PodDirectory:
    """One answer of the runtime: pods by uid and by name, containers by id."""

    pods: Mapping[str, PodIdentity] = field(default_factory=dict)
    """uid -> the pod."""
    by_name: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, name) -> uid of the pod that has that name now: the ready sandbox, else the newest."""
    containers: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """container id -> (pod uid, container name)."""

    def uid_of(self, namespace: str, name: str) -> str | None:
        return self.by_name.get((namespace, name))

    def pod(self, uid: str) -> PodIdentity | None:
        return self.pods.get(uid)

    def container_name(self, container_id: str | None) -> str | None:
        found = self.containers.get(container_id) if container_id else None
        return found[1] if found else None

    @classmethod
    def from_responses(cls, sandboxes: Iterable[Any], containers: Iterable[Any]) -> PodDirectory:
        """From ``ListPodSandboxResponse.items`` and ``ListContainersResponse.containers``."""
        pods: dict[str, PodIdentity] = {}
        chosen: dict[tuple[str, str], tuple[bool, int, str]] = {}
        sandbox_uid: dict[str, str] = {}
        for sandbox in sandboxes:
            meta = sandbox.metadata
            labels = sandbox.labels
            uid = meta.uid or labels.get(POD_UID_LABEL, "")
            namespace = meta.namespace or labels.get(POD_NAMESPACE_LABEL, "")
            name = meta.name or labels.get(POD_NAME_LABEL, "")
            if not (uid and namespace and name):
                continue
            pods[uid] = PodIdentity(uid, namespace, name)
            sandbox_uid[sandbox.id] = uid
            # A pod deleted and created again under its name (a StatefulSet's) leaves its old
            # sandbox for a while: the name belongs to the ready one, else to the newest.
            rank = (sandbox.state == api_pb2.SANDBOX_READY, sandbox.created_at, uid)
            if (namespace, name) not in chosen or rank > chosen[(namespace, name)]:
                chosen[(namespace, name)] = rank
        by_id: dict[str, tuple[str, str]] = {}
        for container in containers:
            labels = container.labels
            uid = labels.get(POD_UID_LABEL) or sandbox_uid.get(container.pod_sandbox_id, "")
            name = container.metadata.name or labels.get(CONTAINER_NAME_LABEL, "")
            if container.id and uid:
                by_id[container.id] = (uid, name)
                if uid not in pods:  # a container listed before its sandbox (a race between the calls)
                    namespace, pod = labels.get(POD_NAMESPACE_LABEL, ""), labels.get(POD_NAME_LABEL, "")
                    if namespace and pod:
                        pods[uid] = PodIdentity(uid, namespace, pod)
                        chosen.setdefault((namespace, pod), (False, 0, uid))
        return cls(pods, {key: rank[2] for key, rank in chosen.items()}, by_id)


def find_socket(candidates: Iterable[Path] = DEFAULT_CRI_SOCKETS) -> Path | None:
    """The first CRI socket that exists (containerd, then CRI-O), or None."""
    return next((path for path in candidates if path.exists()), None)


class CriClient(SocketPoller[PodDirectory]):
    """Polls ``ListPodSandbox`` and ``ListContainers``; keeps the newest :class:`PodDirectory`."""

    source = "cri"
    label = "CRI"

    @property
    def directory(self) -> PodDirectory | None:
        """The last successful answer; None until the first one."""
        return self.latest

    def _bind(self, channel: grpc.aio.Channel) -> Any:
        return (
            channel.unary_unary(
                LIST_POD_SANDBOX,
                request_serializer=api_pb2.ListPodSandboxRequest.SerializeToString,
                response_deserializer=api_pb2.ListPodSandboxResponse.FromString,
            ),
            channel.unary_unary(
                LIST_CONTAINERS,
                request_serializer=api_pb2.ListContainersRequest.SerializeToString,
                response_deserializer=api_pb2.ListContainersResponse.FromString,
            ),
        )

    async def _ask(self, calls: Any, timeout: float) -> PodDirectory:
        """One ``ListPodSandbox`` and one ``ListContainers``."""
        sandboxes_call, containers_call = calls
        sandboxes = await sandboxes_call(api_pb2.ListPodSandboxRequest(), timeout=timeout, wait_for_ready=False)
        containers = await containers_call(api_pb2.ListContainersRequest(), timeout=timeout, wait_for_ready=False)
        return PodDirectory.from_responses(sandboxes.items, containers.containers)

    def _describe(self, answer: PodDirectory) -> str:
        return f"cri: {len(answer.pods)} pods, {len(answer.containers)} containers from {self.socket}"

    def _keeping(self) -> str:
        return "pods named from the last list" if self.directory is not None else "pods not named from the node"
