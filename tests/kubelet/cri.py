"""A container runtime's CRI side, for the tests: a real gRPC server on a unix socket.

No container runtime (containerd, CRI-O) runs on these machines, so this stand-in answers
``runtime.v1.RuntimeService/ListPodSandbox`` and ``ListContainers`` with the pods and
containers a test started, on a real socket, to the real clients (``gputally.kubelet.cri``,
the probes' and the ``k8s`` processor's). It answers what containerd does for those calls:
the sandbox metadata and the kubelet's ``io.kubernetes.*`` labels.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from gputally.proto.cri.v1 import api_pb2, api_pb2_grpc

__all__ = ["Runtime", "runtime_socket"]


class Runtime(api_pb2_grpc.RuntimeServiceServicer):
    """Answers with what the test ran; ``failure`` makes both calls refuse with that code."""

    def __init__(self) -> None:
        self.sandboxes: list[api_pb2.PodSandbox] = []
        self.containers: list[api_pb2.Container] = []
        self.failure: grpc.StatusCode | None = None
        self.calls = 0

    def run_pod(self, namespace: str, name: str, uid: str, *, ready: bool = True, created_at: int = 1,
                containers: dict[str, str] | None = None) -> None:
        """A sandbox for the pod and ``containers`` (name -> container id) in it."""
        sandbox_id = f"sandbox-{uid}-{created_at}"
        labels = {"io.kubernetes.pod.uid": uid, "io.kubernetes.pod.name": name,
                  "io.kubernetes.pod.namespace": namespace}
        self.sandboxes.append(api_pb2.PodSandbox(
            id=sandbox_id, metadata=api_pb2.PodSandboxMetadata(name=name, uid=uid, namespace=namespace),
            state=api_pb2.SANDBOX_READY if ready else api_pb2.SANDBOX_NOTREADY, created_at=created_at, labels=labels))
        for container, cid in (containers or {}).items():
            self.containers.append(api_pb2.Container(
                id=cid, pod_sandbox_id=sandbox_id, metadata=api_pb2.ContainerMetadata(name=container),
                state=api_pb2.CONTAINER_RUNNING, labels={**labels, "io.kubernetes.container.name": container}))

    async def ListPodSandbox(  # noqa: N802 - the gRPC method's name
        self, request: api_pb2.ListPodSandboxRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodSandboxResponse:
        self.calls += 1
        if self.failure is not None:
            await context.abort(self.failure, "refused by the test")
        return api_pb2.ListPodSandboxResponse(items=self.sandboxes)

    async def ListContainers(  # noqa: N802 - the gRPC method's name
        self, request: api_pb2.ListContainersRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListContainersResponse:
        if self.failure is not None:
            await context.abort(self.failure, "refused by the test")
        return api_pb2.ListContainersResponse(containers=self.containers)


@contextlib.asynccontextmanager
async def runtime_socket(directory: Path, runtime: Runtime) -> AsyncIterator[Path]:
    """``runtime`` serving on ``<directory>/containerd/containerd.sock`` while in use."""
    socket = directory / "containerd" / "containerd.sock"
    socket.parent.mkdir(parents=True, exist_ok=True)
    server = grpc.aio.server()
    api_pb2_grpc.add_RuntimeServiceServicer_to_server(runtime, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield socket
    finally:
        await server.stop(None)
