"""The kubelet's side of PodResources, for the tests: a real gRPC server on a unix socket.

No kubelet runs on these machines, so this stand-in answers ``v1.PodResourcesLister/List``
with what a test allocated, on a real socket, to the real clients (the ``k8s`` processor in
node mode, the probes). Used by tests/k8s, tests/probes* and tests/otelcol.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from gputally.proto.podresources.v1 import api_pb2, api_pb2_grpc

__all__ = ["Kubelet", "debug_gpus_beside", "kubelet_socket", "serve"]


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """Answers List with whatever the test set; ``failure`` makes it refuse with that code."""

    def __init__(self) -> None:
        self.response = api_pb2.ListPodResourcesResponse()
        self.calls = 0
        self.failure: grpc.StatusCode | None = None

    async def List(  # noqa: N802 - the gRPC method's name
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.failure is not None:
            await context.abort(self.failure, "refused by the test")
        return self.response

    def _container(self, namespace: str, pod: str, container: str) -> api_pb2.ContainerResources:
        entry = next((p for p in self.response.pod_resources if (p.namespace, p.name) == (namespace, pod)), None)
        if entry is None:
            entry = self.response.pod_resources.add(name=pod, namespace=namespace)
        return next((c for c in entry.containers if c.name == container), None) or entry.containers.add(name=container)

    def allocate(self, namespace: str, pod: str, container: str, resource: str, *device_ids: str) -> None:
        """A device plugin's allocation: ``device_ids`` of ``resource`` to one container."""
        self._container(namespace, pod, container).devices.add(resource_name=resource, device_ids=list(device_ids))

    def claim(self, namespace: str, pod: str, container: str, driver: str, device: str, *cdi: str) -> None:
        """A DRA claim's device (``driver``'s ``device``, with CDI names) prepared for one container."""
        dynamic = self._container(namespace, pod, container).dynamic_resources.add(
            claim_name=f"{pod}-gpu", claim_namespace=namespace)
        dynamic.claim_resources.add(driver_name=driver, pool_name="node", device_name=device,
                                    cdi_devices=[api_pb2.CDIDevice(name=name) for name in cdi])


async def serve(socket: Path, kubelet: Kubelet) -> grpc.aio.Server:
    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


@contextlib.asynccontextmanager
async def kubelet_socket(directory: Path, kubelet: Kubelet) -> AsyncIterator[Path]:
    """``kubelet`` serving on ``<directory>/pod-resources/kubelet.sock`` (the kubelet's layout) while in use."""
    socket = directory / "pod-resources" / "kubelet.sock"
    socket.parent.mkdir(parents=True, exist_ok=True)
    server = await serve(socket, kubelet)
    try:
        yield socket
    finally:
        await server.stop(None)


async def debug_gpus_beside(kubelet: Kubelet, directory: Path, *probe: str) -> list[str]:
    """``gputally probe <probe...> --once --debug`` with ``kubelet`` serving on the node: the
    debug dump's GPU blocks, in order. Fails the test when the probe does not exit 0."""
    async with kubelet_socket(directory, kubelet) as socket:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gputally.cli", "probe", *probe, "--once", "--debug",
            "--pod-resources", str(socket), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()
    return stdout.decode().split("\nGPU ")[1:]
